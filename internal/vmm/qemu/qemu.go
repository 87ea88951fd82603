package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"space/internal/errkind"
	"space/internal/jail"
	"space/internal/qmp"
	"space/internal/reflink"
)

// errExitedDuringBoot cancels Boot's dealings with QEMU when it exits.
var errExitedDuringBoot = errors.New("qemu exited during boot")

// Config configures a Driver.
type Config struct {
	// Binary is the QEMU executable, a path or a name looked up on PATH;
	// "" means qemu-system-x86_64.
	Binary string
	// Log receives the driver's log lines; nil discards them.
	Log *slog.Logger
	// StopGrace is how long Stop waits for QEMU to exit after the QMP quit
	// command before it kills QEMU; 0 means 5s.
	StopGrace time.Duration
	// Accel forces the accelerator of Boot: "kvm" or "tcg"; "" means probe
	// (see Driver.Accel).
	Accel string
	// AccelCache is a file remembering KVM probe results across processes;
	// "" means probe once per Driver.
	AccelCache string
	// NoVsock keeps the agent on virtio-serial even where the host has
	// vhost-vsock (which Boot otherwise prefers).
	NoVsock bool
	// TCGGuestASLR keeps address-space randomization in guests booted
	// under TCG. By default Boot turns it off there (norandmaps): TCG
	// keys its translated code by virtual address, so with ASLR every new
	// process translates its libraries afresh, and a spawn in the guest
	// costs about 40 ms instead of 9 (measured on a 2-core host with
	// /bin/true). Guests under KVM keep ASLR whatever this says; the VM,
	// not ASLR, is the wall between a sandbox and the host.
	TCGGuestASLR bool
	// User runs QEMU as this user instead of the caller's; setting it
	// needs root. QEMU then gets every file as an inherited descriptor
	// (so it needs no access to the directories), and the per-VM files
	// it writes (the memory file, writable disks) are chowned to the
	// user. nil = DefaultUID:DefaultGID when the caller is root, else
	// the caller's own user.
	User *User
	// Jail says whether QEMU runs in a jail of its own (see the package
	// doc); JailAuto (the zero value) jails it where the host can, which
	// needs root.
	Jail JailMode
}

// User is a numeric user and group.
type User struct {
	UID, GID uint32
}

// Driver boots VMs with one QEMU binary. It is safe for concurrent use.
type Driver struct {
	bin        string
	jailBin    string // bin with symlinks resolved: what a jail execs
	log        *slog.Logger
	stopGrace  time.Duration
	accel      string // forced by Config, or ""
	accelCache string
	user       *User // or nil to run as the caller
	noVsock    bool
	tcgASLR    bool
	jailMode   JailMode

	mu sync.Mutex
	// +checklocks:mu
	sandbox sandboxSupport // probed by the first Boot
	// +checklocks:mu
	probed map[string]string // probe key -> accelerator
	// +checklocks:mu
	jail jailSupport // probed by the first Boot
	// +checklocks:mu
	jailWhy string // why jail is jailOff
}

type jailSupport int

const (
	jailUnknown jailSupport = iota
	jailOn
	jailOff
)

type sandboxSupport int

const (
	sandboxUnknown sandboxSupport = iota
	sandboxOn
	sandboxOff
)

