package worker

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"space/api"
	"space/internal/agent/client"
	"space/internal/cgroup"
	"space/internal/chunkstore"
	"space/internal/egress"
	"space/internal/errkind"
	"space/internal/guestvm"
	"space/internal/hostaddr"
	"space/internal/imagebuild"
	"space/internal/sandbox"
	"space/internal/secrets"
	"space/internal/store"
	"space/internal/usage"
	"space/internal/vmm"
	"space/internal/workerproto"
)

// Templates resolves a template name to the images a sandbox boots from.
type Templates interface {
	// Template returns the images of template name, or an error wrapping
	// errkind.NotFound.
	Template(ctx context.Context, name string) (*imagebuild.Artifacts, error)
}

// Config configures a Worker.
type Config struct {
	// ID names the worker; everything it creates on the host carries it.
	// Required; see store.ValidID.
	ID string
	// DataDir holds sandbox records, writable disk layers, snapshots and
	// warm templates. Required.
	DataDir string
	// ReflinkStorage says DataDir reflinks (see package storage): guest
	// memory files then live there too, next to the writable layers, so
	// a snapshot, a restore, a fork or a warm start shares their extents
	// instead of copying guest RAM. Without it memory stays on tmpfs.
	ReflinkStorage bool
	// StorageBacking is the directory on the host's file system holding
	// the image DataDir is mounted from (storage.Store.Backing), or ""
	// when DataDir is on the host's file system itself. A sparse image
	// grows only as far as that file system has room, so disk admission
	// counts the smaller of the two free spaces.
	StorageBacking string
	// RunRoot holds the VMs' run directories (sockets, memory files); it
	// belongs on tmpfs. "" = /dev/shm/space-<ID>.
	RunRoot string
	// Driver boots and recovers VMs. Required.
	Driver vmm.Driver
	// Templates resolves template names. Required.
	Templates Templates
	// Cgroups is the host's control group hierarchy, or nil to run VMMs
	// without limits (reported by Status).
	Cgroups *cgroup.Hierarchy
	// Chunks stores snapshots as chunk manifests, shared by the workers
	// that use the same store (a directory on one host, a bucket across
	// hosts): a snapshot one worker took, another can restore. Nil keeps
	// snapshots on this worker's disk only.
	Chunks *chunkstore.Store
	// ChunkStore names Chunks for the worker's capabilities
	// (workerproto.Capabilities.ChunkStore): "s3://BUCKET/PREFIX?endpoint=HOST"
	// for an S3 store, "local" for a directory of this host's; "" says
	// none. It needs Chunks.
	ChunkStore string
	// Fencing makes the worker take the leader's leases (fence.go,
	// Capabilities.Fencing), so that its sandboxes can be recovered on
	// other workers if it is lost, and run the fence watchdog
	// (watchdog.go). For standalone workers; a worker embedded in a
	// control plane shares its fate, takes no lease, and is never
	// recovered elsewhere.
	Fencing bool
	// VCPUs and MemoryMiB are the capacity offered to sandboxes; 0 =
	// a vCPU per 128 MiB of memory offered (at least four per host CPU),
	// and 80% of the host's RAM. VCPUs over the host's CPUs is the vCPU
	// overcommit. Running sandboxes count against MemoryMiB by their
	// measured memory (memory.go).
	VCPUs     int
	MemoryMiB int64
	// MemoryHeadroomMiB is added to a sandbox's measured memory for its
	// charge; 0 = 64 MiB.
	MemoryHeadroomMiB int64
	// MemoryReserveMiB is what the host must have available
	// (MemAvailable) for a sandbox to be admitted; 0 = 10% of its RAM.
	MemoryReserveMiB int64
	// DiskReserveMiB is what the worker's storage (the file system
	// holding DataDir) keeps free beyond the disks it promised to
	// sandboxes: a create is admitted only if its disk_mib (and, on
	// reflink storage, its memory file) fits into the free space after
	// what every sandbox may still write and after the reserve (see
	// disk.go). 0 = 10% of the storage's size, at most 8 GiB.
	DiskReserveMiB int64
	// ReclaimIdleAfter is how long a running sandbox goes without
	// data-plane requests before its guest gives the memory it only
	// caches back to the host (reclaim.go), once per idle spell; 0 = 2
	// minutes, negative = never.
	ReclaimIdleAfter time.Duration
	// BootTimeout bounds a boot until the agent answers; 0 = 2 minutes.
	BootTimeout time.Duration
	// AgentHeartbeat is how often the worker asks each running
	// sandbox's agent for its health; 0 = 5 s, negative = never (no
	// agent is then ever declared unresponsive). AgentTimeout is how
	// long an answer may take before the agent is declared unresponsive
	// (its calls then fail at once; see heartbeat.go); 0 = 15 s.
	AgentHeartbeat time.Duration
	AgentTimeout   time.Duration
	// CrashAt names a crash point (see CrashPoints) at which the process
	// kills itself; "" = never. For tests.
	CrashAt string
	// EgressResolve and EgressDial are how sandboxes' gateways resolve
	// names and open connections; nil = the host's resolver and a plain
	// dialer (see egress.Config).
	EgressResolve func(ctx context.Context, host string) ([]netip.Addr, error)
	EgressDial    func(ctx context.Context, network, addr string) (net.Conn, error)
	// EgressRoots verify upstream servers where a gateway speaks TLS
	// itself (to add secrets); nil = the host's roots.
	EgressRoots *x509.CertPool
	// EgressWildcardNames and EgressWildcardNamesPerMinute bound the
	// distinct names each sandbox's gateway answers under wildcard rules
	// (egress.Config.WildcardNames, WildcardNamesPerMinute); 0 = the
	// egress package's defaults (256, then 30 a minute).
	EgressWildcardNames          int
	EgressWildcardNamesPerMinute int
	// TapNICs gives sandboxes tap NICs, each in a network namespace of
	// its own with the gateway on the tap's host side, even when the
	// driver takes socket NICs. Drivers that take only taps (see
	// vmm.TapNICs: Firecracker) always get them.
	TapNICs bool
	// Secrets seals what the worker keeps of secrets (granted values,
	// sandboxes' CA keys) on its disk; nil = a key of the worker's own
	// in DataDir (secrets.key), made on first use.
	Secrets *secrets.Box
	// VMM describes Driver for the worker's capabilities (Status); the
	// zero value says nothing of it.
	VMM VMMInfo
	// Metrics is where New registers the worker's Prometheus metrics
	// (metrics.go); nil = they are kept but not exported.
	Metrics prometheus.Registerer
	// MetricsPerSandbox adds the families labelled by sandbox ID
	// (metrics.go: perSandboxCollector) to Metrics; false = none, so
	// the number of series does not grow with the sandboxes.
	MetricsPerSandbox bool
	// Log receives the worker's events; nil = discard.
	Log *slog.Logger
}

