package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"space/api"
	"space/internal/checkpoint"
	"space/internal/chunkstore/chunkloc"
	"space/internal/controlplane"
	"space/internal/server"
	"space/internal/webhook"
)

// newServerCmd returns `space server`: the control plane with an embedded
// worker and the default template.
func newServerCmd(g *globals) *cobra.Command {
	var (
		listen, agent, storeURL, workerID           string
		chunks                                      chunkFlags
		tokenFile, secretsKey, dataPlaneURL         string
		workerListen, workerAdvertise, adminKeyFile string
		leaderElection, kubeNamespace, kubeconfig   string
		workerDiscovery, guestKernel                string
		checkpoints, onTimeout                      string
		timeout                                     time.Duration
		chunkGCInterval                             time.Duration
		recoverAfter, eventRetention                time.Duration
		auditRetention                              time.Duration
		vmm                                         vmmFlags
		noWorker                                    bool
		vcpus, pool                                 int
		memory, diskReserve, storageGiB             int64
		reclaimIdle                                 time.Duration
		hb                                          heartbeat
		egress                                      server.Egress
		e2bListen, e2bDomain, e2bCert, e2bKey       string
		metrics                                     metricsFlags
		metricsTeams                                int
		webhooks                                    controlplane.WebhookConfig
	)
	c := &cobra.Command{
		Use:   "server",
		Short: "Run the control plane and API with an embedded worker",
		Long: `Run SPACE's control plane (the REST API, state and placement) together
with a worker that runs sandbox VMs on this host. The first start prepares
the default template (a Debian kernel, an initramfs with space-agent and a
Debian root file system with python3) and creates the first admin API key
in DATA_DIR/admin.key; later starts reuse both. VMs keep running when the
server stops, and the next start re-adopts them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkVMMFlag(vmm); err != nil {
				return err
			}
			defaultCheckpoints, err := serverPolicy(checkpoints)
			if err != nil {
				return err
			}
			if timeout < time.Second || timeout > controlplane.DefaultLimits.MaxTTL {
				return usagef("--timeout %v: want 1s..%v", timeout, controlplane.DefaultLimits.MaxTTL)
			}
			if onTimeout != "delete" && onTimeout != "suspend" {
				return usagef("--on-timeout %q: want delete or suspend", onTimeout)
			}
			if chunkGCInterval <= 0 {
				return usagef("--chunk-gc-interval %v: want a positive duration, e.g. 10m", chunkGCInterval)
			}
			if recoverAfter >= 0 && recoverAfter < 6*time.Second {
				return usagef("--recover-after %v: want at least 6s, or a negative duration to turn recovery off", recoverAfter)
			}
			if webhooks.DisableAfter == 0 {
				return usagef("--webhook-disable-after 0: want a number of failed attempts, or a negative number for never")
			}
			if !noWorker && vmm.kind != server.VMMFake {
				if err := checkAgent(agent); err != nil {
					return err
				}
			}
			token, err := readToken(g, "", tokenFile)
			if err != nil {
				return err
			}
			var adminKey string
			if adminKeyFile != "" {
				b, err := os.ReadFile(adminKeyFile)
				if err != nil {
					return fmt.Errorf("--admin-key-file: %w", err)
				}
				adminKey = strings.TrimSpace(string(b))
			}
			dataDir, err := g.serverDataDir()
			if err != nil {
				return err
			}
			if g.cacheBase == "" {
				return usagef("no cache directory: pass --cache DIR or set SPACE_CACHE_DIR")
			}
			if storeURL == "" {
				storeURL = g.getenv("SPACE_STORE_URL")
			}
			var e2bCfg *server.E2B
			if e2bListen != "" {
				e2bCfg = &server.E2B{Listen: e2bListen, Domain: e2bDomain, TLSCert: e2bCert, TLSKey: e2bKey}
			} else if e2bDomain != "" || e2bCert != "" || e2bKey != "" {
				return usagef("--e2b-domain, --e2b-tls-cert and --e2b-tls-key need --e2b-listen")
			}
			if (e2bCert == "") != (e2bKey == "") {
				return usagef("--e2b-tls-cert and --e2b-tls-key go together")
			}
			return server.Run(cmd.Context(), server.Config{
				E2B:     e2bCfg,
				DataDir: dataDir, Listen: listen, MetricsListen: metrics.listen, MetricsPerSandbox: metrics.perSandbox, MetricsTeams: metricsTeams, CacheBase: g.cacheBase, AgentPath: agent, GuestKernel: guestKernel,
				StoreURL: storeURL, WorkerID: workerID, VCPUs: vcpus, MemoryMiB: memory, DiskReserveMiB: diskReserve, StorageGiB: storageGiB, ReclaimIdleAfter: reclaimAfter(reclaimIdle), Chunks: chunks.store(g),
				AgentHeartbeat: hb.every, AgentTimeout: hb.timeout,
				NoWorker: noWorker, LeaderElection: leaderElection, KubeNamespace: kubeNamespace, Kubeconfig: kubeconfig, WorkerDiscovery: workerDiscovery, WorkerListen: workerListen, WorkerAdvertise: workerAdvertise, WorkerToken: token, SecretsKeyFile: secretsKey, DataPlaneURL: dataPlaneURL, AdminKey: adminKey,
				DefaultCheckpoints: defaultCheckpoints, DefaultTimeout: timeout, DefaultOnTimeout: onTimeout, ChunkGCInterval: chunkGCInterval, RecoverAfter: recoverAfter, EventRetention: eventRetention,
				AuditRetention: auditRetention, Webhooks: webhooks,
				CrashAt: g.getenv("SPACE_CRASH_AT"), Version: version(),
				Progress: g.stderr, Log: g.logger(), Prewarm: true, Pool: pool, Egress: egress, VMM: vmm.kind, Firecracker: vmm.fc, Host: vmm.host,
			})
		},
	}
	f := c.Flags()
	f.StringVar(&listen, "listen", server.DefaultListen, "`address` the API listens on")
	metricsFlag(f, &metrics)
	f.IntVar(&metricsTeams, "metrics-teams", controlplane.DefaultMetricsTeams, "how many teams, those with the most sandboxes, space_team_sandboxes names by team ID (the others are summed as \"other\"); a negative `N` reports no such family (docs/operations.md)")
	f.StringVar(&storeURL, "store", "", "PostgreSQL `URL` for the state (default: SQLite in the data dir; env SPACE_STORE_URL)")
	f.BoolVar(&noWorker, "no-worker", false, "run no embedded worker: sandboxes run on standalone workers only (replicas on PostgreSQL)")
	f.StringVar(&tokenFile, "worker-token-file", "", "read the worker token from `FILE` (default DATA_DIR/worker.token, made on the first start; replicas share one; env SPACE_WORKER_TOKEN)")
	f.StringVar(&adminKeyFile, "admin-key-file", "", "make the secret in `FILE` an admin API key of the default team (replicas share one, e.g. from a Kubernetes Secret) instead of creating one in DATA_DIR/admin.key")
	f.StringVar(&secretsKey, "secrets-key", "", "`FILE` of the key secrets are sealed with (default DATA_DIR/secrets.key, made on the first start; replicas share one)")
	f.StringVar(&dataPlaneURL, "data-plane-url", "", "`URL` clients send data-plane requests (exec, files) of standalone workers' sandboxes to: a space proxy (default: this server)")
	f.StringVar(&leaderElection, "leader-election", server.LeaderStore, "where replicas elect the one that does the background work: store (the store's leader lease) or kubernetes (a coordination Lease in the pod's namespace; needs RBAC on leases)")
	f.StringVar(&workerDiscovery, "worker-discovery", server.DiscoveryToken, "how standalone workers are found: token (they register over HTTP with the worker token) or kubernetes (also through their coordination Leases in the namespace; needs RBAC to get/list/watch leases)")
	f.StringVar(&kubeNamespace, "kube-namespace", "", "`namespace` of the leader Lease with --leader-election kubernetes and of the workers' Leases with --worker-discovery kubernetes (default: the pod's)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig `FILE` of the API server for --leader-election kubernetes and --worker-discovery kubernetes (default: the cluster this pod runs in)")
	f.StringVar(&workerListen, "worker-listen", "", "`address` where the embedded worker serves other replicas (TLS, the worker token) (default on PostgreSQL 127.0.0.1:0: this host's replicas only; none on SQLite)")
	f.StringVar(&workerAdvertise, "worker-advertise", "", "`URL` other replicas reach the embedded worker at (default https://WORKER_LISTEN)")
	f.StringVar(&workerID, "worker-id", "", "`ID` of the embedded worker (default: the one recorded in the data dir, or a new random one on the first start)")
	chunksFlag(f, &chunks, "")
	f.DurationVar(&chunkGCInterval, "chunk-gc-interval", server.DefaultChunkGCInterval, "how often the chunk store's garbage collection frees the chunks no snapshot uses")
	f.DurationVar(&recoverAfter, "recover-after", controlplane.DefaultRecoverAfter, "how long a standalone worker may go without the leader's lease before its sandboxes are restored elsewhere from their latest checkpoints (at least 6s; negative: never; docs/recovery.md)")
	f.DurationVar(&eventRetention, "event-retention", controlplane.DefaultEventRetention, "how long sandboxes' lifecycle events are kept (negative: for ever)")
	f.BoolVar(&webhooks.AllowPrivate, "webhook-allow-private", false, "let webhooks reach private, loopback, link-local and this host's own addresses, and use http (an administrator's choice for receivers on this network; default: https to public addresses only; docs/operations.md)")
	f.IntVar(&webhooks.DisableAfter, "webhook-disable-after", webhook.DefaultDisableAfter, "failed delivery attempts in a row after which a webhook is disabled until its team enables it again (negative: never)")
	f.DurationVar(&auditRetention, "audit-retention", controlplane.DefaultAuditRetention, "how long audit log entries are kept; the oldest are pruned, and verification starts from the last one pruned (negative: for ever; docs/operations.md)")
	f.DurationVar(&timeout, "timeout", controlplane.DefaultLimits.DefaultTTL, "the timeout of sandboxes created without one (at most 168h)")
	f.StringVar(&onTimeout, "on-timeout", "delete", "what the timeout of sandboxes created without on_timeout does: delete, or suspend (the timeout becomes an idle time after which the sandbox is written to storage and its memory freed; resume brings it back)")
	f.StringVar(&checkpoints, "checkpoints", "", "the checkpoint `policy` of sandboxes created without one, e.g. every=5m,after_exec,keep=20,keep_for=24h (also min_exec=D; default: none)")
	f.IntVar(&pool, "pool", 1, "sandboxes of the default shape kept restored and ready, `N` (0 to 16)")
	f.IntVar(&vcpus, "vcpus", 0, "vCPUs the embedded worker offers, over the host CPUs its vCPU overcommit (default: one per 128 MiB of memory offered, at least 4 per host CPU)")
	f.Int64Var(&memory, "memory", 0, "`MiB` of guest memory the embedded worker offers (default: 80% of host RAM)")
	diskFlags(f, &diskReserve, &storageGiB)
	reclaimIdleFlag(f, &reclaimIdle)
	heartbeatFlags(f, &hb)
	f.StringVar(&e2bListen, "e2b-listen", "", "`address` of the E2B-compatible API (E2B_API_URL, E2B_SANDBOX_URL; docs/e2b.md), e.g. :443 with --e2b-domain and TLS (default: none)")
	f.StringVar(&e2bDomain, "e2b-domain", "", "`domain` of the E2B API's sandbox hosts PORT-ID.DOMAIN and of api.DOMAIN (E2B_DOMAIN; needs wildcard DNS to this server)")
	f.StringVar(&e2bCert, "e2b-tls-cert", "", "PEM `FILE` of the E2B listener's certificate (for DOMAIN and *.DOMAIN); with --e2b-tls-key")
	f.StringVar(&e2bKey, "e2b-tls-key", "", "PEM `FILE` of the key of --e2b-tls-cert")
	egressFlags(f, &egress)
	agentFlag(f, &agent)
	guestKernelFlag(f, &guestKernel)
	vmmFlag(f, &vmm)
	return c
}

// serverPolicy returns the default checkpoint policy --checkpoints
// gives, checked (nil: none).
func serverPolicy(flag string) (*api.CheckpointPolicy, error) {
	p, err := checkpoint.Parse(flag)
	if err == nil {
		_, err = checkpoint.FromAPI("policy", p)
	}
	if err != nil {
		return nil, usagef("--checkpoints %q: %v", flag, err)
	}
	if p == (api.CheckpointPolicy{}) {
		return nil, nil
	}
	return &p, nil
}

// vmmFlags are the flags that choose and configure the worker's
// hypervisor driver.
type vmmFlags struct {
	kind string
	fc   server.Firecracker
	host server.HostPaths
}

// vmmFlag binds --vmm and the Firecracker driver's flags.
func vmmFlag(fs *pflag.FlagSet, p *vmmFlags) {
	fs.StringVar(&p.kind, "vmm", server.VMMAuto, "hypervisor `driver`: auto (Firecracker where its binary is found and KVM boots a guest under it, else QEMU), qemu, firecracker, or fake (sandboxes are jailed host processes, NOT VMs: for tests and load tests only)")
	fs.StringVar(&p.fc.Binary, "firecracker", "", "the firecracker `binary` (default: firecracker on PATH)")
	fs.StringVar(&p.fc.Jailer, "firecracker-jailer", "", "run every Firecracker through this jailer `binary` (of the same release), chrooted, as an unprivileged uid/gid (default: no jailer)")
	fs.IntVar(&p.fc.UID, "firecracker-uid", 0, "`uid` jailed Firecrackers run as (default 2000000001)")
	fs.IntVar(&p.fc.GID, "firecracker-gid", 0, "`gid` jailed Firecrackers run as (default 2000000001)")
	fs.StringVar(&p.host.CgroupRoot, "cgroup-root", "", "the cgroup hierarchy to put VMs in, a `dir` (default: this process's /sys/fs/cgroup); in a container, the host's mounted in, so VMs outlive it")
	fs.StringVar(&p.host.RunRoot, "run-root", "", "tmpfs `dir` for the VMs' run files (default /dev/shm/space-ID); in a container, one of the host's mounted in")
}

func checkVMMFlag(v vmmFlags) error {
	switch v.kind {
	case server.VMMAuto, server.VMMQEMU, server.VMMFirecracker, server.VMMFake:
	default:
		return usagef("--vmm %q: want %s, %s, %s or %s", v.kind, server.VMMAuto, server.VMMQEMU, server.VMMFirecracker, server.VMMFake)
	}
	if v.fc.UID < 0 || v.fc.GID < 0 {
		return usagef("--firecracker-uid %d, --firecracker-gid %d: want unprivileged ids", v.fc.UID, v.fc.GID)
	}
	return nil
}

// newWorkerCmd returns `space worker`: a standalone worker that registers
// with a control plane.
func newWorkerCmd(g *globals) *cobra.Command {
	var (
		controlPlane, token, tokenFile, listen, advertise, agent, id string
		metrics                                                      metricsFlags
		discovery, kubeNamespace, kubeconfig, guestKernel            string
		chunks                                                       chunkFlags
		vmm                                                          vmmFlags
		vcpus                                                        int
		memory, diskReserve, storageGiB                              int64
		reclaimIdle                                                  time.Duration
		hb                                                           heartbeat
		egress                                                       server.Egress
	)
	c := &cobra.Command{
		Use:   "worker (--control-plane URL | --discovery kubernetes) --token T",
		Short: "Run a standalone worker that registers with a control plane",
		Long: `Run a worker that hosts sandbox VMs for the control plane at URL. It
registers (and sends a heartbeat every 10 s) with the control plane's worker
token, found in the server's DATA_DIR/worker.token. With --discovery
kubernetes it registers with no control plane: it publishes a coordination
Lease space-worker-ID in --kube-namespace, renewed every 10 s, which control
planes started with --worker-discovery kubernetes watch; the worker token
still keys its TLS and data-plane tokens. Several workers may run on one
host, each with its own --data-dir, --listen and --id.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkVMMFlag(vmm); err != nil {
				return err
			}
			if vmm.kind != server.VMMFake {
				if err := checkAgent(agent); err != nil {
					return err
				}
			}
			switch discovery {
			case server.DiscoveryToken:
				if controlPlane == "" {
					return usagef("--control-plane is required (or --discovery %s)", server.DiscoveryKubernetes)
				}
			case server.DiscoveryKubernetes:
				if controlPlane != "" {
					return usagef("--control-plane and --discovery %s: the worker registers through its Lease, give one of them", server.DiscoveryKubernetes)
				}
			default:
				return usagef("--discovery %q: want %s or %s", discovery, server.DiscoveryToken, server.DiscoveryKubernetes)
			}
			token, err := readToken(g, token, tokenFile)
			if err != nil {
				return err
			}
			if token == "" {
				return usagef("--token (or --token-file, or SPACE_WORKER_TOKEN) is required: the server's DATA_DIR/%s", server.WorkerTokenFile)
			}
			dataDir, err := g.serverDataDir()
			if err != nil {
				return err
			}
			if g.dataDir == "" {
				dataDir = filepath.Join(dataDir, "workers", "default")
			}
			if g.cacheBase == "" {
				return usagef("no cache directory: pass --cache DIR or set SPACE_CACHE_DIR")
			}
			return server.RunWorker(cmd.Context(), server.WorkerConfig{
				ID: id, DataDir: dataDir, Listen: listen, MetricsListen: metrics.listen, MetricsPerSandbox: metrics.perSandbox, Advertise: advertise, ControlPlane: controlPlane,
				Discovery: discovery, KubeNamespace: kubeNamespace, Kubeconfig: kubeconfig,
				Token: token, CacheBase: g.cacheBase, AgentPath: agent, GuestKernel: guestKernel, VCPUs: vcpus, MemoryMiB: memory, DiskReserveMiB: diskReserve, StorageGiB: storageGiB, ReclaimIdleAfter: reclaimAfter(reclaimIdle), Chunks: chunks.store(g),
				AgentHeartbeat: hb.every, AgentTimeout: hb.timeout,
				CrashAt: g.getenv("SPACE_CRASH_AT"), Progress: g.stderr, Log: g.logger(), Egress: egress, VMM: vmm.kind, Firecracker: vmm.fc, Host: vmm.host,
			})
		},
	}
	f := c.Flags()
	f.StringVar(&controlPlane, "control-plane", "", "the control plane's `URL`, e.g. http://127.0.0.1:7070 (with --discovery token)")
	f.StringVar(&discovery, "discovery", server.DiscoveryToken, "how the control plane finds this worker: token (it registers with --control-plane) or kubernetes (it publishes a coordination Lease in --kube-namespace; needs RBAC to create, get and update leases)")
	f.StringVar(&kubeNamespace, "kube-namespace", "", "`namespace` of the worker's Lease with --discovery kubernetes (default: the pod's)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig `FILE` of the API server with --discovery kubernetes (default: the cluster this pod runs in)")
	f.StringVar(&token, "token", "", "the control plane's worker `token`")
	f.StringVar(&tokenFile, "token-file", "", "read the worker token from `FILE`")
	f.StringVar(&listen, "listen", server.DefaultWorkerListen, "`address` the worker API listens on")
	metricsFlag(f, &metrics)
	f.StringVar(&advertise, "advertise", "", "`URL` the control plane reaches this worker at (default: https://LISTEN; the worker serves TLS with a certificate the worker token vouches for)")
	f.StringVar(&id, "id", "", "worker `ID` (default: the one recorded in the data dir, or a new random one on the first start)")
	chunksFlag(f, &chunks, "; the server's, to share its snapshots")
	f.IntVar(&vcpus, "vcpus", 0, "vCPUs offered, over the host CPUs its vCPU overcommit (default: one per 128 MiB of memory offered, at least 4 per host CPU)")
	f.Int64Var(&memory, "memory", 0, "`MiB` of guest memory offered (default: 80% of host RAM)")
	diskFlags(f, &diskReserve, &storageGiB)
	reclaimIdleFlag(f, &reclaimIdle)
	heartbeatFlags(f, &hb)
	egressFlags(f, &egress)
	agentFlag(f, &agent)
	guestKernelFlag(f, &guestKernel)
	vmmFlag(f, &vmm)
	c.AddCommand(newWorkerPurgeCmd(g))
	return c
}

