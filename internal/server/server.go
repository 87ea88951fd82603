// Package server assembles SPACE's host processes: `space server` (the
// control plane with an embedded worker and the default template) and
// `space worker` (a standalone worker). It builds the components from a
// Config, serves HTTP until its context ends, and leaves the VMs running
// when it stops: a new process on the same data dir re-adopts them.
package server

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"

	"space/api"
	"space/internal/cachedir"
	"space/internal/cgroup"
	"space/internal/checkpoint"
	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkloc"
	"space/internal/controlplane"
	"space/internal/errkind"
	"space/internal/image/kernel"
	"space/internal/imagebuild"
	"space/internal/kube/workerlease"
	"space/internal/netns"
	"space/internal/secrets"
	"space/internal/storage"
	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/store/sqlite"
	"space/internal/templatebuild"
	"space/internal/vmm/fake"
	"space/internal/worker"
)

// DefaultListen is where `space server` listens unless told otherwise.
const DefaultListen = "127.0.0.1:7070"

// Files the server keeps in its data dir.
const (
	AdminKeyFile = "admin.key" // the first admin key's secret, 0600
	// WorkerTokenFile holds the token standalone workers present (and the
	// control plane presents to them), 0600.
	WorkerTokenFile = "worker.token"
	InfoFile        = "server.json" // ServerInfo: where clients find the API
	lockFile        = "server.lock" // held while a process uses the data dir
	dbFile          = "space.db"    // the SQLite store
)

// Info is what InfoFile holds.
type Info struct {
	URL string `json:"url"`
	PID int    `json:"pid"`
}

