package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/proc"
	"space/internal/testenv"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
	"space/internal/vmm/firecracker/fcapi/fcapitest"
)

// testImages creates stand-ins for a kernel, an initramfs, a read-only
// root image and a writable disk.
func testImages(t *testing.T) (dir string, spec vmm.Spec) {
	t.Helper()
	dir = shortTempDir(t, "fcimg")
	files := map[string]os.FileMode{"vmlinux": 0o644, "initrd": 0o600, "rootfs.img": 0o644, "rw.img": 0o600}
	for name, mode := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), mode); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return dir, vmm.Spec{
		RunDir:    filepath.Join(shortTempDir(t, "fcrun"), "vm"),
		Kernel:    filepath.Join(dir, "vmlinux"),
		Initrd:    filepath.Join(dir, "initrd"),
		Cmdline:   "console=ttyS0 quiet panic=-1",
		VCPUs:     2,
		MemoryMiB: 256,
		Disks: []vmm.Disk{
			{Path: filepath.Join(dir, "rootfs.img"), ReadOnly: true},
			{Path: filepath.Join(dir, "rw.img")},
		},
		NIC: &vmm.NIC{TapName: "tap0", MAC: "02:fc:00:00:00:01"},
	}
}

func newTestDriver(t *testing.T, cfg Config) *Driver {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("setup: New: %v", err)
	}
	d.capInterval = 10 * time.Millisecond
	return d
}

func bootVM(t *testing.T, d *Driver, spec vmm.Spec) *VM {
	t.Helper()
	vm, err := d.Boot(t.Context(), spec)
	if err != nil {
		t.Fatalf("Boot: %v", err)
	}
	v := vm.(*VM)
	t.Cleanup(func() { v.Stop(context.Background()) })
	return v
}

func stopVM(t *testing.T, v vmm.VM) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := v.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func TestNewMissingBinary(t *testing.T) {
	_, err := New(Config{Binary: "/nonexistent/firecracker-x"})
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "/nonexistent/firecracker-x") {
		t.Errorf("New with a missing binary = %v, want a failed precondition naming it", err)
	}
	fc := newFakeFirecracker(t, fakeOptions{})
	_, err = New(Config{Binary: fc.path, Jailer: &JailerConfig{Binary: "/nonexistent/jailer-x", UID: 1, GID: 1}})
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "jailer-x") {
		t.Errorf("New with a missing jailer = %v, want a failed precondition naming it", err)
	}
	_, err = New(Config{Binary: fc.path, Jailer: &JailerConfig{Binary: fc.path}})
	if !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("New with a root jail = %v, want an invalid argument", err)
	}
}