// newWorkerPurgeCmd returns `space worker purge`: remove everything a
// worker made on this host.
func newWorkerPurgeCmd(g *globals) *cobra.Command {
	var (
		chunks       string
		removeChunks bool
		vmm          vmmFlags
	)
	c := &cobra.Command{
		Use:   "purge",
		Short: "Remove everything a stopped worker made on this host",
		Long: `Remove every sandbox the worker whose data dir is DATA_DIR made on this
host, with its VM, tap, network namespace and control group, the worker's
run files and storage mount, and then the data dir itself: what
uninstalling runs on each node. The worker must be stopped (its data dir is
locked while it runs). Pass the --vmm, --cgroup-root and --run-root it ran
with. A chunk store directory given with --chunks (outside the data dir)
is left, unless --remove-chunks; an S3 chunk store (--chunks s3://...) is
never touched, only the local cache of its chunks in the data dir goes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkVMMFlag(vmm); err != nil {
				return err
			}
			dataDir, err := g.serverDataDir()
			if err != nil {
				return err
			}
			if g.dataDir == "" {
				dataDir = filepath.Join(dataDir, "workers", "default")
			}
			if err := server.PurgeWorker(cmd.Context(), server.WorkerConfig{
				DataDir: dataDir, Chunks: server.ChunkStore{Location: chunks}, RemoveChunks: removeChunks, CacheBase: g.cacheBase, Log: g.logger(),
				VMM: vmm.kind, Firecracker: vmm.fc, Host: vmm.host,
			}); err != nil {
				return err
			}
			fmt.Fprintf(g.stderr, "space: purged %s\n", dataDir)
			return nil
		},
	}
	c.Flags().StringVar(&chunks, "chunks", "", "the worker's chunk store, a `directory` if outside the data dir (left in place unless --remove-chunks), or its s3:// URL (never touched)")
	c.Flags().BoolVar(&removeChunks, "remove-chunks", false, "remove the --chunks directory too (it is the worker's own, not shared; refused for s3://)")
	vmmFlag(c.Flags(), &vmm)
	return c
}

// serverDataDir returns --data-dir, SPACE_DATA_DIR or the default.
func (g *globals) serverDataDir() (string, error) {
	if g.dataDir != "" {
		return g.dataDir, nil
	}
	if d := defaultDataDir(); d != "" {
		return d, nil
	}
	return "", usagef("no data directory: pass --data-dir DIR or set SPACE_DATA_DIR")
}

// chunkFlags are the flags that say where the chunk store is.
type chunkFlags struct {
	location string
	cacheMiB int64
}

// chunksFlag binds --chunks and --chunk-cache-mib; more ends --chunks'
// help.
func chunksFlag(fs *pflag.FlagSet, p *chunkFlags, more string) {
	fs.StringVar(&p.location, "chunks", "", "the snapshot chunk store: a `directory` (default DATA_DIR/chunks), or an S3 bucket s3://BUCKET[/PREFIX]?endpoint=HOST:PORT[&tls=false][&region=R] with the credentials in SPACE_S3_ACCESS_KEY and SPACE_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"+more)
	fs.Int64Var(&p.cacheMiB, "chunk-cache-mib", 0, "`MiB` of chunks fetched from an S3 chunk store kept in DATA_DIR/chunk-cache, so restores download only new ones (default 8192)")
}

// store returns the chunk store the flags and the environment name.
func (p chunkFlags) store(g *globals) server.ChunkStore {
	return server.ChunkStore{Location: p.location, CacheMiB: p.cacheMiB, Credentials: chunkloc.CredentialsFromEnv(g.getenv)}
}

// egressFlags binds the flags that tune sandboxes' gateways.
func egressFlags(fs *pflag.FlagSet, e *server.Egress) {
	fs.IntVar(&e.WildcardNames, "egress-wildcard-names", 0, "distinct names a sandbox may resolve under wildcard rules at first, `N` (default 256)")
	fs.IntVar(&e.WildcardNamesPerMinute, "egress-wildcard-names-per-minute", 0, "further distinct wildcard names a sandbox may resolve each minute, `N` (default 30)")
}

// readToken returns the worker token: token if set, else the contents of
// file if set, else SPACE_WORKER_TOKEN, else "".
func readToken(g *globals, token, file string) (string, error) {
	if token == "" && file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("worker token: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return "", fmt.Errorf("worker token: %s is empty", file)
		}
	}
	if token == "" {
		token = g.getenv("SPACE_WORKER_TOKEN")
	}
	return token, nil
}

// newProxyCmd returns `space proxy`: the data plane of standalone
// workers' sandboxes.
func newProxyCmd(g *globals) *cobra.Command {
	var listen, token, tokenFile string
	c := &cobra.Command{
		Use:   "proxy --token-file FILE",
		Short: "Serve the data plane (exec, files, terminals) of standalone workers' sandboxes",
		Long: `Serve the data plane of the sandboxes on standalone workers: exec,
processes, files and ports, each request authorized by the sandbox's
data-plane token (which the control plane hands out with the sandbox, see
--data-plane-url on space server) and sent to the worker the token names.
A proxy keeps no state and needs no database: run as many as you like, and
restart control-plane replicas without cutting a running command's stream.
It needs the cluster's worker token (the server's DATA_DIR/worker.token).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := readToken(g, token, tokenFile)
			if err != nil {
				return err
			}
			if token == "" {
				return usagef("--token-file (or --token, or SPACE_WORKER_TOKEN) is required: the server's DATA_DIR/%s", server.WorkerTokenFile)
			}
			return server.RunProxy(cmd.Context(), server.ProxyConfig{
				Token: token, Listen: listen, Version: version(), Progress: g.stderr, Log: g.logger(),
			})
		},
	}
	f := c.Flags()
	f.StringVar(&listen, "listen", server.DefaultProxyListen, "`address` the proxy listens on")
	f.StringVar(&token, "token", "", "the cluster's worker `token`")
	f.StringVar(&tokenFile, "token-file", "", "read the worker token from `FILE`")
	return c
}

