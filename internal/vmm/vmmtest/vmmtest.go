// Package vmmtest is the conformance suite every vmm.Driver passes: real
// guests (the default images with this checkout's agent) booted, paused,
// stopped, killed and re-attached through nothing but the vmm contract.
package vmmtest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/guesttest"
	"space/internal/agent/proto"
	"space/internal/guestvm"
	"space/internal/testenv"
	"space/internal/vmm"
)

// NewDriver returns a fresh driver. The suite calls it again to play a
// restarted worker, so it must not share state with earlier drivers beyond
// what a new process would.
type NewDriver func(t *testing.T) vmm.Driver

// Options describe a driver whose guests are not virtual machines
// (vmm/fake). The zero value is a real VMM: every check runs.
type Options struct {
	// NoGuestKernel: the driver boots no guest kernel. Its guests see the
	// host's CPUs, memory and /proc, Handle.Accel is the driver's own,
	// the hostname is not the guest's to set, and there is no tap NIC:
	// BootExecLimits checks the process info but not the vCPU and memory
	// limits nor the accelerator, SnapshotRestoreClones does not check
	// the clones' hostnames, and NetworkViaTap does not run.
	NoGuestKernel bool
	// NoProcessSnapshot: a snapshot keeps the guest's files but not its
	// processes. SnapshotRestoreClones checks the clones' files (those in
	// /tmp too) but not that the background counter runs on in them.
	NoProcessSnapshot bool
}

// Run runs the suite against the drivers newDriver makes.
func Run(t *testing.T, newDriver NewDriver) { RunWith(t, newDriver, Options{}) }

// RunWith runs the suite as opts adapt it.
func RunWith(t *testing.T, newDriver NewDriver, opts Options) {
	t.Run("BootExecLimits", func(t *testing.T) { testBootExecLimits(t, newDriver, opts) })
	t.Run("PauseResume", func(t *testing.T) { testPauseResume(t, newDriver) })
	t.Run("KilledMidBootLeavesNothing", func(t *testing.T) { testKilledMidBoot(t, newDriver) })
	t.Run("RecoverAfterWorkerRestart", func(t *testing.T) { testRecover(t, newDriver) })
	t.Run("SnapshotRestoreClones", func(t *testing.T) { testSnapshotRestore(t, newDriver, opts) })
	if !opts.NoGuestKernel {
		t.Run("NetworkViaTap", func(t *testing.T) { testNetwork(t, newDriver) })
		t.Run("ClonesOfAnOldGuestReseed", func(t *testing.T) { testClonesReseed(t, newDriver) })
	}
}

// boot boots a guest through guestvm. It is closed, and its test VM slot
// freed, by done or when t ends.
func boot(t *testing.T, d vmm.Driver, vcpus, memMiB int) (vm *guestvm.VM, done func()) {
	t.Helper()
	img := guesttest.Images(t)
	release := guesttest.AcquireSlot(t)
	run, data := dirs(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	vm, err := guestvm.Boot(ctx, guestvm.Config{Images: img, Driver: d, RunDir: run, DataDir: data, VCPUs: vcpus, MemoryMiB: memMiB})
	if err != nil {
		release()
		t.Fatalf("boot: %v", err)
	}
	return vm, closer(t, vm, release)
}

// closer returns an idempotent func that closes vm and frees its slot; it
// also runs when t ends.
func closer(t *testing.T, vm *guestvm.VM, release func()) func() {
	var once sync.Once
	done := func() {
		once.Do(func() {
			defer release()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := vm.Close(ctx); err != nil {
				t.Errorf("close guest: %v", err)
			}
		})
	}
	t.Cleanup(done)
	return done
}

// dirs returns a short run dir on tmpfs and a data dir, removed when t ends.
func dirs(t *testing.T) (run, data string) {
	t.Helper()
	run, err := os.MkdirTemp("/dev/shm", "space-vmmtest-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	data, err = os.MkdirTemp("", "space-vmmtest-data-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(run); os.RemoveAll(data) })
	return run, data
}