// TestBootAgainstFakeFirecracker boots with a real process serving the
// fake API and checks the whole request sequence, the handle, pause and
// resume, and what Stop leaves behind.
func TestBootAgainstFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	imgs, spec := testImages(t)
	v := bootVM(t, d, spec)
	run := spec.RunDir
	id := instanceID(run)

	ourNetns, _ := os.Readlink("/proc/self/ns/net")
	if diff := cmp.Diff(invocation{Args: []string{"--api-sock", "fc.sock", "--id", id}, Dir: run, Netns: ourNetns}, fc.Invocation(t)); diff != "" {
		t.Errorf("firecracker invocation (-want +got):\n%s", diff)
	}
	args := "console=ttyS0 quiet panic=-1 reboot=k i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce space.transport=vsock space.vsock_port=1024"
	want := []fcapitest.Request{
		{Method: "GET", Path: "/version"},
		{Method: "PUT", Path: "/logger", Body: `{"log_path":"vmm.fifo","level":"Info","show_level":true}`},
		{Method: "PUT", Path: "/machine-config", Body: `{"vcpu_count":2,"mem_size_mib":256}`},
		{Method: "PUT", Path: "/boot-source", Body: `{"kernel_image_path":"` + imgs + `/vmlinux","boot_args":"` + args + `","initrd_path":"` + imgs + `/initrd"}`},
		{Method: "PUT", Path: "/drives/d0", Body: `{"drive_id":"d0","path_on_host":"d0","is_root_device":false,"is_read_only":true}`},
		{Method: "PUT", Path: "/drives/d1", Body: `{"drive_id":"d1","path_on_host":"d1","is_root_device":false,"is_read_only":false}`},
		{Method: "PUT", Path: "/vsock", Body: `{"guest_cid":3,"uds_path":"vsock.sock"}`},
		{Method: "PUT", Path: "/network-interfaces/eth0", Body: `{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"02:fc:00:00:00:01"}`},
		{Method: "PUT", Path: "/entropy", Body: `{}`},
		{Method: "PUT", Path: "/balloon", Body: `{"amount_mib":0,"deflate_on_oom":true,"free_page_reporting":true}`},
		{Method: "PUT", Path: "/actions", Body: `{"action_type":"InstanceStart"}`},
	}
	if diff := cmp.Diff(want, fc.Requests(t)); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	h := v.Handle()
	st, err := proc.ReadStat(h.PID)
	if err != nil {
		t.Fatalf("stat of the vm process: %v", err)
	}
	wantHandle := vmm.Handle{
		Driver: "firecracker", Version: "1.16.1", PID: v.proc.pid, StartTime: st.StartTime, RunDir: run,
		Agent: vmm.AgentEndpoint{Kind: "hybrid-vsock", Path: filepath.Join(run, "vsock.sock"), Port: 1024},
		Accel: "kvm",
	}
	if diff := cmp.Diff(wantHandle, h, cmp.FilterPath(func(p cmp.Path) bool { return p.String() == "State" }, cmp.Ignore())); diff != "" {
		t.Errorf("Handle() (-want +got):\n%s", diff)
	}
	var hs handleState
	if err := json.Unmarshal(h.State, &hs); err != nil {
		t.Fatalf("handle state: %v", err)
	}
	if hs.ID != id || hs.APISocket != filepath.Join(run, "fc.sock") || hs.Root != run || hs.Jail != nil || len(hs.Layout.Disks) != 2 {
		t.Errorf("handle state = %+v", hs)
	}

	if fi, err := os.Stat(run); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("run dir = %v, %v; want mode 0700", fi, err)
	}
	for i, src := range []string{spec.Disks[0].Path, spec.Disks[1].Path} {
		if got, err := os.Readlink(filepath.Join(run, diskID(i))); err != nil || got != src {
			t.Errorf("link %s = %q, %v; want %q", diskID(i), got, err, src)
		}
	}
	if !exists(filepath.Join(run, "vsock.sock")) {
		t.Errorf("vsock socket missing after boot")
	}
	// The fake's logger writes a header into the FIFO; the VM copies it.
	testenv.Eventually(t, 5*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(run, vmmLog))
		return strings.Contains(string(b), "Running Firecracker v1.16.1")
	})

	if log, err := v.SerialLog(); err != nil || !strings.Contains(string(log), "fake firecracker") {
		t.Errorf("SerialLog() = %q, %v; want the fake's stdout", log, err)
	}
	info, err := v.Info()
	if err != nil || info.PID != h.PID || info.RSS <= 0 {
		t.Errorf("Info() = %+v, %v; want pid %d and some RSS", info, err, h.PID)
	}

	ctx := t.Context()
	for _, step := range []struct {
		do    func(context.Context) error
		state string
	}{{v.Pause, fcapi.StatePaused}, {v.Pause, fcapi.StatePaused}, {v.Resume, fcapi.StateRunning}} {
		if err := step.do(ctx); err != nil {
			t.Fatalf("pause/resume: %v", err)
		}
		if got, err := v.API().Instance(ctx); err != nil || got.State != step.state {
			t.Errorf("state = %+v, %v; want %s", got, err, step.state)
		}
	}

	stopVM(t, v)
	select {
	case <-v.Done():
	default:
		t.Errorf("Done not closed after Stop")
	}
	for _, name := range []string{"fc.sock", "vsock.sock", "vmm.fifo", "d0", "d1"} {
		if exists(filepath.Join(run, name)) {
			t.Errorf("%s remains after Stop", name)
		}
	}
	for _, name := range []string{consoleLog, vmmLog} {
		if !exists(filepath.Join(run, name)) {
			t.Errorf("%s removed by Stop, want it kept", name)
		}
	}
	for _, p := range []string{spec.Kernel, spec.Disks[1].Path} {
		if !exists(p) {
			t.Errorf("Stop removed the caller's %s", p)
		}
	}
	if err := v.Stop(ctx); err != nil {
		t.Errorf("second Stop = %v, want nil", err)
	}
	if _, err := v.Info(); !errors.Is(err, vmm.ErrExited) {
		t.Errorf("Info after Stop = %v, want ErrExited", err)
	}
	if err := v.Pause(ctx); !errors.Is(err, vmm.ErrExited) {
		t.Errorf("Pause after Stop = %v, want ErrExited", err)
	}
}

func TestStopKillsAfterGraceFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{ignoreTerm: true})
	d := newTestDriver(t, Config{Binary: fc.path, StopGrace: 200 * time.Millisecond})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	start := time.Now()
	stopVM(t, v)
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("Stop of a process ignoring SIGTERM took %v, want at least the grace", took)
	}
	var exitErr *exec.ExitError
	if !errors.As(v.proc.exitErr, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("exit = %v, want killed by SIGKILL", v.proc.exitErr)
	}
}

func TestStopEndsProcessOnSIGTERMFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path, StopGrace: time.Minute})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	stopVM(t, v) // would take a minute if SIGTERM did not end it
	var exitErr *exec.ExitError
	if !errors.As(v.proc.exitErr, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("exit = %v, want ended by SIGTERM", v.proc.exitErr)
	}
}

// TestRecoverFakeFirecracker re-attaches to a running VM from its
// persisted handle and stops it through the recovered VM, which is not a
// child of the process that recovered it (its exit is seen via pidfd).
func TestRecoverFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	orig := bootVM(t, d, spec)
	b, err := json.Marshal(orig.Handle())
	if err != nil {
		t.Fatalf("marshal handle: %v", err)
	}
	var h vmm.Handle
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("unmarshal handle: %v", err)
	}

	// A second driver, as after a restart.
	d2 := newTestDriver(t, Config{Binary: fc.path, StopGrace: time.Minute})
	got, err := d2.Recover(t.Context(), h)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	rv := got.(*VM)
	if diff := cmp.Diff(h, rv.Handle()); diff != "" {
		t.Errorf("recovered Handle() (-want +got):\n%s", diff)
	}
	if err := rv.Pause(t.Context()); err != nil {
		t.Fatalf("Pause via recovered vm: %v", err)
	}
	if info, err := rv.Info(); err != nil || info.PID != h.PID {
		t.Errorf("Info() = %+v, %v", info, err)
	}
	stopVM(t, rv)
	for name, ch := range map[string]<-chan struct{}{"recovered": rv.Done(), "original": orig.Done()} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s vm's Done not closed after Stop", name)
		}
	}
	if exists(filepath.Join(spec.RunDir, "fc.sock")) {
		t.Errorf("api socket remains after Stop of the recovered vm")
	}
	if _, err := d2.Recover(t.Context(), h); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Recover after Stop = %v, want ErrGone", err)
	}
}

// TestRecoverDetectsPIDReuseFakeFirecracker: a handle whose pid is alive
// but started at another time belongs to another process.
func TestRecoverDetectsPIDReuseFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	h := v.Handle()

	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() {
		other.Process.Kill()
		other.Wait()
	})

	reused := h
	reused.PID = other.Process.Pid // as if the vm's pid had been handed to sleep
	wrongTime := h
	wrongTime.StartTime++
	noPID := h
	noPID.PID = 0
	for name, hh := range map[string]vmm.Handle{"pid reused": reused, "start time differs": wrongTime, "no pid": noPID} {
		if _, err := d.Recover(t.Context(), hh); !errors.Is(err, vmm.ErrGone) {
			t.Errorf("Recover(%s) = %v, want ErrGone", name, err)
		}
	}
	foreign := h
	foreign.Driver = "qemu"
	if _, err := d.Recover(t.Context(), foreign); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Recover(qemu handle) = %v, want invalid argument", err)
	}
	select {
	case <-v.Done():
		t.Errorf("the vm exited during the failed recoveries")
	default:
	}
}

func TestBootReportsEarlyExitFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{crash: "Error creating the VM: /dev/kvm: no such device"})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	_, err := d.Boot(t.Context(), spec)
	if err == nil || !strings.Contains(err.Error(), "/dev/kvm: no such device") || !errors.Is(err, vmm.ErrExited) {
		t.Fatalf("Boot with a crashing firecracker = %v, want its message and ErrExited", err)
	}
	t.Logf("Boot error: %v", err)
	for _, name := range []string{"fc.sock", "vmm.fifo", "d0", "d1"} {
		if exists(filepath.Join(spec.RunDir, name)) {
			t.Errorf("%s remains after a failed Boot", name)
		}
	}
}

func TestBootRunDirInUseFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	if _, err := d.Boot(t.Context(), spec); !errors.Is(err, errkind.Conflict) {
		t.Errorf("second Boot in a live run dir = %v, want a conflict", err)
	}
	if err := v.Pause(t.Context()); err != nil {
		t.Errorf("first vm after the refused Boot: %v", err)
	}
	// A killed Firecracker leaves its sockets; the next Boot clears them.
	if err := v.proc.signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill: %v", err)
	}
	<-v.Done()
	if !exists(filepath.Join(spec.RunDir, "fc.sock")) {
		t.Fatalf("setup: no stale socket")
	}
	v2 := bootVM(t, d, spec)
	stopVM(t, v2)
}