// Config configures a server process.
type Config struct {
	// DataDir holds the store, the worker's sandboxes and the admin key.
	// Required.
	DataDir string
	// Listen is the API's address; "" = DefaultListen.
	Listen string
	// MetricsListen is where /metrics is served (Prometheus text and
	// OpenMetrics; docs/operations.md), on a listener of its own, never
	// the API's: scrapers present no API key, and the API's port is
	// often public while this one belongs on a private address. "" = not
	// served.
	MetricsListen string
	// MetricsPerSandbox adds the embedded worker's families labelled by
	// sandbox ID (worker.Config.MetricsPerSandbox); false = none.
	MetricsPerSandbox bool
	// MetricsTeams is controlplane.Config.MetricsTeams: how many teams
	// space_team_sandboxes names; 0 = its default, negative = none.
	MetricsTeams int
	// CacheBase is the artifact cache's base directory (kernel, rootfs).
	// Required.
	CacheBase string
	// AgentPath is the static space-agent binary put in the initramfs.
	// Required, except with VMM "fake".
	AgentPath string
	// GuestKernel is a directory holding the guests' kernel as the
	// worker image ships it (kernel.FromDir); "" = the apt index's
	// current cloud kernel, fetched into the cache.
	GuestKernel string
	// VMM selects the embedded worker's hypervisor driver: VMMAuto (""
	// = it), VMMQEMU, VMMFirecracker, or VMMFake, whose guests are
	// jailed host processes: for tests and load tests only, never for
	// untrusted code.
	VMM string
	// Firecracker configures the Firecracker driver, when VMM chooses it.
	Firecracker Firecracker
	// Host places the embedded worker's VMs on the host.
	Host HostPaths
	// StoreURL selects PostgreSQL (postgres://...); "" = SQLite in DataDir.
	StoreURL string
	// WorkerID names the embedded worker; "" = the one recorded in
	// DataDir, or on the first start a new random one (recorded there).
	// A data dir from before IDs were recorded keeps "local".
	WorkerID string
	// WorkerListen is where the embedded worker serves the worker API
	// (TLS, the worker token) to the other replicas sharing a
	// PostgreSQL store, so that any of them serves its sandboxes; "" =
	// 127.0.0.1:0 on PostgreSQL (replicas on this host only), not served
	// on SQLite (one control plane).
	WorkerListen string
	// WorkerAdvertise is the URL the other replicas reach the embedded
	// worker at; "" = https://WORKER_LISTEN's address.
	WorkerAdvertise string
	// LeaderElection is where replicas elect the one that does the
	// background work: LeaderStore ("" = it) or LeaderKubernetes.
	LeaderElection string
	// KubeNamespace and KubeLease name the Lease of LeaderKubernetes; ""
	// = the pod's namespace and "space-leader". KubeNamespace is also
	// where DiscoveryKubernetes finds the workers' Leases.
	KubeNamespace, KubeLease string
	// Kubeconfig is the kubeconfig file of the API server the Kubernetes
	// adapters (LeaderKubernetes, DiscoveryKubernetes) use; "" = the
	// cluster this process runs in (its pod's service account).
	Kubeconfig string
	// WorkerDiscovery is how the control plane finds standalone workers:
	// DiscoveryToken ("" = it: workers register over HTTP with the worker
	// token) or DiscoveryKubernetes (also through the workers' Leases in
	// KubeNamespace).
	WorkerDiscovery string
	// RecoverAfter is how long a standalone worker may go without the
	// leader's lease before its sandboxes are restored on other workers
	// from their latest checkpoints (controlplane.Config.RecoverAfter);
	// 0 = 30s, negative = never.
	RecoverAfter time.Duration
	// EventRetention is how long sandboxes' lifecycle events are kept
	// (controlplane.Config.EventRetention): 0 = its default, negative =
	// for ever.
	EventRetention time.Duration
	// Webhooks configures the delivery of the teams' webhooks
	// (controlplane.WebhookConfig: whether they may reach private
	// addresses, how many failures disable one); the zero value is the
	// production setting.
	Webhooks controlplane.WebhookConfig
	// AuditRetention is how long audit log entries are kept
	// (controlplane.Config.AuditRetention); 0 = 365 days, negative =
	// for ever.
	AuditRetention time.Duration
	// NoWorker runs the control plane alone, with no embedded worker:
	// sandboxes run on standalone workers only (`space worker`). For
	// replicas of one control plane on PostgreSQL.
	NoWorker bool
	// WorkerToken is the token standalone workers present (and the
	// control plane presents to them), which also keys data-plane
	// tokens; "" = the one in DataDir/worker.token, made on the first
	// start. Replicas of one control plane share one.
	WorkerToken string
	// AdminKey is an admin API key's secret an operator provisioned for
	// every replica (controlplane.Server.BootstrapKey); "" = the first
	// start makes one and keeps it in DataDir/admin.key.
	AdminKey string
	// SecretsKeyFile is the key the teams' secrets are sealed with; "" =
	// DataDir/secrets.key, made on the first start. Replicas share one.
	SecretsKeyFile string
	// E2B, when set, serves the E2B-compatible API on its own listener
	// (docs/e2b.md).
	E2B *E2B
	// DataPlaneURL is where clients send the data-plane requests of
	// sandboxes on standalone workers (controlplane.Config.DataPlaneURL):
	// a `space proxy`; "" = this server.
	DataPlaneURL string
	// VCPUs and MemoryMiB are the embedded worker's capacity; 0 = its
	// default (see worker.Config).
	VCPUs     int
	MemoryMiB int64
	// DiskReserveMiB is worker.Config.DiskReserveMiB for the embedded
	// worker: 0 = its default.
	DiskReserveMiB int64
	// StorageGiB is WorkerConfig.StorageGiB for the embedded worker.
	StorageGiB int64
	// ReclaimIdleAfter is worker.Config.ReclaimIdleAfter for the embedded
	// worker: 0 = its default, negative = never.
	ReclaimIdleAfter time.Duration
	// AgentHeartbeat and AgentTimeout are worker.Config's for the
	// embedded worker: how often it asks each sandbox's agent for its
	// health, and how long an answer may take before the agent is
	// declared unresponsive; 0 = the defaults (5 s, 15 s).
	AgentHeartbeat, AgentTimeout time.Duration
	// CrashAt names a crash point of the worker or control plane; for
	// tests.
	CrashAt string
	// ReconcileInterval is controlplane.Config.ReconcileInterval.
	ReconcileInterval time.Duration
	// DefaultCheckpoints is the checkpoint policy of sandboxes created
	// without one (controlplane.Config.DefaultCheckpoints); nil = none.
	// Run checks it before anything is made.
	DefaultCheckpoints *api.CheckpointPolicy
	// DefaultTimeout is the timeout of sandboxes created without one;
	// 0 = controlplane.DefaultLimits'. DefaultOnTimeout is what it does
	// for those created without on_timeout: delete ("" too) or suspend
	// (controlplane.Config.DefaultOnTimeout).
	DefaultTimeout   time.Duration
	DefaultOnTimeout string
	// ChunkGCInterval is how often the chunk store's garbage collection
	// frees the chunks no snapshot uses; 0 = DefaultChunkGCInterval.
	ChunkGCInterval time.Duration
	// Chunks is the chunk store, where snapshots, template images and
	// base images are kept: "" = DataDir/chunks. Standalone workers that
	// share it (the same directory on this host, or one S3 bucket) can
	// restore each other's snapshots.
	Chunks ChunkStore
	// Prewarm captures the default template's warm snapshot for the
	// default sandbox shape in the background at start, so the first
	// sandbox is a restore too. Off by default: tests leave it off.
	Prewarm bool
	// Pool is how many sandboxes of the default shape the worker keeps
	// restored and ready once prewarmed, so a create takes one at once;
	// 0 = none.
	Pool int
	// Egress says how sandboxes' gateways reach the outside.
	Egress Egress
	// Version is reported by the health route.
	Version string
	// Progress receives human-readable progress lines; nil = discard.
	Progress io.Writer
	// Log receives structured events; nil = discard.
	Log *slog.Logger
	// Ready, if set, is called with the API's URL once it serves.
	Ready func(url string)

	// kube, if set, is the API server of DiscoveryKubernetes instead of
	// Kubeconfig's (tests: a fake one).
	kube kubernetes.Interface
	// metricsReady, if set, is called with the metrics' URL once they
	// are served (tests).
	metricsReady func(url string)
}