func testBootExecLimits(t *testing.T, newDriver NewDriver, opts Options) {
	vm, _ := boot(t, newDriver(t), 2, 384)
	c := vm.Client
	if !opts.NoGuestKernel {
		checkLimits(t, vm)
	}
	h := vm.VMM.Handle()
	info, err := vm.VMM.Info()
	if err != nil || info.PID != h.PID || info.RSS <= 0 {
		t.Errorf("Info() = %+v, %v; want pid %d and a resident size", info, err, h.PID)
	}
	if got := agenttest.Output(t, c, "echo ok"); got != "ok\n" {
		t.Errorf("exec echo ok = %q, want ok", got)
	}
	t.Logf("driver %s %s, accel %s, boot to agent %v, rss %d MiB", h.Driver, h.Version, h.Accel, vm.BootTime, info.RSS>>20)
}

// checkLimits checks the guest's vCPUs, memory and accelerator as boot
// asked for them.
func checkLimits(t *testing.T, vm *guestvm.VM) {
	c := vm.Client
	if got := strings.TrimSpace(agenttest.Output(t, c, "nproc")); got != "2" {
		t.Errorf("nproc = %q, want 2", got)
	}
	kb, err := strconv.Atoi(strings.Fields(agenttest.Output(t, c, "grep MemTotal /proc/meminfo"))[1])
	if err != nil {
		t.Fatalf("MemTotal: %v", err)
	}
	if want := 384 * 1024; kb > want || kb < want*80/100 {
		t.Errorf("MemTotal = %d kB, want within 80%%..100%% of %d kB", kb, want)
	}
	if h := vm.VMM.Handle(); h.Accel != "kvm" && h.Accel != "tcg" {
		t.Errorf("Handle().Accel = %q, want kvm or tcg", h.Accel)
	}
}

func counter(t *testing.T, vm *guestvm.VM) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(agenttest.Output(t, vm.Client, "cat /tmp/counter 2>/dev/null || echo 0")))
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	return n
}

func testPauseResume(t *testing.T, newDriver NewDriver) {
	vm, _ := boot(t, newDriver(t), 1, 384)
	p, ok := vm.VMM.(vmm.Pauser)
	if !ok {
		t.Fatalf("%T does not implement vmm.Pauser", vm.VMM)
	}
	// A background counter ticks ten times a second (in guest time).
	agenttest.Output(t, vm.Client, `(n=0; while :; do n=$((n+1)); echo $n > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done) >/dev/null 2>&1 &`)
	for deadline := time.Now().Add(30 * time.Second); counter(t, vm) <= 3; {
		if time.Now().After(deadline) {
			t.Fatalf("counter did not start")
		}
	}
	before, _ := vm.VMM.Info()
	c1 := counter(t, vm)
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	time.Sleep(2 * time.Second) // the guest must not run during this window
	mid, _ := vm.VMM.Info()
	if err := p.Resume(t.Context()); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	c2 := counter(t, vm)
	// Had the guest run through the pause, the counter would have moved
	// by about 20; reading it takes a few ticks at most.
	if c2-c1 > 10 {
		t.Errorf("counter moved %d -> %d across a 2s pause, want the guest stopped", c1, c2)
	}
	t.Logf("counter %d -> %d across the pause; VMM CPU during the pause %v", c1, c2, mid.CPUTime-before.CPUTime)
	deadline := time.Now().Add(30 * time.Second)
	for counter(t, vm) <= c2+5 {
		if time.Now().After(deadline) {
			t.Fatalf("counter did not advance after Resume")
		}
	}
}

func testKilledMidBoot(t *testing.T, newDriver NewDriver) {
	img := guesttest.Images(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	d := newDriver(t)
	run, _ := dirs(t)
	runDir := filepath.Join(run, "vm")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	vm, err := d.Boot(ctx, vmm.Spec{RunDir: runDir, Kernel: img.Kernel.Vmlinux, Initrd: img.Initramfs,
		Cmdline: "console=ttyS0", MemoryMiB: 256, Disks: []vmm.Disk{{Path: img.Rootfs, ReadOnly: true}}})
	if err != nil {
		t.Fatalf("Boot = %v", err)
	}
	h := vm.Handle()
	// The VMM dies (as in a crash) while the guest is still booting.
	if err := unix.Kill(h.PID, unix.SIGKILL); err != nil {
		t.Fatalf("kill vmm: %v", err)
	}
	if err := vm.Stop(ctx); err != nil {
		t.Errorf("Stop after the VMM died = %v", err)
	}
	select {
	case <-vm.Done():
	default:
		t.Errorf("Done not closed after Stop")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(h.PID)); err == nil {
		t.Errorf("vmm process %d still exists after Stop", h.PID)
	}
	// Only logs may stay behind (the owner removes the run dir).
	entries, _ := os.ReadDir(runDir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".log") {
			t.Errorf("left behind in the run dir: %s", e.Name())
		}
	}
	if _, err := d.Recover(ctx, h); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Recover(dead vm) = %v, want ErrGone", err)
	}
}

