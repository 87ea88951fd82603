package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"space/internal/errkind"
	"space/internal/jail"
	"space/internal/proc"
	"space/internal/vmm"
)

// Name is the driver's name in handles and snapshots.
const Name = "fake"

// Version is the fake's version: a snapshot of another version is
// vmm.ErrIncompatible.
const Version = "1"

// Accel is what Handle.Accel says: no hardware, no emulation.
const Accel = "none"

// DefaultUID and DefaultGID are the user a guest runs as when Config
// leaves them 0 (not QEMU's, so a fake guest cannot signal a jailed QEMU).
const (
	DefaultUID = 2_000_000_100
	DefaultGID = 2_000_000_100
)

// ErrNeedsRoot is returned by Boot and Restore when this process is not
// root: the fake never runs a guest outside a jail.
var ErrNeedsRoot = fmt.Errorf("the fake vmm needs root to jail its guest: %w", errkind.FailedPrecondition)

// Files in a run dir.
const (
	agentSocket = "agent.sock"
	logFile     = "fake.log" // the guest's stdout and stderr; Stop keeps it
	guestSubdir = "guest"    // the writable dirs of a guest without a writable disk
)

// guestDirs are the guest's writable directories, under its guest dir and
// at /<name> in its root.
var guestDirs = []string{"tmp", "root", "home", "work"}

// The guest's /etc is the host's seen through an overlay whose upper
// layer is the guest dir's etc: the guest writes (as its own user, so only
// in the directories it owns there) without changing the host's.
const (
	etcUpper = "etc"
	etcWork  = ".etc-work"
)

// etcOwned are the directories of /etc the guest's user owns in the
// upper layer, hence may write in: where the worker puts the sandbox's
// CA and secrets placeholders.
var etcOwned = []string{"space", "ssl/certs"}

// The guest's root: the host's system, read-only, and a few devices.
var (
	jailReadOnly = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}
	jailDevices  = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}
)

// childPath is where the guest's root holds this binary.
const childPath = "/.space/" + childName

// Config configures a Driver.
type Config struct {
	// UID and GID are the user guests run as; 0 = DefaultUID, DefaultGID.
	UID, GID uint32
	// Faults are failures injected from the start (see SetFault); nil =
	// none.
	Faults map[Point]Fault
	// Log receives the driver's events; nil = discard.
	Log *slog.Logger
}

// Driver boots fake guests (vmm.Driver, vmm.Restorer). It is safe for
// concurrent use.
type Driver struct {
	log *slog.Logger
	uid uint32
	gid uint32
	exe string // this binary, bound into each guest's root
	// euid is os.Geteuid; tests play a user.
	euid func() int

	mu sync.Mutex
	// +checklocks:mu
	faults map[Point]Fault
}

var (
	_ vmm.Driver      = (*Driver)(nil)
	_ vmm.Restorer    = (*Driver)(nil)
	_ vmm.VM          = (*VM)(nil)
	_ vmm.Detacher    = (*VM)(nil)
	_ vmm.Pauser      = (*VM)(nil)
	_ vmm.Snapshotter = (*VM)(nil)
)