// VMMInfo describes a worker's VMM driver.
type VMMInfo struct {
	// Kind is "qemu" or "firecracker"; Version is the VMM's version;
	// Accel is "kvm" or "tcg". "" = unknown.
	Kind, Version, Accel string
	// DiffSnapshots says the driver writes diff snapshots
	// (vmm.SnapshotOptions.Diff) rather than full ones.
	DiffSnapshots bool
}

// validateSpec checks a spec of a create, a pool or a warm template.
func validateSpec(s Spec) error {
	switch {
	case s.Template == "":
		return fmt.Errorf("template is required: %w", errkind.InvalidArgument)
	case s.VCPUs < 1 || s.VCPUs > 64:
		return fmt.Errorf("vcpus %d out of range: %w", s.VCPUs, errkind.InvalidArgument)
	case s.MemoryMiB < 64 || s.MemoryMiB > 1<<20:
		return fmt.Errorf("memory_mib %d out of range: %w", s.MemoryMiB, errkind.InvalidArgument)
	case s.DiskMiB < 64 || s.DiskMiB > 1<<22:
		return fmt.Errorf("disk_mib %d out of range: %w", s.DiskMiB, errkind.InvalidArgument)
	}
	if s.Network != nil {
		if _, err := s.Network.Policy(); err != nil {
			return err
		}
	}
	return checkGrants(s)
}

// ErrExists is returned by Create for an ID the worker already has.
var ErrExists = fmt.Errorf("sandbox already exists: %w", errkind.Conflict)