// Run starts the control plane and its embedded worker and serves until
// ctx ends. VMs keep running after it returns.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.DataDir == "" || cfg.CacheBase == "" || (cfg.AgentPath == "" && cfg.VMM != VMMFake) {
		return fmt.Errorf("server: data dir, cache and agent path are required: %w", errkind.InvalidArgument)
	}
	if err := checkVMM(cfg.VMM); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if cfg.DefaultCheckpoints != nil {
		if _, err := checkpoint.FromAPI("default checkpoint policy", *cfg.DefaultCheckpoints); err != nil {
			return fmt.Errorf("server: %w", err)
		}
	}
	if max := controlplane.DefaultLimits.MaxTTL; cfg.DefaultTimeout < 0 || cfg.DefaultTimeout > max {
		return fmt.Errorf("server: default timeout %v is outside 1s..%v: %w", cfg.DefaultTimeout, max, errkind.InvalidArgument)
	}
	if o := cfg.DefaultOnTimeout; o != "" && o != "delete" && o != "suspend" {
		return fmt.Errorf("server: default on_timeout %.64q is neither delete nor suspend: %w", o, errkind.InvalidArgument)
	}
	if cfg.ChunkGCInterval < 0 {
		return fmt.Errorf("server: chunk garbage collection interval %s is negative: %w", cfg.ChunkGCInterval, errkind.InvalidArgument)
	}
	if cfg.ChunkGCInterval == 0 {
		cfg.ChunkGCInterval = DefaultChunkGCInterval
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	reg := newRegistry()
	// First, so a wrong location, endpoint or credentials fail the start
	// before anything is made.
	chunks, err := openChunks(ctx, cfg.Chunks, cfg.DataDir, cfg.Log)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	chunkName, err := cfg.Chunks.name(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	unlock, err := lockDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	if cfg.WorkerID, err = workerIdentity(cfg.DataDir, cfg.WorkerID, "local"); err != nil {
		return err
	}
	replica, err := replicaIdentity(cfg.DataDir)
	if err != nil {
		return err
	}
	elector, err := electorFor(cfg, cfg.Log)
	if err != nil {
		return err
	}
	leases, leaseNS, err := discoveryClient(cfg.WorkerDiscovery, cfg.Kubeconfig, cfg.KubeNamespace, cfg.kube)
	if err != nil {
		return err
	}

	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()

	var w *worker.Worker // the embedded worker, or nil
	if !cfg.NoWorker {
		if cfg.VMM != VMMFake {
			fmt.Fprintln(progress, "space: preparing the default template (first start: fetches a kernel and bootstraps Debian, minutes)")
		}
		t0 := time.Now()
		img, err := templateImages(ctx, cfg.VMM, cfg.CacheBase, cfg.AgentPath, cfg.GuestKernel, cfg.Log)
		if err != nil {
			return fmt.Errorf("default template: %w", err)
		}
		if cfg.VMM != VMMFake {
			fmt.Fprintf(progress, "space: default template ready in %s\n", time.Since(t0).Round(time.Millisecond))
		}
		w, err = newWorker(ctx, workerConfig{
			VMM: cfg.VMM, Firecracker: cfg.Firecracker, Host: cfg.Host, Progress: progress,
			ID: cfg.WorkerID, DataDir: filepath.Join(cfg.DataDir, "worker"), CacheBase: cfg.CacheBase,
			Images: img, CrashAt: cfg.CrashAt, Log: cfg.Log, VCPUs: cfg.VCPUs, MemoryMiB: cfg.MemoryMiB, DiskReserveMiB: cfg.DiskReserveMiB, StorageGiB: cfg.StorageGiB, ReclaimIdleAfter: cfg.ReclaimIdleAfter,
			AgentHeartbeat: cfg.AgentHeartbeat, AgentTimeout: cfg.AgentTimeout,
			Chunks: chunks, ChunkStore: chunkName, Egress: cfg.Egress, Metrics: reg, MetricsPerSandbox: cfg.MetricsPerSandbox,
		})
		if err != nil {
			return err
		}
		defer w.Close() // detaches: the VMs keep running
	}

	token := cfg.WorkerToken
	if token == "" {
		if token, err = secretFile(filepath.Join(cfg.DataDir, WorkerTokenFile)); err != nil {
			return err
		}
	}
	cache, err := cachedir.Open(cfg.CacheBase)
	if err != nil {
		return err
	}
	// Build contexts left by a crash are of no use.
	buildDir := filepath.Join(cfg.DataDir, "builds")
	if err := os.RemoveAll(buildDir); err != nil {
		return err
	}
	// The teams' secrets are sealed under a key kept next to the store,
	// never in it.
	secretBox, err := secrets.LoadOrCreateKey(cmp.Or(cfg.SecretsKeyFile, filepath.Join(cfg.DataDir, "secrets.key")))
	if err != nil {
		return err
	}
	limits := controlplane.DefaultLimits
	if cfg.DefaultTimeout != 0 {
		limits.DefaultTTL = cfg.DefaultTimeout
	}
	cp, err := controlplane.New(controlplane.Config{
		Limits: limits, DefaultOnTimeout: cfg.DefaultOnTimeout,
		Elector: elector,
		Store:   st, Templates: []string{"default"}, CrashAt: cfg.CrashAt, Version: cfg.Version, Log: cfg.Log,
		WorkerToken: token, ReconcileInterval: cfg.ReconcileInterval, DataPlaneURL: cfg.DataPlaneURL,
		Images: &templatebuild.Images{Cache: cache, Chunks: chunks, Log: cfg.Log}, BuildDir: buildDir,
		Secrets: secretBox, ReplicaID: replica, DefaultCheckpoints: cfg.DefaultCheckpoints, RecoverAfter: cfg.RecoverAfter,
		EventRetention: cfg.EventRetention, AuditRetention: cfg.AuditRetention, Webhooks: cfg.Webhooks, Metrics: reg, MetricsTeams: cfg.MetricsTeams,
	})
	if err != nil {
		return err
	}
	var workerAPI *embeddedWorkerAPI // the embedded worker served to other replicas, or nil
	if w != nil {
		local, err := controlplane.NewLocal(w)
		if err != nil {
			return err
		}
		cp.AddWorker(local)
		if workerAPI, err = listenWorkerAPI(cfg, token); err != nil {
			return err
		}
		if workerAPI != nil {
			defer workerAPI.ln.Close()
		}
	}
	var watcher *workerlease.Watcher // the workers' Leases', or nil
	if leases != nil {
		if watcher, err = workerlease.NewWatcher(workerlease.WatcherConfig{Namespace: leaseNS, Log: cfg.Log}, leases, cp); err != nil {
			return err
		}
		cfg.Log.Info("worker discovery", "mode", DiscoveryKubernetes+"+"+DiscoveryToken, "namespace", leaseNS)
	} else {
		cfg.Log.Info("worker discovery", "mode", DiscoveryToken)
	}
	if err := cp.LoadWorkers(ctx); err != nil {
		return err
	}
	if err := cp.Reconcile(ctx); err != nil {
		cfg.Log.Error("reconcile", "err", err)
	}
	keyPath := filepath.Join(cfg.DataDir, AdminKeyFile)
	_, statErr := os.Stat(keyPath)
	var secret string
	if cfg.AdminKey != "" {
		err = cp.BootstrapKey(ctx, cfg.AdminKey)
	} else {
		secret, err = cp.Bootstrap(ctx, statErr == nil)
	}
	if err != nil {
		return err
	}
	if secret != "" {
		if err := writeFileAtomic(keyPath, []byte(secret+"\n"), 0o600); err != nil {
			return fmt.Errorf("write admin key: %w", err)
		}
		fmt.Fprintf(progress, "space: created the first admin key in %s\n", keyPath)
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
	url := "http://" + ln.Addr().String()
	info, _ := json.Marshal(Info{URL: url, PID: os.Getpid()})
	if err := writeFileAtomic(filepath.Join(cfg.DataDir, InfoFile), info, 0o600); err != nil {
		ln.Close()
		return err
	}
	fmt.Fprintf(progress, "space: serving the API on %s (data dir %s)\n", url, cfg.DataDir)
	var e2bWait func() error
	if cfg.E2B != nil {
		// The facade calls the API on its own listener, by loopback.
		var e2bURL string
		e2bURL, e2bWait, err = startE2B(ctx, *cfg.E2B, loopbackURL(ln.Addr()), token, cp, cfg.Log)
		if err != nil {
			ln.Close()
			return err
		}
		fmt.Fprintf(progress, "space: serving the E2B API on %s (domain %q)\n", e2bURL, cfg.E2B.Domain)
	}
	if ml != nil {
		fmt.Fprintf(progress, "space: serving metrics on %s\n", ml.url)
		if cfg.metricsReady != nil {
			cfg.metricsReady(ml.url)
		}
	}
	if cfg.Ready != nil {
		cfg.Ready(url)
	}
	gcm, err := newChunkMetrics(reg)
	if err != nil {
		return err
	}
	background := func(ctx context.Context) error {
		var wg sync.WaitGroup
		if ml != nil {
			wg.Go(func() { ml.serve(ctx, cfg.Log) })
		}
		if cfg.Prewarm && w != nil {
			wg.Go(func() {
				l := controlplane.DefaultLimits
				spec := worker.Spec{Template: "default", VCPUs: l.DefaultVCPUs, MemoryMiB: l.DefaultMemoryMiB, DiskMiB: l.DefaultDiskMiB}
				if err := w.Warm(ctx, spec); err != nil {
					if ctx.Err() == nil {
						cfg.Log.Warn("prewarm the default template", "err", err)
					}
					return
				}
				if err := w.KeepPool(spec, cfg.Pool); err != nil {
					cfg.Log.Warn("pool of the default template", "err", err)
				}
			})
		}
		wg.Go(func() { collectChunks(ctx, chunks, cfg.ChunkGCInterval, gcm, cfg.Log) })
		if watcher != nil {
			wg.Go(func() { watcher.Run(ctx) })
		}
		if workerAPI != nil {
			wg.Go(func() { workerAPI.serve(ctx, w.Handler(token), cfg.Log) })
			wg.Go(func() {
				if err := cp.AdvertiseLocal(ctx, w.ID(), workerAPI.url); err != nil {
					cfg.Log.Error("advertise the embedded worker", "err", err)
				}
			})
		}
		if e2bWait != nil {
			wg.Go(func() {
				if err := e2bWait(); err != nil {
					cfg.Log.Error("the E2B API", "err", err)
				}
			})
		}
		err := cp.Run(ctx)
		wg.Wait()
		return err
	}
	return serve(ctx, ln, cp.Handler(), background, cfg.Log)
}

// loopbackURL is the URL this process reaches a listener of its own at:
// a wildcard address by loopback.
func loopbackURL(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return "http://" + a.String()
	}
	ip := ta.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port))
}

