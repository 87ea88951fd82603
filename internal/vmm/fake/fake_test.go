package fake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/guestvm"
	"space/internal/testenv"
	"space/internal/vmm"
	"space/internal/vmm/fake"
)

func newDriver(t *testing.T) *fake.Driver {
	t.Helper()
	testenv.RequireRoot(t, testenv.TierNetns) // the jail
	d, err := fake.New(fake.Config{})
	if err != nil {
		t.Fatalf("setup: New() = %v", err)
	}
	return d
}

// spec returns a spec with a run dir on tmpfs and a writable disk path in
// a data dir, as the worker gives them.
func spec(t *testing.T) vmm.Spec {
	t.Helper()
	run, err := os.MkdirTemp("/dev/shm", "space-fake-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	data := t.TempDir()
	t.Cleanup(func() { os.RemoveAll(run) })
	return vmm.Spec{RunDir: filepath.Join(run, "vm"), MemoryMiB: 256,
		Disks: []vmm.Disk{{Path: "/nonexistent/rootfs", ReadOnly: true}, {Path: filepath.Join(data, "rw.img")}}}
}

func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c
}

// boot boots a guest and connects to its agent; both end with t.
func boot(t *testing.T, d vmm.Driver, s vmm.Spec) (vmm.VM, *client.Client) {
	t.Helper()
	vm, err := d.Boot(ctx(t, time.Minute), s)
	if err != nil {
		t.Fatalf("Boot() = %v", err)
	}
	t.Cleanup(func() { vm.Stop(context.Background()) })
	return vm, connect(t, vm)
}

func connect(t *testing.T, vm vmm.VM) *client.Client {
	t.Helper()
	c, err := client.DialUnixWait(ctx(t, 30*time.Second), vm.Handle().Agent.Path)
	if err != nil {
		t.Fatalf("connect agent: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestBootJailed(t *testing.T) {
	d := newDriver(t)
	s := spec(t)
	t0 := time.Now()
	vm, c := boot(t, d, s)
	t.Logf("boot to agent ready: %v", time.Since(t0))
	h := vm.Handle()
	if h.Driver != "fake" || h.Version != fake.Version || h.Agent.Kind != "unix" || h.Accel != fake.Accel {
		t.Errorf("Handle() = %+v, want driver fake, its version, a unix agent socket", h)
	}
	tests := []struct{ name, shell, want string }{
		{"echo", "echo hi", "hi\n"},
		{"user", "id -u; id -g", "2000000100\n2000000100\n"},
		{"root", "ls -A /", ".space\nbin\ndev\netc\nhome\nlib\nlib64\nproc\nroot\nsbin\ntmp\nusr\nwork\n"},
		{"pid namespace", "echo $$ > /dev/null; cat /proc/1/cmdline | tr '\\0' ' '", "/.space/space-fakevm "},
		{"read-only system", "touch /usr/x /etc/x 2>&1 | sed 's/.*: //'", "Read-only file system\nPermission denied\n"},
		{"etc overlay", "echo ca > /etc/space/ca.pem && cat /etc/space/ca.pem && head -c 4 /etc/passwd", "ca\nroot"},
		{"writable dirs", "for d in /tmp /root /home /work; do touch $d/x && echo $d; done", "/tmp\n/root\n/home\n/work\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := agenttest.Output(t, c, tt.shell); got != tt.want {
				t.Errorf("exec %q = %q, want %q", tt.shell, got, tt.want)
			}
		})
	}
	// The files API writes through to the sandbox's dir on the host.
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: "/work/hello.txt"}, strings.NewReader("hello\n")); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	host := s.Disks[1].Path + ".fake/work/hello.txt"
	if b, err := os.ReadFile(host); err != nil || string(b) != "hello\n" {
		t.Errorf("host file %s = %q, %v; want %q", host, b, err, "hello\n")
	}
	if _, err := os.Stat("/etc/space/ca.pem"); err == nil {
		t.Errorf("the guest's write to /etc/space reached the host's /etc")
	}
	info, err := vm.Info()
	if err != nil || info.PID != h.PID || info.RSS <= 0 {
		t.Errorf("Info() = %+v, %v; want pid %d and a resident size", info, err, h.PID)
	}
}

// TestAgentConformance runs the agent suite against a fake guest: exec,
// PTY, files and processes behave as in a real guest.
func TestAgentConformance(t *testing.T) {
	d := newDriver(t)
	vm, c := boot(t, d, spec(t))
	agenttest.Run(t, c, agenttest.Options{Scratch: "/tmp", PID1: true, Unprivileged: true,
		Reconnect: func(ctx context.Context, old *client.Client) (*client.Client, error) {
			old.Close()
			return client.DialUnixWait(ctx, vm.Handle().Agent.Path)
		}})
}