// ErrNoCapacity is returned by Create when the worker's free capacity is
// too small for the spec.
var ErrNoCapacity = fmt.Errorf("worker has no capacity left: %w", errkind.ResourceExhausted)

// Worker runs sandboxes on this host.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	stop     chan struct{}  // closed by Close: watchers end
	watchers sync.WaitGroup // one per running VM
	admit    sync.Mutex     // serializes reserve's capacity check and insertion
	// lease serializes Lease calls: their removals and the epoch file.
	lease     sync.Mutex
	fenceKick chan struct{} // wakes the fence loop (see fence.go)
	metrics   *metrics

	mu sync.Mutex
	// +checklocks:mu
	sandboxes map[string]*sbx
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	pools    map[string]poolTarget // by shape key
	poolKick chan struct{}         // wakes the pool's refill
	// +checklocks:mu
	fencing bool // a lease was taken, or Start found an epoch: serve only while one holds
	// +checklocks:mu
	epoch int64 // the fencing epoch the worker knows (workerproto.LeaseRequest)
	// +checklocks:mu
	leaseUntil time.Time // when the latest lease runs out (monotonic clock); zero = none came
	// +checklocks:mu
	leaseHeld bool // the fence loop has not yet seen the latest lease run out (for its log)

	// hostAddrs are the host's own addresses, which no sandbox may
	// reach; set by Start before any gateway exists.
	hostAddrs *hostaddr.Set
}

// New validates cfg and returns a worker. Call Start before using it and
// Close when done.
func New(cfg Config) (*Worker, error) {
	if !store.ValidID(cfg.ID) || len(cfg.ID) > 32 {
		return nil, fmt.Errorf("worker id %q: 1-32 characters of [A-Za-z0-9_.-]: %w", cfg.ID, errkind.InvalidArgument)
	}
	if cfg.DataDir == "" || cfg.Driver == nil || cfg.Templates == nil {
		return nil, fmt.Errorf("worker: data dir, driver and templates are required: %w", errkind.InvalidArgument)
	}
	if cfg.EgressWildcardNames < 0 || cfg.EgressWildcardNamesPerMinute < 0 {
		return nil, fmt.Errorf("worker: egress wildcard name limits %d, %d per minute: not negative: %w",
			cfg.EgressWildcardNames, cfg.EgressWildcardNamesPerMinute, errkind.InvalidArgument)
	}
	if cfg.DiskReserveMiB < 0 {
		return nil, fmt.Errorf("worker: disk reserve %d MiB: not negative: %w", cfg.DiskReserveMiB, errkind.InvalidArgument)
	}
	if cfg.ChunkStore != "" && (cfg.Chunks == nil || cfg.ChunkStore != "local" && !strings.HasPrefix(cfg.ChunkStore, "s3://")) {
		return nil, fmt.Errorf("worker: chunk store %.80q: want local or s3://BUCKET/PREFIX?endpoint=HOST, with a chunk store: %w",
			cfg.ChunkStore, errkind.InvalidArgument)
	}
	if cfg.RunRoot == "" {
		cfg.RunRoot = filepath.Join("/dev/shm", "space-"+cfg.ID)
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = hostMemoryMiB() * 8 / 10
	}
	if cfg.VCPUs == 0 {
		cfg.VCPUs = defaultVCPUs(cfg.MemoryMiB)
	}
	if cfg.MemoryHeadroomMiB == 0 {
		cfg.MemoryHeadroomMiB = defaultHeadroomMiB
	}
	if cfg.MemoryReserveMiB == 0 {
		cfg.MemoryReserveMiB = hostMemoryMiB() / 10
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 2 * time.Minute
	}
	if cfg.ReclaimIdleAfter == 0 {
		cfg.ReclaimIdleAfter = defaultReclaimIdleAfter
	}
	if cfg.AgentHeartbeat == 0 {
		cfg.AgentHeartbeat = defaultAgentHeartbeat
	}
	if cfg.AgentTimeout <= 0 {
		cfg.AgentTimeout = defaultAgentTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Secrets == nil {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		box, err := secrets.LoadOrCreateKey(filepath.Join(cfg.DataDir, "secrets.key"))
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		cfg.Secrets = box
	}
	w := &Worker{
		cfg:       cfg,
		log:       cfg.Log.With("component", "worker", "worker_id", cfg.ID),
		sandboxes: make(map[string]*sbx),
		stop:      make(chan struct{}),
		pools:     make(map[string]poolTarget),
		poolKick:  make(chan struct{}, 1),
		fenceKick: make(chan struct{}, 1),
	}
	reg := cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	var err error
	if w.metrics, err = w.newMetrics(reg); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return w, nil
}

// ID returns the worker's ID.
func (w *Worker) ID() string { return w.cfg.ID }

func hostMemoryMiB() int64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 4096
	}
	return int64(si.Totalram) * int64(si.Unit) >> 20
}

