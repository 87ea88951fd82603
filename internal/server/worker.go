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
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"space/api"
	"space/internal/controlplane"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/kube/workerlease"
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
	// MetricsListen is as in Config: where /metrics is served, off the
	// worker API's port; "" = not served.
	MetricsListen string
	// MetricsPerSandbox adds the worker's families labelled by sandbox
	// ID (worker.Config.MetricsPerSandbox); false = none.
	MetricsPerSandbox bool
	// Advertise is the URL the control plane reaches the worker at; "" =
	// https://<the listening address>. The worker serves TLS with a
	// certificate the token vouches for (package workertls), so it is
	// an https URL.
	Advertise string
	// ControlPlane is the control plane's URL. Required with
	// DiscoveryToken.
	ControlPlane string
	// Discovery is how the control plane finds the worker:
	// DiscoveryToken ("" = it: the worker registers with ControlPlane)
	// or DiscoveryKubernetes (it publishes a Lease in KubeNamespace
	// through the API server Kubeconfig names, "" = the pod's cluster's).
	Discovery string
	// KubeNamespace holds the worker's Lease with DiscoveryKubernetes;
	// "" = the pod's namespace.
	KubeNamespace string
	// Kubeconfig is the kubeconfig file of DiscoveryKubernetes; "" = the
	// cluster this process runs in.
	Kubeconfig string
	// Token is the control plane's worker token (its data dir's
	// worker.token): the worker API's TLS and data-plane tokens are
	// keyed by it. Required.
	Token string
	// CacheBase and AgentPath are as in Config. Required (AgentPath
	// except with VMM "fake").
	CacheBase, AgentPath string
	// GuestKernel is as in Config.
	GuestKernel string
	// VMM, Firecracker and Host are as in Config.
	VMM         string
	Firecracker Firecracker
	Host        HostPaths
	// VCPUs and MemoryMiB are the capacity offered; 0 = the worker's
	// defaults.
	VCPUs     int
	MemoryMiB int64
	// DiskReserveMiB is worker.Config.DiskReserveMiB: 0 = its default.
	DiskReserveMiB int64
	// StorageGiB is the size of the XFS image made for the worker's
	// storage where its data dir cannot reflink (storage.Config.LoopSize;
	// an image made before keeps its size): 0 = 64.
	StorageGiB int64
	// ReclaimIdleAfter is worker.Config.ReclaimIdleAfter: 0 = its
	// default, negative = never.
	ReclaimIdleAfter time.Duration
	// AgentHeartbeat and AgentTimeout are worker.Config's: 0 = their
	// defaults (5 s, 15 s).
	AgentHeartbeat, AgentTimeout time.Duration
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

	// kube, if set, is the API server of DiscoveryKubernetes instead of
	// Kubeconfig's (tests: a fake one).
	kube kubernetes.Interface
	// metricsReady is as in Config.
	metricsReady func(url string)
}