// New returns a Driver for cfg. It resolves the binary but starts nothing;
// a missing binary is an errkind.FailedPrecondition error.
func New(cfg Config) (*Driver, error) {
	bin := cfg.Binary
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("qemu binary: %w: %w", err, errkind.FailedPrecondition)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	grace := cfg.StopGrace
	if grace == 0 {
		grace = 5 * time.Second
	}
	if cfg.User != nil && os.Geteuid() != 0 {
		return nil, fmt.Errorf("qemu: running qemu as uid %d needs root: %w", cfg.User.UID, errkind.FailedPrecondition)
	}
	switch cfg.Accel {
	case "", "kvm", "tcg":
	default:
		return nil, fmt.Errorf("qemu accel %q, want kvm, tcg or empty: %w", cfg.Accel, errkind.InvalidArgument)
	}
	switch cfg.Jail {
	case JailAuto, JailOff:
	case JailRequire:
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("qemu: a jail needs root: %w", errkind.FailedPrecondition)
		}
	default:
		return nil, fmt.Errorf("qemu jail %q, want require, off or empty: %w", cfg.Jail, errkind.InvalidArgument)
	}
	user := cfg.User
	if user == nil && os.Geteuid() == 0 {
		user = &User{UID: DefaultUID, GID: DefaultGID}
	}
	jailBin, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("qemu binary: %w: %w", err, errkind.FailedPrecondition)
	}
	if jailBin, err = filepath.Abs(jailBin); err != nil {
		return nil, fmt.Errorf("qemu binary: %w: %w", err, errkind.FailedPrecondition)
	}
	return &Driver{bin: path, jailBin: jailBin, log: log.With("component", "qemu"), stopGrace: grace,
		accel: cfg.Accel, accelCache: cfg.AccelCache, user: user, noVsock: cfg.NoVsock, tcgASLR: cfg.TCGGuestASLR, jailMode: cfg.Jail, probed: map[string]string{}}, nil
}

// Start is New(cfg) followed by Start(ctx, spec), for callers that boot one
// VM. A long-lived caller should keep a Driver, which probes QEMU only once.
func Start(ctx context.Context, cfg Config, spec Spec) (*VM, error) {
	d, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return d.Start(ctx, spec)
}