func TestPauseResume(t *testing.T) {
	d := newDriver(t)
	vm, c := boot(t, d, spec(t))
	p := vm.(vmm.Pauser)
	agenttest.Output(t, c, "sleep 1000 >/dev/null 2>&1 &")
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	// A paused guest's agent does not answer.
	hctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err := c.Health(hctx)
	cancel()
	if err == nil {
		t.Errorf("Health() while paused = nil, want no answer")
	}
	if err := p.Resume(t.Context()); err != nil {
		t.Fatalf("Resume() = %v", err)
	}
	c2 := connect(t, vm)
	if got := agenttest.Output(t, c2, "pgrep -c sleep; ps -o stat= -C sleep | cut -c1"); got != "1\nS\n" {
		t.Errorf("after Resume: %q, want the background sleep running again", got)
	}
}

func TestRecoverAndStop(t *testing.T) {
	d := newDriver(t)
	s := spec(t)
	vm, c := boot(t, d, s)
	agenttest.Output(t, c, "echo kept > /root/state; sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/bg.pid")
	b, _ := json.Marshal(vm.Handle())
	c.Close()
	if err := vm.(vmm.Detacher).Detach(); err != nil {
		t.Fatalf("Detach() = %v", err)
	}
	var h vmm.Handle
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("unmarshal handle: %v", err)
	}
	stale := h
	stale.StartTime++
	d2 := newDriver(t)
	if _, err := d2.Recover(t.Context(), stale); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Recover(stale handle) = %v, want ErrGone", err)
	}
	rvm, err := d2.Recover(t.Context(), h)
	if err != nil {
		t.Fatalf("Recover() = %v", err)
	}
	if got := agenttest.Output(t, connect(t, rvm), "cat /root/state; kill -0 $(cat /tmp/bg.pid) && echo alive"); got != "kept\nalive\n" {
		t.Errorf("after Recover: %q, want the file and the process kept", got)
	}
	for i := range 2 { // idempotent
		if err := rvm.Stop(t.Context()); err != nil {
			t.Errorf("Stop() #%d = %v", i+1, err)
		}
	}
	select {
	case <-rvm.Done():
	default:
		t.Errorf("Done not closed after Stop")
	}
	if _, err := rvm.Info(); !errors.Is(err, vmm.ErrExited) {
		t.Errorf("Info() after Stop = %v, want ErrExited", err)
	}
	entries, _ := os.ReadDir(s.RunDir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if diff := cmp.Diff([]string{"fake.log"}, left); diff != "" {
		t.Errorf("run dir after Stop (-want +got):\n%s", diff)
	}
	if _, err := d2.Recover(t.Context(), h); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Recover(stopped) = %v, want ErrGone", err)
	}
}

func TestSnapshotRestore(t *testing.T) {
	d := newDriver(t)
	vm, c := boot(t, d, spec(t))
	agenttest.Output(t, c, "echo a > /work/f; echo b > /tmp/g; sleep 1000 >/dev/null 2>&1 &")
	snapDir := filepath.Join(t.TempDir(), "snap")
	snap, err := vm.(vmm.Snapshotter).Snapshot(t.Context(), snapDir, vmm.SnapshotOptions{})
	if err != nil {
		t.Fatalf("Snapshot() = %v", err)
	}
	if snap.Driver != "fake" || snap.Version != fake.Version || snap.Dir != snapDir {
		t.Errorf("Snapshot() = %+v, want driver fake, its version, dir %s", snap, snapDir)
	}
	// The source runs on and diverges.
	agenttest.Output(t, c, "echo changed > /work/f")

	clone := func(s vmm.Spec) *client.Client {
		t.Helper()
		rvm, err := d.Restore(ctx(t, time.Minute), snapDir, s)
		if err != nil {
			t.Fatalf("Restore() = %v", err)
		}
		t.Cleanup(func() { rvm.Stop(context.Background()) })
		return connect(t, rvm)
	}
	a, b := clone(spec(t)), clone(spec(t))
	// Files are as at the snapshot; processes are not preserved.
	if got := agenttest.Output(t, a, "cat /work/f /tmp/g; pgrep -c sleep || true"); got != "a\nb\n0\n" {
		t.Errorf("clone: %q, want the files as at the snapshot and no processes", got)
	}
	agenttest.Output(t, a, "echo from-a > /work/f")
	if got := agenttest.Output(t, b, "cat /work/f"); got != "a\n" {
		t.Errorf("clone b sees %q, want its own copy", got)
	}

	oneDisk := spec(t)
	oneDisk.Disks = oneDisk.Disks[1:]
	if _, err := d.Restore(t.Context(), snapDir, oneDisk); !errors.Is(err, vmm.ErrIncompatible) {
		t.Errorf("Restore(one disk fewer) = %v, want ErrIncompatible", err)
	}
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "meta.json"), []byte(`{"driver":"qemu"}`), 0o600)
	if _, err := d.Restore(t.Context(), other, spec(t)); !errors.Is(err, vmm.ErrIncompatible) {
		t.Errorf("Restore(another driver's snapshot) = %v, want ErrIncompatible", err)
	}
	os.WriteFile(filepath.Join(other, "fake.json"), []byte(`{"driver":"fake","version":"0","disks":2}`), 0o600)
	if _, err := d.Restore(t.Context(), other, spec(t)); !errors.Is(err, vmm.ErrIncompatible) {
		t.Errorf("Restore(another version's snapshot) = %v, want ErrIncompatible", err)
	}
}