func TestBootInvalidSpec(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, good := testImages(t)
	long := good
	long.RunDir = "/tmp/" + strings.Repeat("x", 100)
	tests := map[string]func(*vmm.Spec){
		"no run dir":     func(s *vmm.Spec) { s.RunDir = "" },
		"no kernel":      func(s *vmm.Spec) { s.Kernel = "" },
		"no memory":      func(s *vmm.Spec) { s.MemoryMiB = 0 },
		"33 vcpus":       func(s *vmm.Spec) { s.VCPUs = 33 },
		"bad mac":        func(s *vmm.Spec) { s.NIC = &vmm.NIC{TapName: "tap0", MAC: "02-fc-00-00-00-01"} },
		"long tap":       func(s *vmm.Spec) { s.NIC = &vmm.NIC{TapName: "tap-name-too-long"} },
		"disk w/o path":  func(s *vmm.Spec) { s.Disks = []vmm.Disk{{}} },
		"too many disks": func(s *vmm.Spec) { s.Disks = make([]vmm.Disk, 15) },
		"long cmdline":   func(s *vmm.Spec) { s.Cmdline = strings.Repeat("x", 1800) },
		"long run dir":   func(s *vmm.Spec) { s.RunDir = long.RunDir },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			spec := good
			spec.Disks = append([]vmm.Disk(nil), good.Disks...)
			mutate(&spec)
			if name == "too many disks" {
				for i := range spec.Disks {
					spec.Disks[i].Path = good.Disks[0].Path
				}
			}
			if _, err := d.Boot(t.Context(), spec); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Boot = %v, want an invalid argument", err)
			}
		})
	}
	if exists(fc.requests) {
		t.Errorf("an invalid spec started firecracker")
	}
	if exists(long.RunDir) {
		os.RemoveAll(long.RunDir)
		t.Errorf("an invalid spec created its run dir")
	}
}

// TestDetachFakeFirecracker: a detached VM runs on, and a new driver
// recovers and stops it.
func TestDetachFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	if err := v.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if err := v.Detach(); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("second Detach = %v, want a failed precondition", err)
	}
	if err := v.Stop(t.Context()); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Stop after Detach = %v, want a failed precondition", err)
	}
	h := v.Handle()
	select {
	case <-v.Done():
		t.Fatalf("Detach ended the vm")
	default:
	}
	rv, err := newTestDriver(t, Config{Binary: fc.path}).Recover(t.Context(), h)
	if err != nil {
		t.Fatalf("Recover after Detach: %v", err)
	}
	if err := rv.(*VM).Pause(t.Context()); err != nil {
		t.Errorf("Pause after Recover: %v", err)
	}
	stopVM(t, rv)
}

// TestStopAfterCrashLeavesOnlyLogsFakeFirecracker: when Firecracker dies
// (as in a crash), Stop still succeeds and only logs stay in the run dir.
func TestStopAfterCrashLeavesOnlyLogsFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	h := v.Handle()
	if err := syscall.Kill(h.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill: %v", err)
	}
	stopVM(t, v)
	entries, _ := os.ReadDir(spec.RunDir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".log") {
			t.Errorf("left behind in the run dir: %s", e.Name())
		}
	}
	if _, err := d.Recover(t.Context(), h); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Recover(dead vm) = %v, want ErrGone", err)
	}
}

// TestBootInNetnsFakeFirecracker: Firecracker opens the tap itself, so it
// must run in the NIC's network namespace.
func TestBootInNetnsFakeFirecracker(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierNetns, "ip", "iproute2")
	ns := fmt.Sprintf("space-fctest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("setup: ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	path := "/run/netns/" + ns
	want, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("setup: %v", err)
	}
	want = fmt.Sprintf("net:[%d]", st.Ino)

	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	spec.NIC.Netns = path
	v := bootVM(t, d, spec)
	if got := fc.Invocation(t).Netns; got != want {
		t.Errorf("firecracker ran in network namespace %s, want %s", got, want)
	}
	ours, _ := os.Readlink("/proc/self/ns/net")
	if ours == want {
		t.Errorf("the test process itself moved into the namespace")
	}
	stopVM(t, v)
}