func (w *Worker) sandboxesDir() string { return filepath.Join(w.cfg.DataDir, "sandboxes") }

// cgroupParent is the control group that holds this worker's sandboxes.
func (w *Worker) cgroupParent() string { return "space-" + w.cfg.ID }

// Status reports the worker's protocol version, capabilities, capacity
// and use. Pool members do not count as used: a create that needs their
// room evicts them. It does not fail.
func (w *Worker) Status(context.Context) (Status, error) { return w.status(false), nil }

// capabilities is what the worker reports it can do.
func (w *Worker) capabilities() Capabilities {
	c := Capabilities{
		VMM: w.cfg.VMM.Kind, VMMVersion: w.cfg.VMM.Version, Accel: w.cfg.VMM.Accel,
		ChunkedSnapshots: w.cfg.Chunks != nil, NICs: []string{workerproto.NICSocket},
		ChunkStore: w.cfg.ChunkStore, Fencing: w.cfg.Fencing,
	}
	if _, ok := w.cfg.Driver.(vmm.Restorer); ok {
		c.Snapshots = true
		// Diff snapshots merge onto the previous snapshot's memory, which
		// only reflink storage keeps next to the VM's (see Snapshot).
		c.DiffSnapshots = w.cfg.VMM.DiffSnapshots && w.cfg.ReflinkStorage
	}
	if _, tap := w.tapNICs(); tap {
		c.NICs = []string{workerproto.NICTap}
	}
	return c
}

// status is Status; withPool counts pool members as used, which Status
// does not: a create that needs their room evicts them.
func (w *Worker) status(withPool bool) Status {
	st := Status{ID: w.cfg.ID, Protocol: workerproto.Version, Capabilities: w.capabilities(),
		VCPUs: w.cfg.VCPUs, MemoryMiB: w.cfg.MemoryMiB, Cgroups: "off", Leased: w.leased()}
	if w.cfg.Cgroups != nil {
		st.Cgroups = fmt.Sprintf("v%d", w.cfg.Cgroups.Version())
	}
	if d, err := w.disk(nil, withPool); err == nil {
		st.DiskMiB, st.FreeDiskMiB = d.capacity()>>20, d.room()>>20
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.sandboxes {
		s.mu.Lock()
		if s.rec.State != sandbox.Failed && s.rec.State != sandbox.Deleted && (withPool || s.rec.Pool == "") {
			st.Sandboxes++
			st.UsedVCPUs += s.rec.Spec.VCPUs
			st.UsedMemoryMiB += s.chargeMiBLocked(w.cfg.MemoryHeadroomMiB)
		}
		s.mu.Unlock()
	}
	return st
}

// List returns every sandbox the worker has, ordered by ID. It does not
// fail.
func (w *Worker) List(context.Context) ([]Info, error) {
	all := w.all()
	infos := make([]Info, 0, len(all))
	for _, s := range all {
		s.mu.Lock()
		internal := s.rec.Internal
		s.mu.Unlock()
		if !internal {
			infos = append(infos, s.info())
		}
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].ID < infos[j].ID })
	return infos, nil
}

// ErrNotFound is returned for a sandbox the worker does not have.
var ErrNotFound = fmt.Errorf("sandbox not found on this worker: %w", errkind.NotFound)

// Sandbox returns the info of sandbox id, or ErrNotFound.
func (w *Worker) Sandbox(_ context.Context, id string) (Info, error) {
	s, err := w.get(id)
	if err != nil {
		return Info{}, err
	}
	return s.info(), nil
}