// serve runs the HTTP server and background until ctx ends.
func serve(ctx context.Context, ln net.Listener, h http.Handler, background func(context.Context) error, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// No read or write timeout: exec streams last as long as their
		// commands.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	bctx, cancel := context.WithCancel(ctx)
	bgDone := make(chan error, 1)
	go func() { bgDone <- background(bctx) }()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-srvDone:
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close() // streams still open: cut them; their commands go on
	}
	cancel()
	err = errors.Join(err, <-bgDone)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func openStore(ctx context.Context, cfg Config) (store.Store, error) {
	if strings.HasPrefix(cfg.StoreURL, "postgres://") || strings.HasPrefix(cfg.StoreURL, "postgresql://") {
		return postgres.Open(ctx, cfg.StoreURL)
	}
	if cfg.StoreURL != "" {
		return nil, fmt.Errorf("store url %q: want postgres://... or empty for SQLite: %w", cfg.StoreURL, errkind.InvalidArgument)
	}
	return sqlite.Open(ctx, filepath.Join(cfg.DataDir, dbFile))
}

// templateImages returns the default template's images for the driver
// kind: built (or cached) for a real VMM, placeholders for the fake, which
// boots no kernel and mounts no image.
func templateImages(ctx context.Context, kind, cacheBase, agent, kernelDir string, log *slog.Logger) (*imagebuild.Artifacts, error) {
	if kind == VMMFake {
		return &imagebuild.Artifacts{
			Kernel:    &kernel.Kernel{Version: "fake", Vmlinux: "/nonexistent/fake-vmm/vmlinux", Vmlinuz: "/nonexistent/fake-vmm/vmlinuz"},
			Initramfs: "/nonexistent/fake-vmm/initramfs",
			Rootfs:    "/nonexistent/fake-vmm/rootfs",
		}, nil
	}
	return buildImages(ctx, cacheBase, agent, kernelDir, log)
}