func testRecover(t *testing.T, newDriver NewDriver) {
	vm, _ := boot(t, newDriver(t), 1, 384)
	agenttest.Output(t, vm.Client, "echo kept > /root/state; sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/bg.pid")
	det, ok := vm.VMM.(vmm.Detacher)
	if !ok {
		t.Fatalf("%T does not implement vmm.Detacher", vm.VMM)
	}
	// The worker goes away: it persisted the handle, dropped its agent
	// connection and its hold on the VMM, and did not stop the VM.
	persisted, err := json.Marshal(vm.VMM.Handle())
	if err != nil {
		t.Fatalf("marshal handle: %v", err)
	}
	vm.Client.Close()
	if err := det.Detach(); err != nil {
		t.Fatalf("Detach = %v", err)
	}

	// A new worker process: a new driver, the handle from storage.
	var h vmm.Handle
	if err := json.Unmarshal(persisted, &h); err != nil {
		t.Fatalf("unmarshal handle: %v", err)
	}
	stale := h
	stale.StartTime++
	d := newDriver(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := d.Recover(ctx, stale); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Recover(handle with another start time) = %v, want ErrGone", err)
	}
	rvm, err := d.Recover(ctx, h)
	if err != nil {
		t.Fatalf("Recover = %v", err)
	}
	vm.VMM = rvm // the guest's Close now stops the recovered VM
	c, err := guestvm.Connect(ctx, rvm)
	if err != nil {
		t.Fatalf("reconnect agent: %v", err)
	}
	vm.Client = c
	if got := agenttest.Output(t, c, "cat /root/state; kill -0 $(cat /tmp/bg.pid) && echo alive"); got != "kept\nalive\n" {
		t.Errorf("after recovery: %q, want the file and the background process kept", got)
	}
	if p, ok := rvm.(vmm.Pauser); ok {
		if err := p.Pause(ctx); err != nil {
			t.Errorf("Pause after recovery = %v", err)
		}
		if err := p.Resume(ctx); err != nil {
			t.Errorf("Resume after recovery = %v", err)
		}
	}
}