func (w *Worker) get(id string) (*sbx, error) {
	w.mu.Lock()
	s, ok := w.sandboxes[id]
	w.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	return s, nil
}

// Close detaches from every VM and leaves it running: a worker that
// starts again with the same ID and data dir re-adopts them. It is
// idempotent.
func (w *Worker) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	all := make([]*sbx, 0, len(w.sandboxes))
	for _, s := range w.sandboxes {
		all = append(all, s)
	}
	w.mu.Unlock()
	close(w.stop)
	w.watchers.Wait()
	var errs []error
	for _, s := range all {
		s.op.Lock()
		errs = append(errs, s.detach())
		s.op.Unlock()
		s.saveUsage(w)
	}
	if len(all) == 0 {
		w.removeEmptyCgroupParent()
		// Only if empty: a worker that ends with no sandbox leaves no run
		// root behind either (Start makes it again).
		os.Remove(w.cfg.RunRoot)
	}
	return errors.Join(errs...)
}

// removeEmptyCgroupParent removes this worker's parent control group when
// nothing runs in it, so that a worker that ends with no sandbox leaves no
// group behind. A VMM still in it keeps it (Remove refuses a populated
// group), and a group left is harmless: the next start reuses it.
func (w *Worker) removeEmptyCgroupParent() {
	if w.cfg.Cgroups == nil {
		return
	}
	g, err := w.cfg.Cgroups.Open(w.cgroupParent())
	if err != nil {
		return
	}
	if err := g.Remove(); err != nil {
		w.log.Info("control group kept", "cgroup", g.Name(), "reason", err)
	}
}

// sbx is one sandbox on this worker.
type sbx struct {
	dir    string // DataDir/sandboxes/<id>: record and disk
	runDir string // RunRoot/<id>: the VM's run files

	op sync.Mutex // held across a lifecycle operation; see the package doc
	// vcpus is held across pausing or resuming the VM's vCPUs (by Pause,
	// Resume or the fence), so that the fence and the sandbox's user
	// never undo each other; it guards fenced.
	vcpus sync.Mutex
	// +checklocks:vcpus
	fenced bool // the fence paused the VM while its record says running: a lease resumes it
	// fencedNow is fenced, for the heartbeat, which must not wait for
	// vcpus; vmStops counts the pauses, resumes and snapshots under way
	// and vmEpoch changes whenever one starts or ends (stopVM).
	fencedNow atomic.Bool
	vmStops   atomic.Int32
	vmEpoch   atomic.Uint64

	mu sync.Mutex
	// +checklocks:mu
	rec record
	// +checklocks:mu
	vm vmm.VM // or nil when no VM runs
	// +checklocks:mu
	agent *client.Client // or nil until connected; replaced when its session ends
	// +checklocks:mu
	failure string
	// +checklocks:mu
	agentDown error // why the agent was declared unresponsive, or nil (heartbeat.go)
	// +checklocks:mu
	gw *egress.Gateway // the NIC's far end, or nil (no network, or not attached)
	// +checklocks:mu
	audit *auditFile // gw's audit file
	// +checklocks:mu
	lastActive time.Time // see Info.LastActive
	// +checklocks:mu
	active int // data-plane requests in progress
	// +checklocks:mu
	lastExec *workerproto.ExecRecord // see Info.LastExec
	// usage is the sandbox's usage history, sampled by the heartbeat
	// (heartbeat.go); it has its own lock.
	usage usage.History
	// +checklocks:mu
	pss int64 // bytes the VMM process held when last measured; 0 = not yet (memory.go)
	// +checklocks:mu
	reclaimed time.Time // when the guest last gave cached memory back (reclaim.go)
	// +checklocks:mu
	noReclaim *client.Client // an agent that cannot reclaim (built before the op)
}

// execEnded records an attached command that ran from started until now.
func (s *sbx) execEnded(req api.Exec, started time.Time) {
	cmd := req.Shell
	if len(req.Command) > 0 {
		cmd = strings.Join(req.Command, " ")
	}
	if len(cmd) > workerproto.MaxExecCommand {
		cmd = cmd[:workerproto.MaxExecCommand]
	}
	rec := &workerproto.ExecRecord{Command: strings.ToValidUTF8(cmd, "?"), Started: started, Ended: time.Now()}
	s.mu.Lock()
	s.lastExec = rec
	s.mu.Unlock()
}