func TestFaults(t *testing.T) {
	d := newDriver(t)
	if err := d.SetFault("nowhere", fake.Fail); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("SetFault(unknown point) = %v, want InvalidArgument", err)
	}
	set := func(p fake.Point, f fake.Fault) {
		t.Helper()
		if err := d.SetFault(p, f); err != nil {
			t.Fatalf("SetFault(%s) = %v", p, err)
		}
	}

	set(fake.PointBoot, fake.Fail)
	if _, err := d.Boot(t.Context(), spec(t)); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Boot() with a boot fault = %v, want ErrInjected", err)
	}
	set(fake.PointBoot, fake.Hang)
	hctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	_, err := d.Boot(hctx, spec(t))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Boot() with a hang = %v, want the ctx's deadline", err)
	}
	set(fake.PointBoot, fake.NoFault)

	set(fake.PointAgent, fake.Fail)
	vm, err := d.Boot(t.Context(), spec(t))
	if err != nil {
		t.Fatalf("Boot() with an agent fault = %v", err)
	}
	t.Cleanup(func() { vm.Stop(context.Background()) })
	actx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	_, err = client.DialUnixWait(actx, vm.Handle().Agent.Path)
	cancel()
	if err == nil {
		t.Errorf("connect to a silent agent = nil, want a timeout")
	}
	set(fake.PointAgent, fake.NoFault)

	set(fake.PointExitAfterBoot, fake.Fail)
	vm2, err := d.Boot(t.Context(), spec(t))
	if err != nil {
		t.Fatalf("Boot() with exit-after-boot = %v", err)
	}
	// The worker's wait for the agent ends when the guest does, well
	// before its boot timeout.
	cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	if _, err := guestvm.Connect(cctx, vm2); err == nil || cctx.Err() != nil {
		t.Errorf("guestvm.Connect(guest that exits after boot) = %v, ctx %v; want an error before the deadline", err, cctx.Err())
	}
	cancel()
	select {
	case <-vm2.Done():
	default:
		t.Errorf("guest with exit-after-boot: Done not closed")
	}
	if err := vm2.Stop(t.Context()); err != nil {
		t.Errorf("Stop(exited guest) = %v", err)
	}
	set(fake.PointExitAfterBoot, fake.NoFault)

	vm3, _ := boot(t, d, spec(t))
	for _, p := range []fake.Point{fake.PointPause, fake.PointResume, fake.PointSnapshot, fake.PointStop} {
		set(p, fake.Fail)
	}
	if err := vm3.(vmm.Pauser).Pause(t.Context()); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Pause() = %v, want ErrInjected", err)
	}
	if err := vm3.(vmm.Pauser).Resume(t.Context()); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Resume() = %v, want ErrInjected", err)
	}
	if _, err := vm3.(vmm.Snapshotter).Snapshot(t.Context(), filepath.Join(t.TempDir(), "s"), vmm.SnapshotOptions{}); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Snapshot() = %v, want ErrInjected", err)
	}
	if err := vm3.Stop(t.Context()); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Stop() = %v, want ErrInjected", err)
	}
	set(fake.PointRestore, fake.Fail)
	if _, err := d.Restore(t.Context(), t.TempDir(), spec(t)); !errors.Is(err, fake.ErrInjected) {
		t.Errorf("Restore() = %v, want ErrInjected", err)
	}
	set(fake.PointStop, fake.NoFault)
	if err := vm3.Stop(t.Context()); err != nil {
		t.Errorf("Stop() once the fault is cleared = %v", err)
	}
}

// TestExecOutputThroughPTY: a PTY exec in the guest gets a terminal.
func TestPTY(t *testing.T) {
	d := newDriver(t)
	_, c := boot(t, d, spec(t))
	var out bytes.Buffer
	exit, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Shell: "tty", PTY: &proto.WinSize{Rows: 24, Cols: 80}}, client.IO{Stdout: &out})
	if err != nil || exit.Code != 0 || !strings.HasPrefix(out.String(), "/dev/pts/") {
		t.Errorf("Exec(tty, PTY) = %+v, %v, output %q; want /dev/pts/N", exit, err, out.String())
	}
}