// buildImages builds the default template's images; kernelDir, when
// given, holds the guests' kernel (kernel.FromDir) instead of the apt
// index's current one.
func buildImages(ctx context.Context, cacheBase, agent, kernelDir string, log *slog.Logger) (*imagebuild.Artifacts, error) {
	cache, err := cachedir.Open(cacheBase)
	if err != nil {
		return nil, err
	}
	var k *kernel.Kernel
	if kernelDir != "" {
		if k, err = kernel.FromDir(kernelDir); err != nil {
			return nil, fmt.Errorf("--guest-kernel: %w", err)
		}
	}
	return imagebuild.Build(ctx, imagebuild.Config{Cache: cache, AgentPath: agent, Kernel: k, Log: log})
}

// Egress configures how sandboxes' gateways resolve names and connect.
type Egress struct {
	// Hosts pins names to addresses (as /etc/hosts would, for the
	// gateways only); other names go to the host's resolver.
	Hosts map[string][]netip.Addr
	// Netns is a network namespace (a path like /run/netns/NAME) the
	// gateways connect from; "" = the worker's own.
	Netns string
	// Roots verify upstream servers where a gateway speaks TLS itself
	// (every HTTPS connection it terminates); nil = the host's roots.
	Roots *x509.CertPool
	// WildcardNames and WildcardNamesPerMinute bound the distinct names
	// each sandbox may resolve under wildcard rules (see
	// egress.Config); 0 = 256, then 30 a minute.
	WildcardNames, WildcardNamesPerMinute int
}