// use records a data-plane request to the sandbox; call the result when
// it ends.
func (s *sbx) use(now func() time.Time) func() {
	s.mu.Lock()
	s.active++
	s.lastActive = now()
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.active--
		s.lastActive = now()
		s.mu.Unlock()
	}
}

// internal reports whether the sandbox is the worker's own (record.Internal).
func (s *sbx) internal() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.Internal
}

func (s *sbx) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	inf := Info{ID: s.rec.ID, Team: s.rec.Team, State: s.rec.State, Spec: s.rec.Spec, Error: s.failure,
		LastActive: s.lastActive, Active: s.active, LastExec: s.lastExec, Agent: s.agentStateLocked()}
	if s.rec.VM != nil {
		vm := *s.rec.VM
		vm.PSSMiB = s.pss >> 20
		inf.VM = &vm
	}
	return inf
}

// detach lets go of the VM and agent without stopping the VM. Its
// gateway goes; the next worker attaches another.
func (s *sbx) detach() error {
	s.closeGateway()
	s.mu.Lock()
	vm, agent := s.vm, s.agent
	s.vm, s.agent = nil, nil
	s.mu.Unlock()
	if agent != nil {
		agent.Close()
	}
	if d, ok := vm.(vmm.Detacher); ok {
		return d.Detach()
	}
	return nil
}

// diskDir holds the sandbox's writable layer.
func (s *sbx) diskDir() string { return filepath.Join(s.dir, "disk") }

// removeFiles removes the sandbox's run and data directories.
func (s *sbx) removeFiles() error {
	return errors.Join(os.RemoveAll(s.runDir), os.RemoveAll(s.dir))
}

// guestConfig is the guestvm configuration of a sandbox.
func (w *Worker) guestConfig(s *sbx, spec Spec, img *imagebuild.Artifacts) guestvm.Config {
	return guestvm.Config{
		Images:    img,
		Driver:    w.cfg.Driver,
		RunDir:    s.runDir,
		DataDir:   s.diskDir(),
		VCPUs:     spec.VCPUs,
		MemoryMiB: int(spec.MemoryMiB),
		DiskMiB:   spec.DiskMiB,
		Hostname:  Hostname(s.id()),
		// On reflink storage the memory file lives with the disk.
		MemoryInDataDir: w.cfg.ReflinkStorage,
	}
}

// watch marks the sandbox failed if its VM exits on its own (a crash, an
// OOM kill in its cgroup), rather than through Delete.
func (w *Worker) watch(s *sbx, vm vmm.VM) {
	w.heartbeat(s, vm)
	w.watchers.Add(1)
	go func() {
		defer w.watchers.Done()
		select {
		case <-vm.Done():
		case <-w.stop:
			return
		}
		s.op.Lock()
		defer s.op.Unlock()
		s.mu.Lock()
		current, state, id := s.vm, s.rec.State, s.rec.ID
		s.mu.Unlock()
		if current != vm || (state != sandbox.Running && state != sandbox.Paused) {
			return // deleted, or being torn down on purpose
		}
		w.log.Warn("sandbox vm exited on its own", "sandbox_id", id)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		vm.Stop(ctx) // releases the driver's side; the process is gone
		if err := w.fail(ctx, s, "vm exited unexpectedly"+consoleHint(vm)); err != nil {
			w.log.Error("mark sandbox failed", "sandbox_id", id, "err", err)
		}
	}()
}

// consoleHint is the end of a VM's console output, if the driver keeps
// it, for a failure message.
func consoleHint(vm vmm.VM) string {
	sl, ok := vm.(interface{ SerialLog() ([]byte, error) })
	if !ok {
		return ""
	}
	b, err := sl.SerialLog()
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return "; console ends: " + string(b)
}

// Hostname is the guest hostname of sandbox id: the ID with '-' for '_'
// (hostnames allow no '_'), so every sandbox, fork and restore included,
// knows its own name.
func Hostname(id string) string { return strings.ReplaceAll(id, "_", "-") }