// Start starts QEMU for spec and returns once QMP is connected and the
// console attached; it does not wait for the guest. An invalid spec is an
// errkind.InvalidArgument error and a spec whose Dir already holds a memory
// file an errkind.Conflict error. If QEMU exits during Boot the error holds
// the end of its stderr. On error nothing keeps running and only the logs
// remain in Dir. The caller must Stop the returned VM.
func (d *Driver) Start(ctx context.Context, spec Spec) (_ *VM, err error) {
	start := time.Now()
	spec, err = spec.normalize()
	if err != nil {
		return nil, err
	}
	sandbox, err := d.sandboxSupported(ctx)
	if err != nil {
		return nil, err
	}

	var undo undoStack
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("boot vm in %s: %w", spec.Dir, err), undo.run())
		}
	}()

	if err := makePrivateDir(spec.Dir); err != nil {
		return nil, err
	}
	jailed, noJail, err := d.jailSupported(ctx, spec.Dir)
	if err != nil {
		return nil, err
	}
	if spec.Accel == "kvm" && d.user != nil {
		if err := checkKVMAccess(*d.user); err != nil {
			return nil, err
		}
	}
	if spec.MemoryFrom != "" {
		if err := adoptMemory(ctx, spec.MemoryFrom, spec.memoryPath(), spec.MoveMemory); err != nil {
			return nil, err
		}
	} else if err := createMemory(spec.memoryPath(), int64(spec.MemoryMiB)<<20); err != nil {
		return nil, err
	}
	undo.push(func() error { return removeIfExists(spec.memoryPath()) })

	var listeners []*os.File // in ExtraFiles order: qmpFD, serialFD, agentFD
	closeListeners := func() {
		// Only QEMU may hold them once it runs: were we to keep a copy, a
		// connection to a QEMU that died would wait forever in the backlog.
		for _, f := range listeners {
			f.Close()
		}
		listeners = nil
	}
	defer closeListeners()
	for _, name := range []string{qmpSocket, serialSocket, agentSocket} {
		f, err := listen(spec.path(name))
		if err != nil {
			return nil, err
		}
		undo.push(func() error { return removeIfExists(spec.path(name)) })
		listeners = append(listeners, f)
	}

	serialOut, err := createLog(spec.path(serialLog), spec.SerialLogLimit)
	if err != nil {
		return nil, err
	}
	undo.push(serialOut.Close)
	stderr, err := createLog(spec.path(stderrLog), stderrLogLimit)
	if err != nil {
		return nil, err
	}
	undo.push(stderr.Close)

	extra := append([]*os.File(nil), listeners...)
	switch {
	case spec.NIC != nil && spec.NIC.Tap != nil:
		extra = append(extra, spec.NIC.Tap) // nicFD
	case spec.NIC != nil:
		f, err := listen(spec.NIC.Socket)
		if err != nil {
			return nil, fmt.Errorf("nic socket: %w", err)
		}
		undo.push(func() error { return removeIfExists(spec.NIC.Socket) })
		listeners = append(listeners, f) // closed with the others once QEMU runs
		extra = append(extra, f)         // nicFD
	}
	if spec.Vsock != nil {
		extra = append(extra, spec.Vsock.FD) // spec.vsockFD()
	}
	var paths map[string]string
	var cred *syscall.Credential
	if d.user != nil {
		files, p, err := d.userFiles(spec, 3+len(extra))
		if err != nil {
			return nil, err
		}
		defer func() {
			for _, f := range files {
				f.Close()
			}
		}()
		extra, paths = append(extra, files...), p
		cred = &syscall.Credential{Uid: d.user.UID, Gid: d.user.GID, Groups: kvmGroup(spec.Accel)}
	}
	args := spec.argsWith(sandbox == sandboxOn, paths)
	var cmd *exec.Cmd
	if jailed {
		// The jail sets the user itself. Its root is mounted on the run
		// dir, in the jail's mount namespace only.
		if cmd, err = jail.Command(d.jailConfig(spec), d.jailBin, args...); err != nil {
			return nil, err
		}
		cmd.Dir = "/"
	} else {
		cmd = exec.Command(d.bin, args...)
		cmd.Dir = spec.Dir
		if cred != nil {
			cmd.Dir = "/" // the run dir stays private to us
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Env = []string{} // nothing from our environment
	cmd.Stderr = stderr
	cmd.ExtraFiles = extra
	// Own process group, and deliberately no Pdeathsig: VMs must survive a
	// restart of this process.
	cmd.SysProcAttr.Setpgid = true
	cmd.WaitDelay = 5 * time.Second
	placed := func(int) error { return nil }
	if spec.Placer != nil {
		after, release, err := spec.Placer.Place(cmd)
		if err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		defer release()
		placed = after
	}
	started := time.Now()
	err = cmd.Start()
	closeListeners()
	if err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	if err := placed(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	p, startTime, err := openProcess(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	undo.push(p.Close)
	v := &VM{
		log:        d.log.With("vm_pid", cmd.Process.Pid, "dir", spec.Dir),
		spec:       spec,
		cmd:        cmd,
		proc:       p,
		startTime:  startTime,
		accel:      spec.Accel,
		stopGrace:  d.stopGrace,
		serialOut:  serialOut,
		stderr:     stderr,
		done:       make(chan struct{}),
		serialDone: make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	go v.reap()
	undo.push(v.kill)

	// Talking to QEMU stops as soon as it exits.
	qctx, cancel := context.WithCancelCause(ctx)
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case <-v.done:
			cancel(errExitedDuringBoot)
		case <-qctx.Done():
		}
	})
	defer func() {
		cancel(nil)
		watch.Wait()
	}()

	v.qmp, err = qmp.Dial(qctx, spec.path(qmpSocket))
	if err != nil {
		return nil, v.explain(ctx, err)
	}
	undo.push(v.qmp.Close)
	v.version = v.qmp.Version().String()
	qmpReady := time.Since(started)

	// QEMU has applied its seccomp filter before it serves QMP.
	if v.confinement, err = observeConfinement(v.Pid(), missingConfinement(noJail, sandbox)); err != nil {
		return nil, v.explain(ctx, err)
	}
	if jailed {
		if err := checkJailed(v.confinement, *d.user, sandbox == sandboxOn); err != nil {
			return nil, err
		}
	}

	if err := v.attachSerial(qctx); err != nil {
		return nil, v.explain(ctx, err)
	}
	undo.push(v.detachSerial)
	if err := v.waitSerialAccepted(qctx); err != nil {
		return nil, v.explain(ctx, err)
	}

	if !spec.Paused {
		if err := v.qmp.Execute(qctx, "cont", nil, nil); err != nil {
			return nil, v.explain(ctx, err)
		}
	}
	v.log.Info("vm started", "qmp_ready", qmpReady, "boot_total", time.Since(start), "paused", spec.Paused, "confinement", v.confinement)
	return v, nil
}

// missingConfinement describes what a VM lacks: "" for nothing.
func missingConfinement(noJail string, sandbox sandboxSupport) string {
	var m []string
	if noJail != "" {
		m = append(m, "jail: "+noJail)
	}
	if sandbox != sandboxOn {
		m = append(m, "seccomp: this qemu has no -sandbox support")
	}
	return strings.Join(m, "; ")
}

// sandboxSupported reports whether QEMU accepts our -sandbox options
// (QEMU built without libseccomp does not). The answer is probed once.
func (d *Driver) sandboxSupported(ctx context.Context) (sandboxSupport, error) {
	d.mu.Lock()
	s := d.sandbox
	d.mu.Unlock()
	if s != sandboxUnknown {
		return s, nil
	}

	// -version exits right after option parsing, which rejects -sandbox
	// when seccomp support is missing and checks the sub-options.
	cmd := exec.CommandContext(ctx, d.bin, "-sandbox", sandboxArg, "-version")
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		s = sandboxOn
	case errors.As(err, &exitErr) && ctx.Err() == nil:
		s = sandboxOff
	default:
		return sandboxUnknown, fmt.Errorf("probe qemu -sandbox: %w", err)
	}

	d.mu.Lock()
	first := d.sandbox == sandboxUnknown
	d.sandbox = s
	d.mu.Unlock()
	if first && s == sandboxOff {
		d.log.Warn("qemu runs without seccomp sandbox", "binary", d.bin, "qemu_output", strings.TrimSpace(string(out)))
	}
	return s, nil
}

func makePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	// MkdirAll leaves an existing directory's mode alone.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	return nil
}

// createMemory creates the sparse guest RAM file. An existing file may
// back a snapshot that clones still map, so it is never reused.
func createMemory(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("memory file %s exists (another VM, or one not stopped): %w", path, errkind.Conflict)
	}
	if err != nil {
		return fmt.Errorf("create memory file: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errors.Join(fmt.Errorf("size memory file: %w", err), os.Remove(path))
	}
	return nil
}

// adoptMemory gives a restored VM its own copy of a snapshot's memory
// file, or the file itself if move is set and the rename works.
func adoptMemory(ctx context.Context, from, path string, move bool) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("memory file %s exists (another VM, or one not stopped): %w", path, errkind.Conflict)
	}
	if err := place(ctx, from, path, move); err != nil {
		return fmt.Errorf("memory file: %w", err)
	}
	return os.Chmod(path, 0o600)
}

// place puts a snapshot's file from at path: moved there (reflink.Move)
// if move is set, else copied (reflinked where possible).
func place(ctx context.Context, from, path string, move bool) error {
	if move {
		return reflink.Move(ctx, from, path)
	}
	_, err := reflink.CopyVolatile(ctx, from, path)
	return err
}

// listen binds a unix socket at path (replacing a stale one), restricts it
// to mode 0600 and returns the listening descriptor for QEMU.
func listen(path string) (*os.File, error) {
	if err := removeIfExists(path); err != nil {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		return nil, errors.Join(fmt.Errorf("listen %s: %w", path, err), removeIfExists(path))
	}
	return f, nil
}