// resolve is the gateways' resolver.
func (e Egress) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, ok := e.Hosts[host]; ok {
		return a, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
}

// dial is the gateways' dialer.
func (e Egress) dial(ctx context.Context, network, addr string) (c net.Conn, err error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	err = netns.Do(e.Netns, func() error {
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// workerConfig is what newWorker needs.
type workerConfig struct {
	VMM         string      // Config.VMM
	Firecracker Firecracker // Config.Firecracker
	Host        HostPaths   // Config.Host
	// Purge opens the worker only to remove what it made (PurgeWorker):
	// no accelerator probe, no images.
	Purge    bool
	Progress io.Writer // or nil
	// FakeFaults are failures the fake driver injects from the start;
	// for tests.
	FakeFaults map[fake.Point]fake.Fault
	// BootTimeout overrides the driver's boot timeout; 0 = the driver's.
	// For tests.
	BootTimeout            time.Duration
	Egress                 Egress
	ID, DataDir, CacheBase string
	Images                 *imagebuild.Artifacts
	VCPUs                  int
	MemoryMiB              int64
	DiskReserveMiB         int64         // worker.Config.DiskReserveMiB
	StorageGiB             int64         // WorkerConfig.StorageGiB
	ReclaimIdleAfter       time.Duration // worker.Config.ReclaimIdleAfter
	AgentHeartbeat         time.Duration // worker.Config.AgentHeartbeat
	AgentTimeout           time.Duration // worker.Config.AgentTimeout
	Chunks                 *chunkstore.Store
	ChunkStore             string // names Chunks (worker.Config.ChunkStore)
	Fencing                bool   // worker.Config.Fencing: a standalone worker
	CrashAt                string
	Metrics                prometheus.Registerer // worker.Config.Metrics; or nil
	MetricsPerSandbox      bool                  // worker.Config.MetricsPerSandbox
	Log                    *slog.Logger
}

// templates serves the default template and built templates' base
// images (booted with the default kernel and initramfs).
type templates struct {
	def    *imagebuild.Artifacts
	images *templatebuild.Images
}

func (t templates) Template(ctx context.Context, name string) (*imagebuild.Artifacts, error) {
	switch {
	case name == "default":
		return t.def, nil
	case templatebuild.IsImageName(name):
		img, err := t.images.Open(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("template %q: %w", name, err)
		}
		return &imagebuild.Artifacts{Kernel: t.def.Kernel, Initramfs: t.def.Initramfs, Rootfs: img.Path}, nil
	}
	return nil, fmt.Errorf("template %q: %w", name, errkind.NotFound)
}

// newWorker builds and starts (recovers) a worker with the driver
// wc.VMM names.
func newWorker(ctx context.Context, wc workerConfig) (*worker.Worker, error) {
	cache, err := cachedir.Open(wc.CacheBase)
	if err != nil {
		return nil, err
	}
	// The worker's directory reflinks where it can: a loop-mounted XFS
	// image on file systems that do not (ext4), when root.
	st, err := storage.Prepare(ctx, storage.Config{DataDir: filepath.Dir(wc.DataDir), Dir: wc.DataDir, LoopSize: wc.StorageGiB << 30, Log: wc.Log})
	if err != nil {
		return nil, err
	}
	wc.Log.Info("worker storage", "dir", st.Dir, "mode", st.Mode, "direct_io", st.DirectIO)
	drv, info, bootTimeout, err := openDriver(ctx, wc, cache, st.Dir)
	if err != nil {
		return nil, err
	}
	if wc.BootTimeout > 0 {
		bootTimeout = wc.BootTimeout
	}
	var cg *cgroup.Hierarchy
	if wc.Host.CgroupRoot != "" {
		// Asked for: a worker in a container whose VMs must outlive it.
		// The host's groups are reachable only from the host's cgroup
		// namespace where the runtime gave the pod one of its own.
		if joined, err := cgroup.JoinNamespaceOf(1); err != nil {
			wc.Log.Warn("staying in this process's cgroup namespace", "err", err)
		} else if joined {
			wc.Log.Info("joined the host's cgroup namespace (of pid 1)")
		}
		if cg, err = cgroup.At(wc.Host.CgroupRoot); err != nil {
			return nil, fmt.Errorf("--cgroup-root: %w", err)
		}
	} else if cg, err = cgroup.Detect(); err != nil {
		wc.Log.Warn("running VMMs without cgroup limits", "err", err)
		cg = nil
	}
	// The worker's own key seals what it keeps of secrets; it lives next
	// to its data, outside the database.
	box, err := secrets.LoadOrCreateKey(filepath.Join(filepath.Dir(wc.DataDir), "worker-secrets.key"))
	if err != nil {
		return nil, err
	}
	w, err := worker.New(worker.Config{
		ID: wc.ID, DataDir: st.Dir, ReflinkStorage: st.Reflinked(), StorageBacking: st.Backing, Driver: drv, BootTimeout: bootTimeout,
		Templates: templates{def: wc.Images, images: &templatebuild.Images{Cache: cache, Chunks: wc.Chunks, Log: wc.Log}},
		Cgroups:   cg, RunRoot: wc.Host.RunRoot, CrashAt: wc.CrashAt, Log: wc.Log, VCPUs: wc.VCPUs, MemoryMiB: wc.MemoryMiB, DiskReserveMiB: wc.DiskReserveMiB, ReclaimIdleAfter: wc.ReclaimIdleAfter, Chunks: wc.Chunks,
		AgentHeartbeat: wc.AgentHeartbeat, AgentTimeout: wc.AgentTimeout,
		ChunkStore: wc.ChunkStore, Fencing: wc.Fencing, EgressResolve: wc.Egress.resolve, EgressDial: wc.Egress.dial, EgressRoots: wc.Egress.Roots, Secrets: box,
		EgressWildcardNames: wc.Egress.WildcardNames, EgressWildcardNamesPerMinute: wc.Egress.WildcardNamesPerMinute,
		VMM: info, Metrics: wc.Metrics, MetricsPerSandbox: wc.MetricsPerSandbox,
	})
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// qemuBinary is the QEMU the worker's driver runs (qemu.Config.Binary's
// default).
const qemuBinary = "qemu-system-x86_64"

// qemuVersion asks QEMU for its version ("7.2.19"), for the worker's
// capabilities.
func qemuVersion(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-version")
	cmd.Env = []string{}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s -version: %w", bin, err)
	}
	// "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u16)"
	_, rest, ok := strings.Cut(string(out), "version ")
	v, _, _ := strings.Cut(rest, " ")
	v = strings.TrimSpace(v)
	if !ok || v == "" || len(v) > 64 {
		return "", fmt.Errorf("%s -version: no version in %.80q", bin, out)
	}
	return v, nil
}

// lockDir takes an exclusive lock on dir's lock file, so two processes
// never run on one data dir.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir %s is in use by another space process: %w", dir, errkind.FailedPrecondition)
	}
	return func() { f.Close() }, nil
}

// writeFileAtomic writes data to path through a synced temporary file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// secretFile returns the secret kept in path, making a new random one
// (0600) when the file does not exist.
func secretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var raw [32]byte
	rand.Read(raw[:])
	secret := hex.EncodeToString(raw[:])
	if err := writeFileAtomic(path, []byte(secret+"\n"), 0o600); err != nil {
		return "", err
	}
	return secret, nil
}

