package firecracker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"space/internal/errkind"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
)

// Config configures a Driver.
type Config struct {
	// Binary is the firecracker executable, a path or a name looked up on
	// PATH; "" means firecracker.
	Binary string
	// Jailer, if not nil, runs every VM through the jailer; nil runs
	// Firecracker directly, as the caller's user.
	Jailer *JailerConfig
	// Log receives the driver's log lines; nil discards them.
	Log *slog.Logger
	// StopGrace is how long Stop waits for Firecracker to exit after
	// SIGTERM before it sends SIGKILL; 0 means 5s.
	StopGrace time.Duration
	// LogLimit caps console.log and firecracker.log, each; 0 means 1 MiB.
	LogLimit int64
	// DirtyTracking turns on KVM dirty page tracking in booted and
	// restored VMs: exact diff snapshots, at the cost of 4 KiB guest
	// mappings and some CPU. Without it diffs need Firecracker 1.13+
	// (which then uses mincore) and a host without swap.
	DirtyTracking bool
}

// Driver boots VMs with one Firecracker binary. It is safe for concurrent
// use and holds no state of its own.
type Driver struct {
	bin           string
	jail          *jailer // or nil
	log           *slog.Logger
	stopGrace     time.Duration
	logLimit      int64
	dirtyTracking bool
	capInterval   time.Duration // how often a VM checks its logs' sizes
}

var (
	_ vmm.Driver  = (*Driver)(nil)
	_ vmm.TapNICs = (*Driver)(nil)
)

// TapOwner is the uid Firecracker runs as, which must own its tap (it
// opens the tap by name, without CAP_NET_ADMIN when jailed); -1 (root
// only) without the jailer.
func (d *Driver) TapOwner() int {
	if d.jail != nil {
		return d.jail.uid
	}
	return -1
}