func createLog(path string, limit int64) (*cappedFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create log: %w", err)
	}
	return newCappedFile(f, limit), nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// undoStack collects teardown steps of a partly done Boot; run executes
// them last first and joins their errors.
type undoStack []func() error

func (u *undoStack) push(f func() error) { *u = append(*u, f) }

func (u *undoStack) run() error {
	var errs []error
	for i := len(*u) - 1; i >= 0; i-- {
		errs = append(errs, (*u)[i]())
	}
	*u = nil
	return errors.Join(errs...)
}

// userFiles opens the files QEMU needs for a spec when it runs as d.user:
// the kernel, initrd and read-only disks for reading, the memory file and
// writable disks for writing (chowned to the user, since reopening
// /proc/self/fd/N checks the file's own permissions). first is the
// descriptor number the first file gets in QEMU.
func (d *Driver) userFiles(spec Spec, first int) (files []*os.File, paths map[string]string, err error) {
	paths = map[string]string{}
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			files, paths = nil, nil
		}
	}()
	add := func(path string, write bool) error {
		if _, ok := paths[path]; ok || path == "" {
			return nil
		}
		flag := os.O_RDONLY
		if write {
			if err := os.Chown(path, int(d.user.UID), int(d.user.GID)); err != nil {
				return fmt.Errorf("give %s to the qemu user: %w", path, err)
			}
			flag = os.O_RDWR
		}
		f, err := os.OpenFile(path, flag, 0)
		if err != nil {
			return err
		}
		paths[path] = "/proc/self/fd/" + strconv.Itoa(first+len(files))
		files = append(files, f)
		return nil
	}
	if err := add(spec.Kernel, false); err != nil {
		return nil, nil, err
	}
	if err := add(spec.Initrd, false); err != nil {
		return nil, nil, err
	}
	for _, disk := range spec.Disks {
		if err := add(disk.Path, !disk.ReadOnly); err != nil {
			return nil, nil, err
		}
	}
	if err := add(spec.memoryPath(), true); err != nil {
		return nil, nil, err
	}
	return files, paths, nil
}

// kvmGroup returns the group of /dev/kvm when QEMU needs it (never the
// root group, which would open far more than /dev/kvm).
func kvmGroup(accel string) []uint32 {
	if accel != "kvm" {
		return []uint32{}
	}
	var st syscall.Stat_t
	if syscall.Stat("/dev/kvm", &st) != nil || st.Gid == 0 {
		return []uint32{}
	}
	return []uint32{st.Gid}
}

// checkKVMAccess returns an errkind.FailedPrecondition error if QEMU,
// running as u with kvmGroup's groups, cannot open /dev/kvm: the accel
// probe ran as the caller, so a boot would otherwise fail inside QEMU.
func checkKVMAccess(u User) error {
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/kvm", &st); err != nil {
		return fmt.Errorf("kvm: /dev/kvm: %w: %w", err, errkind.FailedPrecondition)
	}
	if !canReadWrite(st.Mode, st.Uid, st.Gid, u, kvmGroup("kvm")) {
		return fmt.Errorf("kvm: /dev/kvm (mode %04o, %d:%d) is not open to qemu's user %d:%d; give it to a kvm group (mode 0660): %w",
			st.Mode&0o7777, st.Uid, st.Gid, u.UID, u.GID, errkind.FailedPrecondition)
	}
	return nil
}

// canReadWrite reports whether user u (with supplementary groups) may
// read and write a file of the given mode and owner.
func canReadWrite(mode, uid, gid uint32, u User, groups []uint32) bool {
	switch {
	case u.UID == 0:
		return true
	case uid == u.UID:
		return mode&0o600 == 0o600
	case gid == u.GID || slices.Contains(groups, gid):
		return mode&0o060 == 0o060
	}
	return mode&0o006 == 0o006
}