// ChunkStore says where a process keeps its chunk store.
type ChunkStore struct {
	// Location is a directory or an s3:// URL (see package
	// chunkstore/chunkloc); "" = DataDir/chunks.
	Location string
	// Credentials are an s3:// Location's (chunkloc.CredentialsFromEnv);
	// zero = anonymous requests.
	Credentials chunkloc.Credentials
	// CacheMiB bounds the local cache of an s3:// Location's chunks,
	// DataDir/chunk-cache; 0 = chunkloc.DefaultCacheBytes.
	CacheMiB int64
}

// ChunkCacheDir is where, under a data dir, a process with an S3 chunk
// store caches the chunks it fetched.
const ChunkCacheDir = "chunk-cache"

// location parses cs.Location, or returns dataDir/chunks.
func (cs ChunkStore) location(dataDir string) (chunkloc.Location, error) {
	if cs.Location == "" {
		return chunkloc.Location{Dir: filepath.Join(dataDir, "chunks")}, nil
	}
	return chunkloc.Parse(cs.Location)
}

// name is the name of cs's store that workers report
// (chunkloc.Location.Name).
func (cs ChunkStore) name(dataDir string) (string, error) {
	loc, err := cs.location(dataDir)
	if err != nil {
		return "", err
	}
	return loc.Name(), nil
}

