package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"space/api"
	"space/internal/controlplane"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/worker"
	"space/internal/workertls"
)

// DefaultWorkerListen is where `space worker` serves its API unless told
// otherwise.
const DefaultWorkerListen = "127.0.0.1:7071"

// WorkerConfig configures a standalone worker process.
type WorkerConfig struct {
	// ID names the worker: unique among a control plane's workers. "" =
	// the one recorded in DataDir, or on the first start a new random one
	// (recorded there).
	ID string
	// DataDir holds the worker's sandboxes. Required.
	DataDir string
	// Listen is the worker API's address; "" = DefaultWorkerListen.
	Listen string
	// Advertise is the URL the control plane reaches the worker at; "" =
	// https://<the listening address>. The worker serves TLS with a
	// certificate the token vouches for (package workertls), so it is
	// an https URL.
	Advertise string
	// ControlPlane is the control plane's URL. Required.
	ControlPlane string
	// Token is the control plane's worker token (its data dir's
	// worker.token). Required.
	Token string
	// CacheBase and AgentPath are as in Config. Required (AgentPath
	// except with VMM "fake").
	CacheBase, AgentPath string
	// VMM, Firecracker and Host are as in Config.
	VMM         string
	Firecracker Firecracker
	Host        HostPaths
	// VCPUs and MemoryMiB are the capacity offered; 0 = the worker's
	// defaults.
	VCPUs     int
	MemoryMiB int64
	// Chunks is the chunk store; "" = DataDir/chunks. Give it the
	// server's (its directory on the same host, or its S3 bucket) to
	// share snapshots with it.
	Chunks ChunkStore
	// RemoveChunks has PurgeWorker remove Chunks' directory too (it is
	// the worker's own, not shared with a server). PurgeWorker refuses it
	// for an S3 store: it never deletes a bucket's objects.
	RemoveChunks bool
	// Egress is as in Config.
	Egress Egress
	// CrashAt names a worker crash point; for tests.
	CrashAt string
	// Progress, Log and Ready are as in Config.
	Progress io.Writer
	Log      *slog.Logger
	Ready    func(url string)
}

// RunWorker runs a standalone worker: it recovers its sandboxes, serves
// the worker API and registers with the control plane, renewing the
// registration as its heartbeat, until ctx ends. VMs keep running after it
// returns.
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	if cfg.DataDir == "" || cfg.ControlPlane == "" || cfg.Token == "" || cfg.CacheBase == "" || (cfg.AgentPath == "" && cfg.VMM != VMMFake) {
		return fmt.Errorf("worker: data dir, control plane, token, cache and agent path are required: %w", errkind.InvalidArgument)
	}
	if err := checkVMM(cfg.VMM); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultWorkerListen
	}
	if cfg.Advertise != "" && !strings.HasPrefix(cfg.Advertise, "https://") {
		return fmt.Errorf("worker: advertise %q: the worker serves TLS, so its URL is https://host:port: %w", cfg.Advertise, errkind.InvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	// First, so a wrong location, endpoint or credentials fail the start
	// before anything is made.
	chunks, err := openChunks(ctx, cfg.Chunks, cfg.DataDir, cfg.Log)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	unlock, err := lockDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	if cfg.ID, err = workerIdentity(cfg.DataDir, cfg.ID, legacyWorkerID(cfg.DataDir)); err != nil {
		return err
	}
	fmt.Fprintln(progress, "space: preparing the default template")
	img, err := templateImages(ctx, cfg.VMM, cfg.CacheBase, cfg.AgentPath, cfg.Log)
	if err != nil {
		return fmt.Errorf("default template: %w", err)
	}
	w, err := newWorker(ctx, workerConfig{
		VMM: cfg.VMM, Firecracker: cfg.Firecracker, Host: cfg.Host, Progress: progress,
		ID: cfg.ID, DataDir: filepath.Join(cfg.DataDir, "worker"), CacheBase: cfg.CacheBase, Images: img,
		VCPUs: cfg.VCPUs, MemoryMiB: cfg.MemoryMiB, CrashAt: cfg.CrashAt, Log: cfg.Log, Chunks: chunks, Egress: cfg.Egress,
	})
	if err != nil {
		return err
	}
	defer w.Close()
	tlsCfg, err := workertls.Server(cfg.Token)
	if err != nil {
		return fmt.Errorf("worker TLS: %v: %w", err, errkind.InvalidArgument)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ln = tls.NewListener(ln, tlsCfg)
	if cfg.Advertise == "" {
		cfg.Advertise = "https://" + ln.Addr().String()
	}
	fmt.Fprintf(progress, "space: worker %s serving on %s, registering with %s\n", cfg.ID, cfg.Advertise, cfg.ControlPlane)
	reg := &registrar{cfg: cfg, w: w, hc: &http.Client{Timeout: 30 * time.Second}}
	background := func(ctx context.Context) error {
		reg.run(ctx)
		return nil
	}
	if cfg.Ready != nil {
		cfg.Ready(cfg.Advertise)
	}
	return serve(ctx, ln, w.Handler(cfg.Token), background, cfg.Log)
}

// registrar registers the worker with the control plane and renews the
// registration every controlplane.HeartbeatInterval.
type registrar struct {
	cfg WorkerConfig
	w   *worker.Worker
	hc  *http.Client
}

func (r *registrar) run(ctx context.Context) {
	t := time.NewTicker(controlplane.HeartbeatInterval)
	defer t.Stop()
	registered := false
	for {
		err := r.register(ctx)
		switch {
		case err != nil && ctx.Err() == nil && errors.Is(err, errkind.FailedPrecondition):
			// The control plane speaks another worker protocol: it
			// takes none of this worker's sandboxes until one of the
			// two is upgraded.
			r.cfg.Log.Error("control plane refuses this worker", "control_plane", r.cfg.ControlPlane, "err", err)
			registered = false
		case err != nil && ctx.Err() == nil:
			r.cfg.Log.Warn("register with control plane", "err", err)
			registered = false
		case err == nil && !registered:
			r.cfg.Log.Info("registered with control plane", "control_plane", r.cfg.ControlPlane)
			registered = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *registrar) register(ctx context.Context) error {
	st, err := r.w.Status(ctx)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(api.RegisterWorker{
		ID: r.cfg.ID, Address: r.cfg.Advertise, VCPUs: st.VCPUs, MemoryMiB: st.MemoryMiB,
		Protocol: st.Protocol, Capabilities: st.Capabilities.API(),
	})
	url := strings.TrimSuffix(r.cfg.ControlPlane, "/") + "/v1/workers"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return httpapi.ResponseError(resp)
}