// RunWorker runs a standalone worker: it recovers its sandboxes, serves
// the worker API and registers with the control plane, renewing the
// registration as its heartbeat, until ctx ends. VMs keep running after it
// returns.
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	if cfg.DataDir == "" || cfg.Token == "" || cfg.CacheBase == "" || (cfg.AgentPath == "" && cfg.VMM != VMMFake) {
		return fmt.Errorf("worker: data dir, token, cache and agent path are required: %w", errkind.InvalidArgument)
	}
	leases, leaseNS, err := discoveryClient(cfg.Discovery, cfg.Kubeconfig, cfg.KubeNamespace, cfg.kube)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if leases == nil && cfg.ControlPlane == "" {
		return fmt.Errorf("worker: the control plane's URL is required to register with it (or discovery %s): %w", DiscoveryKubernetes, errkind.InvalidArgument)
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
	chunkName, err := cfg.Chunks.name(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	var unlock func()
	unlock, err = lockDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	if cfg.ID, err = workerIdentity(cfg.DataDir, cfg.ID, legacyWorkerID(cfg.DataDir)); err != nil {
		return err
	}
	instance, err := instanceIdentity(cfg.DataDir)
	if err != nil {
		return err
	}
	reg := newRegistry()
	fmt.Fprintln(progress, "space: preparing the default template")
	img, err := templateImages(ctx, cfg.VMM, cfg.CacheBase, cfg.AgentPath, cfg.GuestKernel, cfg.Log)
	if err != nil {
		return fmt.Errorf("default template: %w", err)
	}
	w, err := newWorker(ctx, workerConfig{
		VMM: cfg.VMM, Firecracker: cfg.Firecracker, Host: cfg.Host, Progress: progress,
		ID: cfg.ID, DataDir: filepath.Join(cfg.DataDir, "worker"), CacheBase: cfg.CacheBase, Images: img,
		VCPUs: cfg.VCPUs, MemoryMiB: cfg.MemoryMiB, DiskReserveMiB: cfg.DiskReserveMiB, StorageGiB: cfg.StorageGiB, ReclaimIdleAfter: cfg.ReclaimIdleAfter, CrashAt: cfg.CrashAt, Log: cfg.Log, Chunks: chunks, ChunkStore: chunkName, Egress: cfg.Egress,
		AgentHeartbeat: cfg.AgentHeartbeat, AgentTimeout: cfg.AgentTimeout,
		Fencing: true, Metrics: reg, MetricsPerSandbox: cfg.MetricsPerSandbox,
	})
	if err != nil {
		return err
	}
	defer w.Close()
	tlsCfg, err := workertls.Server(cfg.Token)
	if err != nil {
		return fmt.Errorf("worker TLS: %v: %w", err, errkind.InvalidArgument)
	}
	ml, err := listenMetrics(cfg.MetricsListen, reg, cfg.Log)
	if err != nil {
		return err
	}
	if ml != nil {
		defer ml.ln.Close()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ln = tls.NewListener(ln, tlsCfg)
	if cfg.Advertise == "" {
		cfg.Advertise = "https://" + ln.Addr().String()
	}
	state := func(ctx context.Context) (api.RegisterWorker, error) {
		st, err := w.Status(ctx)
		if err != nil {
			return api.RegisterWorker{}, err
		}
		return api.RegisterWorker{
			ID: cfg.ID, Address: cfg.Advertise, VCPUs: st.VCPUs, MemoryMiB: st.MemoryMiB,
			Protocol: st.Protocol, Capabilities: st.Capabilities.API(),
		}, nil
	}
	var background func(context.Context) error
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	if leases != nil {
		pub, err := workerlease.NewPublisher(workerlease.Config{
			Namespace: leaseNS, ID: cfg.ID, Instance: instance, State: state, Log: cfg.Log,
		}, leases)
		if err != nil {
			ln.Close()
			return fmt.Errorf("worker: %w", err)
		}
		// A second live process with this id is refused before serving.
		if err := pub.Publish(ctx); errors.Is(err, workerlease.ErrHeld) {
			ln.Close()
			return fmt.Errorf("worker: %w", err)
		} else if err != nil {
			cfg.Log.Warn("publish the worker lease; retrying", "err", err)
		}
		cfg.Log.Info("worker discovery", "mode", DiscoveryKubernetes, "namespace", leaseNS, "lease", workerlease.Name(cfg.ID), "holder", pub.Holder())
		fmt.Fprintf(progress, "space: worker %s serving on %s, published in Lease %s/%s\n", cfg.ID, cfg.Advertise, leaseNS, workerlease.Name(cfg.ID))
		background = func(bctx context.Context) error {
			err := pub.Run(bctx)
			if err != nil {
				stop(err) // another process took this worker's id: stop serving
			}
			return err
		}
	} else {
		cfg.Log.Info("worker discovery", "mode", DiscoveryToken, "control_plane", cfg.ControlPlane)
		fmt.Fprintf(progress, "space: worker %s serving on %s, registering with %s\n", cfg.ID, cfg.Advertise, cfg.ControlPlane)
		reg := &registrar{cfg: cfg, state: state, hc: &http.Client{Timeout: 30 * time.Second}}
		background = func(ctx context.Context) error {
			reg.run(ctx)
			return nil
		}
	}
	if ml != nil {
		fmt.Fprintf(progress, "space: serving metrics on %s\n", ml.url)
		if cfg.metricsReady != nil {
			cfg.metricsReady(ml.url)
		}
		run := background
		background = func(ctx context.Context) error {
			var wg sync.WaitGroup
			wg.Go(func() { ml.serve(ctx, cfg.Log) })
			err := run(ctx)
			wg.Wait()
			return err
		}
	}
	if cfg.Ready != nil {
		cfg.Ready(cfg.Advertise)
	}
	return serve(ctx, ln, w.Handler(cfg.Token), background, cfg.Log)
}

// registrar registers the worker with the control plane and renews the
// registration every controlplane.HeartbeatInterval.
type registrar struct {
	cfg   WorkerConfig
	state func(context.Context) (api.RegisterWorker, error) // what it registers
	hc    *http.Client
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
	reg, err := r.state(ctx)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(reg)
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