// openChunks opens the chunk store cs names for the process whose data
// dir is dataDir. An S3 store is checked with one request, and fronted by
// a cache in dataDir/ChunkCacheDir.
func openChunks(ctx context.Context, cs ChunkStore, dataDir string, log *slog.Logger) (*chunkstore.Store, error) {
	if cs.CacheMiB < 0 {
		return nil, fmt.Errorf("chunk cache size %d MiB: want 0 or more: %w", cs.CacheMiB, errkind.InvalidArgument)
	}
	loc, err := cs.location(dataDir)
	if err != nil {
		return nil, err
	}
	return chunkloc.Open(ctx, loc, chunkloc.Options{
		Credentials: cs.Credentials, CacheDir: filepath.Join(dataDir, ChunkCacheDir), CacheBytes: cs.CacheMiB << 20,
		Log: log.With("component", "chunk-cache"),
	})
}

// DefaultChunkGCInterval is how often the server frees chunks no
// snapshot uses, unless Config.ChunkGCInterval says otherwise.
const DefaultChunkGCInterval = 10 * time.Minute

// collectChunks runs the chunk store's garbage collection every interval
// until ctx ends.
func collectChunks(ctx context.Context, chunks *chunkstore.Store, interval time.Duration, m *chunkMetrics, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			collectOnce(ctx, chunks, m, log)
		}
	}
}

// collectOnce runs one garbage collection of chunks and records it in m.
func collectOnce(ctx context.Context, chunks *chunkstore.Store, m *chunkMetrics, log *slog.Logger) {
	st, err := chunks.GC(ctx)
	m.freed.Add(float64(st.BytesDeleted)) // what a failed run deleted is gone too
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("chunk garbage collection", "err", err)
		}
		return
	}
	m.stored.Set(float64(st.BytesScanned - st.BytesDeleted))
	if st.ChunksDeleted > 0 {
		log.Info("chunks collected", "deleted", st.ChunksDeleted, "bytes", st.BytesDeleted)
	}
}