// heartbeat holds --agent-heartbeat and --agent-timeout.
type heartbeat struct{ every, timeout time.Duration }

// heartbeatFlags adds --agent-heartbeat and --agent-timeout: how the
// worker watches its sandboxes' agents (worker.Config.AgentHeartbeat,
// AgentTimeout; docs/agent-protocol.md).
func heartbeatFlags(f *pflag.FlagSet, hb *heartbeat) {
	f.DurationVar(&hb.every, "agent-heartbeat", 5*time.Second, "how often the worker asks each running sandbox's agent for its health (negative: never)")
	f.DurationVar(&hb.timeout, "agent-timeout", 15*time.Second, "how long an agent may take to answer before it is declared unresponsive and its sandbox's calls fail at once")
}

// reclaimIdleFlag adds --reclaim-idle: how long a sandbox goes without
// requests before its guest gives its cached memory back.
func reclaimIdleFlag(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "reclaim-idle", 2*time.Minute, "how long a sandbox goes without API requests before its guest drops its clean caches and the memory goes back to the host, once per idle spell (0: never)")
}

// reclaimAfter turns --reclaim-idle into worker.Config.ReclaimIdleAfter,
// where 0 means the default and never is negative.
func reclaimAfter(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// metricsFlags are --metrics-listen and --metrics-per-sandbox.
type metricsFlags struct {
	listen     string
	perSandbox bool
}

// metricsFlag adds --metrics-listen and --metrics-per-sandbox.
func metricsFlag(f *pflag.FlagSet, m *metricsFlags) {
	f.StringVar(&m.listen, "metrics-listen", "", "`address` serving Prometheus /metrics on a listener of its own, with no API key: bind it to a private address, e.g. 10.0.0.5:9090 (default: none; docs/operations.md)")
	f.BoolVar(&m.perSandbox, "metrics-per-sandbox", false, "add the worker's metrics labelled by sandbox ID (memory, vCPUs): one series per sandbox, so off by default (docs/operations.md)")
}

// diskFlags are a worker's --disk-reserve (worker.Config.DiskReserveMiB)
// and --storage-size (server.WorkerConfig.StorageGiB).
func diskFlags(f *pflag.FlagSet, reserveMiB, storageGiB *int64) {
	f.Int64Var(reserveMiB, "disk-reserve", 0, "`MiB` the worker's storage keeps free beyond the disks (disk_mib) it promised to sandboxes; a create that would cut into it is refused (default: 10% of the storage, at most 8 GiB)")
	f.Int64Var(storageGiB, "storage-size", 0, "size in `GiB` of the sparse XFS image made for the worker's storage where its data dir cannot reflink; it bounds the sandboxes' disks together, and an image made before keeps its size (default 64)")
}