// restore starts a clone from snap through guestvm and closes it when t
// ends.
func restore(t *testing.T, d vmm.Driver, snap, hostname string) *guestvm.VM {
	t.Helper()
	img := guesttest.Images(t)
	release := guesttest.AcquireSlot(t)
	run, data := dirs(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	vm, err := guestvm.Restore(ctx, guestvm.Config{Images: img, Driver: d, RunDir: run, DataDir: data, Hostname: hostname}, snap)
	if err != nil {
		release()
		t.Fatalf("restore: %v", err)
	}
	closer(t, vm, release)
	return vm
}

func testSnapshotRestore(t *testing.T, newDriver NewDriver, opts Options) {
	d := newDriver(t)
	if _, ok := d.(vmm.Restorer); !ok {
		t.Fatalf("%T does not implement vmm.Restorer", d)
	}
	src, closeSrc := boot(t, d, 1, 384)
	var origin identity
	if !opts.NoGuestKernel {
		origin = guestIdentity(t, src)
		if !validMachineID(origin.machineID) {
			t.Errorf("booted guest's machine-id = %q, want 32 hex digits of its own", origin.machineID)
		}
		if origin.healthBootID != origin.bootID {
			t.Errorf("booted guest's agent reports boot_id %q, its processes read %q", origin.healthBootID, origin.bootID)
		}
		if origin.machineID != src.Identity.MachineID {
			t.Errorf("booted guest's machine-id = %q, want %q, the one the host gave it", origin.machineID, src.Identity.MachineID)
		}
	}
	// State of three kinds: a file in tmpfs (guest memory), a file on the
	// writable layer (disk), and a running background counter (a process).
	// The counter's shell also reads the boot_id itself (read is a shell
	// builtin): what a process running since before a restore sees.
	agenttest.Output(t, src.Client, `echo in-memory > /tmp/mark; echo on-disk > /root/mark; (n=0; while :; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/counter; read b < /proc/sys/kernel/random/boot_id; echo $b > /tmp/b.new; mv /tmp/b.new /tmp/bootid; sleep 0.1; done) >/dev/null 2>&1 &`)
	for deadline := time.Now().Add(30 * time.Second); counter(t, src) <= 3; {
		if time.Now().After(deadline) {
			t.Fatalf("counter did not start")
		}
	}
	snapRoot, err := os.MkdirTemp("/dev/shm", "space-vmmtest-snap-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(snapRoot) })
	snapDir := filepath.Join(snapRoot, "s1")
	snap, err := src.Snapshot(t.Context(), snapDir)
	if err != nil {
		t.Fatalf("Snapshot = %v", err)
	}
	atSnap := counter(t, src) // the source runs on
	t.Logf("snapshot: guest paused %v, reflinked %v", snap.Took, snap.Reflinked)
	agenttest.Output(t, src.Client, "echo changed-after > /tmp/mark")

	if got := agenttest.Output(t, src.Client, "cat /tmp/mark"); got != "changed-after\n" {
		t.Errorf("source sees %q after the snapshot, want its own later state", got)
	}
	closeSrc() // two VMs at once at most on the test machines

	// A spec whose device layout differs from the snapshot's is refused
	// before anything runs.
	img := guesttest.Images(t)
	run, _ := dirs(t)
	_, err = d.(vmm.Restorer).Restore(t.Context(), snapDir, vmm.Spec{RunDir: filepath.Join(run, "vm"),
		Kernel: img.Kernel.Vmlinux, Initrd: img.Initramfs, Disks: []vmm.Disk{{Path: img.Rootfs, ReadOnly: true}}})
	if !errors.Is(err, vmm.ErrIncompatible) {
		t.Errorf("Restore(one disk fewer than the snapshot) = %v, want ErrIncompatible", err)
	}

	a := restore(t, d, snapDir, "clone-a")
	t.Logf("restore to agent ready (with post-restore): %v", a.BootTime)
	if opts.NoGuestKernel {
		if got := agenttest.Output(t, a.Client, "cat /tmp/mark /root/mark"); got != "in-memory\non-disk\n" {
			t.Errorf("clone state = %q, want the files as at the snapshot", got)
		}
	} else if got := agenttest.Output(t, a.Client, "cat /tmp/mark /root/mark; hostname"); got != "in-memory\non-disk\nclone-a\n" {
		t.Errorf("clone state = %q, want the files as at the snapshot and its own hostname", got)
	}
	if !opts.NoProcessSnapshot {
		if c := counter(t, a); c < atSnap-10 || c > atSnap+50 {
			t.Errorf("clone counter %d, want it to resume from about %d", c, atSnap)
		}
		deadline := time.Now().Add(30 * time.Second)
		for base := counter(t, a); counter(t, a) <= base+3; {
			if time.Now().After(deadline) {
				t.Fatalf("clone's background counter does not run")
			}
		}
	}
	// Clones diverge: what one writes, the other does not see, and what
	// they draw from the kernel's RNG right after the restore differs.
	b := restore(t, d, snapDir, "clone-b")
	if !opts.NoGuestKernel {
		rnd := "head -c 16 /dev/urandom | od -An -tx1"
		if ra, rb := agenttest.Output(t, a.Client, rnd), agenttest.Output(t, b.Client, rnd); ra == rb {
			t.Errorf("two clones read the same random bytes %q", ra)
		}
	}
	agenttest.Output(t, a.Client, "echo a > /tmp/who; echo a > /root/who")
	agenttest.Output(t, b.Client, "echo b > /tmp/who; echo b > /root/who")
	if got := agenttest.Output(t, a.Client, "cat /tmp/who /root/who"); got != "a\na\n" {
		t.Errorf("clone a sees %q, want its own writes", got)
	}
	if got := agenttest.Output(t, b.Client, "cat /tmp/who /root/who"); got != "b\nb\n" {
		t.Errorf("clone b sees %q, want its own writes", got)
	}
	if opts.NoGuestKernel {
		return // the machine-id and boot_id are the host's
	}
	// Clones are machines of their own: each has its own machine-id and
	// boot_id (what processes read, and what the agent reports), neither
	// its sibling's nor its origin's.
	ia, ib := guestIdentity(t, a), guestIdentity(t, b)
	for _, c := range []struct {
		name string
		vm   *guestvm.VM
		id   identity
	}{{"a", a, ia}, {"b", b, ib}} {
		want := identity{machineID: c.vm.Identity.MachineID, bootID: c.vm.Identity.BootID, healthBootID: c.vm.Identity.BootID}
		if c.id != want {
			t.Errorf("clone %s: %+v, want %+v, the ids the host gave it", c.name, c.id, want)
		}
	}
	if !opts.NoProcessSnapshot {
		// A process that ran before the restore reads the clone's boot_id.
		testenv.Eventually(t, 30*time.Second, func() bool {
			return agenttest.Output(t, a.Client, "cat /tmp/bootid") == ia.bootID+"\n"
		})
	}
	if ia.machineID == ib.machineID || ia.machineID == origin.machineID || ib.machineID == origin.machineID {
		t.Errorf("machine-ids: origin %s, clone a %s, clone b %s, want three different", origin.machineID, ia.machineID, ib.machineID)
	}
	if ia.bootID == ib.bootID || ia.bootID == origin.bootID || ib.bootID == origin.bootID {
		t.Errorf("boot_ids: origin %s, clone a %s, clone b %s, want three different", origin.bootID, ia.bootID, ib.bootID)
	}
}

// testClonesReseed restores two clones of a guest that had run for over
// two minutes and reads the kernel's RNG in each at once. Past two minutes
// of uptime the kernel reseeds its generator only every 60 s, and
// entropy added meanwhile waits for that: without the reseed that
// post-restore asks for, both clones read the same bytes (measured).
func testClonesReseed(t *testing.T, newDriver NewDriver) {
	testenv.RequireSlow(t)
	d := newDriver(t)
	src, closeSrc := boot(t, d, 1, 384)
	// The guest waits for itself: the test has nothing to poll.
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	wait := `while [ "$(cut -d. -f1 /proc/uptime)" -lt 125 ]; do sleep 1; done`
	if exit, err := src.Client.Exec(ctx, proto.ExecRequest{Shell: wait}, client.IO{}); err != nil || exit.Code != 0 {
		t.Fatalf("setup: wait for two minutes of uptime: %+v, %v", exit, err)
	}
	snapRoot, err := os.MkdirTemp("/dev/shm", "space-vmmtest-snap-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(snapRoot) })
	snapDir := filepath.Join(snapRoot, "s1")
	if _, err := src.Snapshot(t.Context(), snapDir); err != nil {
		t.Fatalf("Snapshot = %v", err)
	}
	closeSrc()
	rnd := "head -c 16 /dev/urandom | od -An -tx1"
	a := restore(t, d, snapDir, "clone-a")
	ra := agenttest.Output(t, a.Client, rnd)
	b := restore(t, d, snapDir, "clone-b")
	if rb := agenttest.Output(t, b.Client, rnd); ra == rb {
		t.Errorf("two clones read the same random bytes %q right after their restores", ra)
	}
}

// identity is what a guest's processes and its agent say identifies it.
type identity struct {
	machineID    string // cat /etc/machine-id
	bootID       string // cat /proc/sys/kernel/random/boot_id
	healthBootID string // the agent's health reply
}

func guestIdentity(t *testing.T, vm *guestvm.VM) identity {
	t.Helper()
	f := strings.Fields(agenttest.Output(t, vm.Client, "cat /etc/machine-id /proc/sys/kernel/random/boot_id"))
	if len(f) != 2 {
		t.Fatalf("machine-id and boot_id = %q, want two words", f)
	}
	h, err := vm.Client.Health(t.Context())
	if err != nil {
		t.Fatalf("Health = %v", err)
	}
	return identity{machineID: f[0], bootID: f[1], healthBootID: h.BootID}
}

func validMachineID(id string) bool {
	_, err := hex.DecodeString(id)
	return len(id) == 32 && err == nil && strings.Trim(id, "0") != ""
}