// New returns a Driver for cfg. It resolves the binaries but starts
// nothing. A missing binary is an errkind.FailedPrecondition error, an
// invalid cfg an errkind.InvalidArgument one.
func New(cfg Config) (*Driver, error) {
	bin := cfg.Binary
	if bin == "" {
		bin = "firecracker"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("firecracker binary %q: %w: %w", bin, err, errkind.FailedPrecondition)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, fmt.Errorf("firecracker binary %q: %w: %w", bin, err, errkind.FailedPrecondition)
	}
	d := &Driver{
		bin:           path,
		log:           cfg.Log,
		stopGrace:     cfg.StopGrace,
		logLimit:      cfg.LogLimit,
		dirtyTracking: cfg.DirtyTracking,
		capInterval:   time.Second,
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	d.log = d.log.With("component", "firecracker")
	if d.stopGrace == 0 {
		d.stopGrace = 5 * time.Second
	}
	if d.logLimit == 0 {
		d.logLimit = 1 << 20
	}
	if d.stopGrace < 0 || d.logLimit < 0 {
		return nil, fmt.Errorf("firecracker config: negative stop grace or log limit: %w", errkind.InvalidArgument)
	}
	if cfg.Jailer != nil {
		if d.jail, err = newJailer(*cfg.Jailer, path); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Boot starts Firecracker for spec, configures the VM and starts it; it
// returns once the guest runs, without waiting for the agent. An invalid
// spec is an errkind.InvalidArgument error; a run dir (or jail) in use by
// a live Firecracker an errkind.Conflict one. If Firecracker exits during
// Boot the error holds the end of its log. On error nothing keeps running
// and only the logs remain. The caller must Stop the returned VM (a *VM).
func (d *Driver) Boot(ctx context.Context, spec vmm.Spec) (vmm.VM, error) {
	start := time.Now()
	spec, err := normalize(spec, true)
	if err != nil {
		return nil, err
	}
	layout, err := bootLayout(spec, d.dirtyTracking)
	if err != nil {
		return nil, err
	}
	files, kernel, initrd := bootFiles(spec, d.jail != nil)
	v, err := d.start(ctx, spec.RunDir, files, layout, false, spec)
	if err != nil {
		return nil, fmt.Errorf("boot vm in %s: %w", spec.RunDir, err)
	}
	if err := v.configure(ctx, kernel, initrd); err != nil {
		return nil, v.abort(ctx, fmt.Errorf("boot vm in %s: %w", spec.RunDir, err))
	}
	v.log.Info("vm started", "boot_total", time.Since(start), "version", v.version)
	return v, nil
}

// start prepares Firecracker's root, starts Firecracker in it (in the
// NIC's network namespace, so that it can open the tap), waits for its API
// and configures its logger: everything that a boot and a restore share.
// On error it leaves nothing behind but the logs.
func (d *Driver) start(ctx context.Context, runDir string, files []placement, layout Layout, restored bool, spec vmm.Spec) (_ *VM, err error) {
	id := instanceID(runDir)
	nic, placer := spec.NIC, spec.Placer
	var netns string
	if nic != nil {
		netns = nic.Netns
	}
	st := handleState{ID: id, Root: runDir, Layout: layout, Restored: restored, Netns: netns, Base: spec.MemoryPath}
	if d.jail != nil {
		st.Root = d.jail.chroot(id)
		st.Jail = &jailState{Dir: d.jail.dir(id), UID: d.jail.uid, GID: d.jail.gid}
	}
	st.APISocket = filepath.Join(st.Root, apiSocket)
	for _, s := range []string{st.APISocket, filepath.Join(st.Root, vsockSocket)} {
		if len(s) > maxSocketPath {
			return nil, fmt.Errorf("socket path %s is longer than %d bytes: %w", s, maxSocketPath, errkind.InvalidArgument)
		}
	}
	if err := makePrivateDir(runDir); err != nil {
		return nil, err
	}
	if err := d.claimRoot(st); err != nil {
		return nil, err
	}
	v := d.newVM(runDir, st)
	defer func() {
		if err != nil {
			err = errors.Join(v.explain(ctx, err), v.kill(), v.teardown())
		}
	}()

	uid, gid := -1, -1
	if d.jail != nil {
		uid, gid = d.jail.uid, d.jail.gid
		for _, f := range files {
			if err := d.jail.place(f, filepath.Join(st.Root, f.name)); err != nil {
				return nil, fmt.Errorf("place %s in jail: %w", f.name, err)
			}
		}
	} else {
		for _, f := range files {
			dst := filepath.Join(st.Root, f.name)
			if err := removeIfExists(dst); err != nil {
				return nil, err
			}
			if err := os.Symlink(f.src, dst); err != nil {
				return nil, err
			}
		}
	}
	if err := makeFIFO(filepath.Join(st.Root, logFIFO), uid, gid); err != nil {
		return nil, err
	}

	if err := v.startProcess(d.command(st), placer); err != nil {
		return nil, err
	}
	v.keeper, err = startLogKeeper(v.log, filepath.Join(st.Root, logFIFO), filepath.Join(runDir, vmmLog),
		[]string{filepath.Join(runDir, consoleLog), filepath.Join(runDir, vmmLog)}, d.logLimit, d.capInterval)
	if err != nil {
		return nil, err
	}

	wctx, done := v.watch(ctx)
	defer done()
	if err := v.waitReady(wctx); err != nil {
		return nil, err
	}
	if v.version, err = v.api.Version(wctx); err != nil {
		return nil, err
	}
	if v.ver, err = fcapi.ParseVersion(v.version); err != nil {
		return nil, err
	}
	// Logger and metrics are the only configuration a snapshot load allows
	// before it, and neither is saved in a snapshot.
	if err := v.api.PutLogger(wctx, fcapi.Logger{LogPath: logFIFO, Level: "Info", ShowLevel: true}); err != nil {
		return nil, err
	}
	return v, nil
}

// claimRoot makes sure no live Firecracker uses the root, then clears
// what a dead one left (stale sockets; a whole stale jail).
func (d *Driver) claimRoot(st handleState) error {
	if isLive(st.APISocket) {
		return fmt.Errorf("a firecracker serves %s: %w", st.APISocket, errkind.Conflict)
	}
	if st.Jail != nil {
		if err := os.RemoveAll(st.Jail.Dir); err != nil {
			return fmt.Errorf("remove stale jail: %w", err)
		}
		if err := os.MkdirAll(st.Root, 0o700); err != nil {
			return fmt.Errorf("create jail: %w", err)
		}
		return nil
	}
	// Firecracker refuses to bind a socket path that exists.
	for _, name := range []string{apiSocket, vsockSocket} {
		if err := removeIfExists(filepath.Join(st.Root, name)); err != nil {
			return fmt.Errorf("remove stale socket: %w", err)
		}
	}
	return nil
}

// isLive reports whether a process may still serve a unix socket: only
// a missing path or a refused connection prove that none does (a busy
// server with a full backlog answers EAGAIN).
func isLive(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT)
	}
	c.Close()
	return true
}

// command is the exec.Cmd that starts Firecracker (through the jailer).
func (d *Driver) command(st handleState) *exec.Cmd {
	var cmd *exec.Cmd
	if d.jail != nil {
		cmd = exec.Command(d.jail.bin, d.jail.args(d.bin, st.ID, st.Netns)...)
	} else {
		cmd = exec.Command(d.bin, "--api-sock", apiSocket, "--id", st.ID)
	}
	cmd.Dir = st.Root // Firecracker resolves our relative names here
	if st.Jail != nil {
		cmd.Dir = filepath.Dir(st.Jail.Dir) // the jailer chroots itself
	}
	cmd.Env = []string{} // nothing from our environment
	// Own process group, and deliberately no Pdeathsig: VMs must survive a
	// restart of this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// configure sends the boot-path configuration and starts the instance.
func (v *VM) configure(ctx context.Context, kernel, initrd string) error {
	ctx, done := v.watch(ctx)
	defer done()
	l := &v.st.Layout
	api := v.api
	if err := api.PutMachineConfig(ctx, fcapi.MachineConfig{VCPUCount: l.VCPUs, MemSizeMiB: l.MemoryMiB, TrackDirtyPages: l.DirtyTracking}); err != nil {
		return err
	}
	if err := api.PutBootSource(ctx, fcapi.BootSource{KernelImagePath: kernel, InitrdPath: initrd, BootArgs: l.BootArgs}); err != nil {
		return err
	}
	for _, disk := range l.Disks {
		if err := api.PutDrive(ctx, fcapi.Drive{DriveID: disk.ID, PathOnHost: disk.Path, IsRootDevice: disk.Root, IsReadOnly: disk.ReadOnly}); err != nil {
			return err
		}
	}
	if err := api.PutVsock(ctx, fcapi.Vsock{GuestCID: l.Vsock.GuestCID, UDSPath: l.Vsock.Path}); err != nil {
		return err
	}
	if n := l.NIC; n != nil {
		if err := api.PutNetworkInterface(ctx, fcapi.NetworkInterface{IfaceID: n.ID, HostDevName: n.TapName, GuestMAC: n.MAC}); err != nil {
			return err
		}
	}
	l.Entropy = v.ver.AtLeast(1, 4)
	if l.Entropy {
		if err := api.PutEntropy(ctx, fcapi.Entropy{}); err != nil {
			return err
		}
	}
	// A balloon that is never inflated, for its free page reporting: the
	// memory the guest frees goes back to the host (the worker's idle
	// reclaim relies on it), as with QEMU's virtio-balloon.
	l.Balloon = v.ver.AtLeast(1, 14)
	if l.Balloon {
		if err := api.PutBalloon(ctx, fcapi.Balloon{DeflateOnOOM: true, FreePageReporting: true}); err != nil {
			return err
		}
	}
	return api.Action(ctx, fcapi.InstanceStart)
}

// waitReady polls GET / until Firecracker's API answers.
func (v *VM) waitReady(ctx context.Context) error {
	delay := 2 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := v.api.Instance(actx)
		cancel()
		if err == nil {
			return nil
		}
		if fcapi.IsRejected(err) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("wait for api socket (last attempt: %v): %w", err, context.Cause(ctx))
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
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