// New validates cfg and returns a Driver. It checks nothing of the host:
// Boot says what is missing.
func New(cfg Config) (*Driver, error) {
	if cfg.UID == 0 {
		cfg.UID = DefaultUID
	}
	if cfg.GID == 0 {
		cfg.GID = DefaultGID
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("fake vmm: find this binary: %w", err)
	}
	d := &Driver{log: cfg.Log.With("component", "vmm-fake"), uid: cfg.UID, gid: cfg.GID, exe: exe, euid: os.Geteuid, faults: map[Point]Fault{}}
	for p, f := range cfg.Faults {
		if err := d.SetFault(p, f); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// state is Handle.State: what Recover needs beyond the handle's fields.
type state struct {
	GuestDir string `json:"guest_dir"`
	// OwnGuestDir is set when the guest dir is in the run dir (no
	// writable disk): Stop removes it then.
	OwnGuestDir bool `json:"own_guest_dir,omitempty"`
	Disks       int  `json:"disks"`
	// NICSocket is the socket the guest serves Spec.NIC.Socket on, or "".
	NICSocket string `json:"nic_socket,omitempty"`
}

// guestDir is where spec's guest keeps its writable dirs: next to its
// first writable disk (the sandbox's disk: it lives as long as the disk),
// else in the run dir.
func guestDir(spec vmm.Spec) (dir string, own bool) {
	for _, d := range spec.Disks {
		if !d.ReadOnly {
			return d.Path + ".fake", false
		}
	}
	return filepath.Join(spec.RunDir, guestSubdir), true
}

// Boot starts a guest for spec (vmm.Driver). Only RunDir, Disks (the
// first writable one places the guest's dirs) and Placer matter.
func (d *Driver) Boot(ctx context.Context, spec vmm.Spec) (vmm.VM, error) {
	if err := d.fault(ctx, PointBoot); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := d.checkSpec(spec); err != nil {
		return nil, err
	}
	dir, own := guestDir(spec)
	if err := d.makeGuestDirs(dir); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	return d.start(ctx, spec, state{GuestDir: dir, OwnGuestDir: own, Disks: len(spec.Disks)})
}

// listen listens on the unix socket path (replacing a stale one) and
// returns the listener as a file for the guest to inherit.
func listen(path string) (*os.File, error) {
	if err := removeIfExists(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	ln.Close()
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return f, nil
}

func (d *Driver) checkSpec(spec vmm.Spec) error {
	if d.euid() != 0 {
		return ErrNeedsRoot
	}
	if spec.RunDir == "" || !filepath.IsAbs(spec.RunDir) {
		return fmt.Errorf("fake vmm: run dir %q, want an absolute path: %w", spec.RunDir, errkind.InvalidArgument)
	}
	return nil
}

// makeGuestDirs creates the guest's writable dirs, owned by its user, or
// keeps those that exist (a disk keeps its contents).
func (d *Driver) makeGuestDirs(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, name := range guestDirs {
		p := filepath.Join(dir, name)
		err := os.Mkdir(p, 0o755)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		mode := os.FileMode(0o755)
		if name == "tmp" {
			mode = 0o777 | os.ModeSticky
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
		if err := os.Chown(p, int(d.uid), int(d.gid)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, etcWork), 0o700); err != nil {
		return err
	}
	for _, name := range etcOwned {
		p := filepath.Join(dir, etcUpper, name)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		// Parents as on the host (root's), the directory the guest's.
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chown(p, int(d.uid), int(d.gid)); err != nil {
			return err
		}
	}
	return nil
}

// jailConfig is the jail of a guest whose writable dirs are in dir, with
// its root mounted on runDir (in its own mount namespace only).
func (d *Driver) jailConfig(runDir, dir string) jail.Config {
	binds := []jail.Bind{{Source: d.exe, Target: childPath}}
	for _, name := range guestDirs {
		binds = append(binds, jail.Bind{Source: filepath.Join(dir, name), Target: "/" + name, Writable: true})
	}
	return jail.Config{
		UID: d.uid, GID: d.gid, Mountpoint: runDir,
		ReadOnly: jailReadOnly, Devices: jailDevices, Binds: binds, PTYs: true,
		Overlays: []jail.Overlay{{Lower: "/etc", Upper: filepath.Join(dir, etcUpper), Work: filepath.Join(dir, etcWork)}},
	}
}

// start runs the guest process for spec with its writable dirs in
// st.GuestDir.
func (d *Driver) start(ctx context.Context, spec vmm.Spec, st state) (_ *VM, err error) {
	if err := os.MkdirAll(spec.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	sock := filepath.Join(spec.RunDir, agentSocket)
	// The driver listens; the guest inherits the listener, so the socket
	// answers (or queues) as soon as it exists, and outlives this process.
	lnFile, err := listen(sock)
	if err != nil {
		return nil, fmt.Errorf("boot: agent socket: %w", err)
	}
	defer lnFile.Close()
	extra := []*os.File{lnFile} // fd 3
	var args []string
	if spec.NIC != nil && spec.NIC.Socket != "" {
		// The NIC's backend connects here; the guest has no network, so
		// it takes the connection and drops every frame.
		nicFile, err := listen(spec.NIC.Socket)
		if err != nil {
			os.Remove(sock)
			return nil, fmt.Errorf("boot: nic socket: %w", err)
		}
		defer nicFile.Close()
		extra = append(extra, nicFile) // fd 4
		args = append(args, "-nic")
		st.NICSocket = spec.NIC.Socket
	}
	removeSockets := func() {
		os.Remove(sock)
		if st.NICSocket != "" {
			os.Remove(st.NICSocket)
		}
	}
	logf, err := os.OpenFile(filepath.Join(spec.RunDir, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		removeSockets()
		return nil, fmt.Errorf("boot: %w", err)
	}
	defer logf.Close()

	if d.faultAt(PointAgent) != NoFault {
		args = append(args, "-agent-silent")
	}
	if d.faultAt(PointExitAfterBoot) != NoFault {
		args = append(args, "-exit-after-boot")
	}
	cmd, err := jail.Command(d.jailConfig(spec.RunDir, st.GuestDir), childPath, args...)
	if err != nil {
		removeSockets()
		return nil, fmt.Errorf("boot: %w", err)
	}
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = extra
	// Own process group, and no Pdeathsig: guests survive a restart of
	// this process.
	cmd.SysProcAttr.Setpgid = true
	placed := func(int) error { return nil }
	if spec.Placer != nil {
		after, release, err := spec.Placer.Place(cmd)
		if err != nil {
			removeSockets()
			return nil, fmt.Errorf("boot: cgroup: %w", err)
		}
		defer release()
		placed = after
	}
	if err := cmd.Start(); err != nil {
		removeSockets()
		return nil, fmt.Errorf("boot: start guest: %w", err)
	}
	undo := func(err error) error {
		cmd.Process.Kill()
		cmd.Wait()
		removeSockets()
		return fmt.Errorf("boot: %w", err)
	}
	if err := placed(cmd.Process.Pid); err != nil {
		return nil, undo(fmt.Errorf("cgroup: %w", err))
	}
	start, err := proc.StartTime(cmd.Process.Pid)
	if err != nil {
		return nil, undo(err)
	}
	p, err := proc.Open(cmd.Process.Pid, start)
	if err != nil {
		return nil, undo(err)
	}
	raw, err := json.Marshal(st)
	if err != nil {
		p.Close()
		return nil, undo(err)
	}
	h := vmm.Handle{
		Driver: Name, Version: Version, PID: cmd.Process.Pid, StartTime: start, RunDir: spec.RunDir,
		Agent: vmm.AgentEndpoint{Kind: "unix", Path: sock}, Accel: Accel, State: raw,
		// As asked of the jail: the guest execs itself only after it
		// applied all of this, or exits.
		Confinement: &vmm.Confinement{
			UID: d.uid, GID: d.gid, NoNewPrivs: true, NetNS: true, MountNS: true, PIDNS: true,
			Cgroup: spec.Placer != nil, Missing: "seccomp: the fake vmm applies no filter",
		},
	}
	v := newVM(d, h, st, p, cmd)
	v.log.Info("fake guest started", "guest_dir", st.GuestDir)
	return v, nil
}

// Recover re-attaches to the guest h describes (vmm.Driver): vmm.ErrGone
// when its process no longer runs or the pid is another process's now.
func (d *Driver) Recover(ctx context.Context, h vmm.Handle) (vmm.VM, error) {
	if h.Driver != Name {
		return nil, fmt.Errorf("recover: handle of driver %q, want %q: %w", h.Driver, Name, errkind.InvalidArgument)
	}
	var st state
	if err := json.Unmarshal(h.State, &st); err != nil || st.GuestDir == "" {
		return nil, fmt.Errorf("recover vm %d: bad handle state: %w", h.PID, errkind.InvalidArgument)
	}
	p, err := proc.Open(h.PID, h.StartTime)
	if errors.Is(err, proc.ErrGone) {
		return nil, fmt.Errorf("recover vm %d: %w", h.PID, vmm.ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("recover vm %d: %w", h.PID, err)
	}
	v := newVM(d, h, st, p, nil)
	if s, err := proc.ReadStat(h.PID); err == nil && s.State == 'T' {
		v.mu.Lock()
		v.paused = true // paused by our predecessor
		v.mu.Unlock()
	}
	v.log.Info("fake guest recovered")
	return v, nil
}

// waitCtx returns ctx's cause after it ends, for a hang.
func waitCtx(ctx context.Context) error {
	<-ctx.Done()
	return context.Cause(ctx)
}

// pollInterval is how often Pause looks for the guest's processes to have
// stopped.
const pollInterval = time.Millisecond

// pauseTimeout bounds how long Pause waits for the guest's processes to
// stop: a process that never stops is reported, not waited for forever.
const pauseTimeout = 30 * time.Second
