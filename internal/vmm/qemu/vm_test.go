package qemu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/testenv"
)

const guestHello = "hello from the guest\n"

// fakeKernel writes a minimal bzImage (boot protocol 2.06) whose real-mode
// setup code prints guestHello on COM1 and then halts forever, or, with
// crash set, triple-faults (which makes QEMU exit under -no-reboot).
func fakeKernel(t testing.TB, crash bool) string {
	t.Helper()
	img := make([]byte, 64<<10)
	img[0x1f1] = 4 // setup_sects: setup is (4+1)*512 bytes
	binary.LittleEndian.PutUint16(img[0x1fe:], 0xaa55)
	copy(img[0x200:], []byte{0xeb, 0x66}) // jmp 0x268
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x0206) // protocol version
	img[0x211] = 0x01                                  // loadflags: LOADED_HIGH
	binary.LittleEndian.PutUint32(img[0x22c:], 0x37ffffff)
	binary.LittleEndian.PutUint32(img[0x238:], 2047) // cmdline_size
	// QEMU's linuxboot ROM jumps to setup+0x200 with ds = setup segment.
	code := []byte{
		0xfc,             // cld
		0xbe, 0x80, 0x02, // mov si, 0x280 (the message)
		0xba, 0xf8, 0x03, // mov dx, 0x3f8 (COM1)
		0xac,       // loop: lodsb
		0x84, 0xc0, // test al, al
		0x74, 0x03, // jz done
		0xee,       // out dx, al
		0xeb, 0xf8, // jmp loop
	}
	if crash {
		// lidt with a zero limit, then int3: triple fault.
		code = append(code, 0x0f, 0x01, 0x1e, 0x00, 0x03, 0xcc)
	} else {
		code = append(code, 0xfa, 0xf4, 0xeb, 0xfd) // done: cli; hlt; jmp hlt
	}
	copy(img[0x268:], code)
	copy(img[0x280:], guestHello+"\x00")
	path := filepath.Join(t.TempDir(), "bzImage")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return path
}

// testLog sends driver logs to t.Log.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// boot boots spec and stops the VM on cleanup; it logs the console on
// failure.
func boot(t *testing.T, d *Driver, spec Spec) *VM {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	start := time.Now()
	v, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Boot() = %v", err)
	}
	t.Logf("Boot() returned after %v", time.Since(start))
	t.Cleanup(func() {
		if t.Failed() {
			b, err := v.SerialLog()
			t.Logf("console (%v):\n%s", err, b)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := v.Stop(ctx); err != nil {
			t.Errorf("cleanup: Stop() = %v", err)
		}
	})
	return v
}

func newDriver(t *testing.T, cfg Config) *Driver {
	t.Helper()
	testenv.RequireQEMU(t)
	if cfg.Log == nil {
		cfg.Log = testLog(t)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("setup: New() = %v", err)
	}
	return d
}

func status(t *testing.T, v *VM) string {
	t.Helper()
	var st struct {
		Status string `json:"status"`
	}
	if err := v.QMP().Execute(t.Context(), "query-status", nil, &st); err != nil {
		t.Fatalf("query-status = %v", err)
	}
	return st.Status
}

func processExists(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	return err == nil
}

func TestBootPaused(t *testing.T) {
	d := newDriver(t, Config{})
	dir := filepath.Join(t.TempDir(), "vm")
	initrd := filepath.Join(t.TempDir(), "initrd")
	if err := os.WriteFile(initrd, []byte("07070100000000"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	raw := filepath.Join(t.TempDir(), "root.img")
	if err := os.WriteFile(raw, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	qcow := filepath.Join(t.TempDir(), "scratch.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", qcow, "64M").CombinedOutput(); err != nil {
		t.Fatalf("setup: qemu-img create: %v: %s", err, out)
	}

	v := boot(t, d, Spec{
		Dir:       dir,
		Kernel:    fakeKernel(t, false),
		Initrd:    initrd,
		Cmdline:   "console=ttyS0",
		VCPUs:     2,
		MemoryMiB: 128,
		Disks: []Disk{
			{Path: raw, Format: "raw", ReadOnly: true},
			{Path: qcow, Format: "qcow2"},
		},
		Paused: true,
	})
	pid := v.Pid()

	if got := status(t, v); got != "prelaunch" {
		t.Errorf("status = %q, want prelaunch", got)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("run dir mode = %v, %v, want 0700", fi.Mode(), err)
	}
	for _, name := range []string{qmpSocket, serialSocket, agentSocket} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v, want a socket with mode 0600", name, fi.Mode(), err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, serialLog)); err != nil {
		t.Errorf("serial log: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, memoryFile), &st); err != nil {
		t.Errorf("memory file: %v", err)
	} else if st.Size != 128<<20 || st.Blocks*512 >= st.Size {
		t.Errorf("memory file: size %d, %d bytes allocated, want %d bytes, sparse", st.Size, st.Blocks*512, 128<<20)
	}
	if got := v.AgentSocket(); got != filepath.Join(dir, "agent.sock") {
		t.Errorf("AgentSocket() = %q", got)
	}
	agent, err := net.Dial("unix", v.AgentSocket())
	if err != nil {
		t.Errorf("dial agent socket: %v", err)
	} else {
		agent.Close()
	}

	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		t.Fatalf("read qemu cmdline: %v", err)
	}
	d.mu.Lock()
	wantSandbox := d.sandbox == sandboxOn
	d.mu.Unlock()
	t.Logf("seccomp sandbox supported: %v", wantSandbox)
	if got := slices.Contains(strings.Split(string(cmdline), "\x00"), "-sandbox"); got != wantSandbox {
		t.Errorf("qemu command line has -sandbox: %v, want %v", got, wantSandbox)
	}
	if rss, err := v.RSS(); err != nil || rss <= 0 {
		t.Errorf("RSS() = %d, %v, want positive", rss, err)
	} else {
		t.Logf("RSS of a paused VM: %d MiB", rss>>20)
	}
	if cpu, err := v.CPUTime(); err != nil || cpu < 0 {
		t.Errorf("CPUTime() = %v, %v", cpu, err)
	}
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("qemu process group = %d, %v, want its own (%d)", pgid, err, pid)
	}

	if err := v.Stop(t.Context()); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if err := v.Stop(t.Context()); err != nil {
		t.Errorf("second Stop() = %v, want nil", err)
	}
	if processExists(pid) {
		t.Errorf("qemu pid %d still exists after Stop", pid)
	}
	select {
	case <-v.Done():
	default:
		t.Error("Done() not closed after Stop")
	}
	if err := v.Wait(t.Context()); err != nil {
		t.Errorf("Wait() after quit = %v, want nil", err)
	}
	if _, err := v.RSS(); !errors.Is(err, ErrExited) {
		t.Errorf("RSS() after Stop = %v, want ErrExited", err)
	}
	if _, err := v.SerialLog(); err != nil {
		t.Errorf("SerialLog() after Stop = %v", err)
	}
	if diff := cmp.Diff([]string{"qemu.log", "serial.log"}, dirNames(t, dir)); diff != "" {
		t.Errorf("files left in run dir (-want +got):\n%s", diff)
	}
}

func TestBootRunsGuest(t *testing.T) {
	d := newDriver(t, Config{})
	dir := filepath.Join(t.TempDir(), "vm")
	v := boot(t, d, Spec{Dir: dir, Kernel: fakeKernel(t, false), MemoryMiB: 64})
	if got := status(t, v); got != "running" {
		t.Errorf("status = %q, want running", got)
	}
	start := time.Now()
	testenv.Eventually(t, 60*time.Second, func() bool {
		b, err := v.SerialLog()
		return err == nil && bytes.Contains(b, []byte(guestHello))
	})
	t.Logf("guest output arrived %v after Boot returned", time.Since(start))

	// The guest now sits in hlt: measure how much CPU the idle VM uses.
	cpu0, err := v.CPUTime()
	if err != nil {
		t.Fatalf("CPUTime() = %v", err)
	}
	wall := 500 * time.Millisecond
	time.Sleep(wall) // measuring a rate over wall time, not synchronizing
	cpu1, err := v.CPUTime()
	if err != nil {
		t.Fatalf("CPUTime() = %v", err)
	}
	t.Logf("idle VM CPU: %v over %v (%.0f%% of a core)", cpu1-cpu0, wall, 100*float64(cpu1-cpu0)/float64(wall))
}

func TestGuestExit(t *testing.T) {
	d := newDriver(t, Config{})
	dir := filepath.Join(t.TempDir(), "vm")
	v := boot(t, d, Spec{Dir: dir, Kernel: fakeKernel(t, true), MemoryMiB: 64})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// A triple fault resets the machine; -no-reboot turns that into exit.
	if err := v.Wait(ctx); err != nil {
		t.Fatalf("Wait() = %v, want a clean exit", err)
	}
	b, err := v.SerialLog()
	if err != nil || !bytes.Contains(b, []byte(guestHello)) {
		t.Errorf("SerialLog() = %q, %v, want it to contain %q", b, err, guestHello)
	}
	if err := v.Stop(ctx); err != nil {
		t.Errorf("Stop() after exit = %v", err)
	}
	if diff := cmp.Diff([]string{"qemu.log", "serial.log"}, dirNames(t, dir)); diff != "" {
		t.Errorf("files left in run dir (-want +got):\n%s", diff)
	}
}

func TestSerialLogLimit(t *testing.T) {
	d := newDriver(t, Config{})
	v := boot(t, d, Spec{Dir: filepath.Join(t.TempDir(), "vm"), Kernel: fakeKernel(t, true), MemoryMiB: 64, SerialLogLimit: 5})
	if err := v.Wait(t.Context()); err != nil {
		t.Fatalf("Wait() = %v", err)
	}
	if err := v.Stop(t.Context()); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	b, err := v.SerialLog()
	if err != nil || string(b) != guestHello[:5] {
		t.Errorf("SerialLog() = %q, %v, want %q", b, err, guestHello[:5])
	}
	if got, want := v.serialOut.Dropped(), int64(len(guestHello)-5); got != want {
		t.Errorf("dropped console bytes = %d, want %d", got, want)
	}
}

func TestStopKillsUnresponsiveQEMU(t *testing.T) {
	d := newDriver(t, Config{StopGrace: 300 * time.Millisecond})
	dir := filepath.Join(t.TempDir(), "vm")
	v := boot(t, d, Spec{Dir: dir, Kernel: fakeKernel(t, false), MemoryMiB: 64, Paused: true})
	pid := v.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("setup: SIGSTOP: %v", err)
	}
	start := time.Now()
	if err := v.Stop(t.Context()); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	t.Logf("Stop() took %v", time.Since(start))
	if processExists(pid) {
		t.Errorf("qemu pid %d still exists after Stop", pid)
	}
	if err := v.Wait(t.Context()); err == nil {
		t.Error("Wait() after a kill = nil, want the kill reported")
	}
	if diff := cmp.Diff([]string{"qemu.log", "serial.log"}, dirNames(t, dir)); diff != "" {
		t.Errorf("files left in run dir (-want +got):\n%s", diff)
	}
}

func TestBootErrors(t *testing.T) {
	d := newDriver(t, Config{})
	kernel := fakeKernel(t, false)
	notQcow := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(notQcow, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	tests := []struct {
		name    string
		spec    func(dir string) Spec
		kind    *errkind.Kind // or nil: any error
		message string        // substring of the error
	}{
		{
			name:    "missing kernel",
			spec:    func(dir string) Spec { return Spec{Dir: dir, Kernel: "/nonexistent/vmlinuz", MemoryMiB: 64} },
			kind:    errkind.InvalidArgument,
			message: "/nonexistent/vmlinuz",
		},
		{
			name:    "zero memory",
			spec:    func(dir string) Spec { return Spec{Dir: dir, Kernel: kernel} },
			kind:    errkind.InvalidArgument,
			message: "memory",
		},
		{
			name: "qemu rejects the disk",
			spec: func(dir string) Spec {
				return Spec{Dir: dir, Kernel: kernel, MemoryMiB: 64, Disks: []Disk{{Path: notQcow, Format: "qcow2"}}}
			},
			message: "qcow2",
		},
		{
			name: "memory file exists",
			spec: func(dir string) Spec {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatalf("setup: %v", err)
				}
				if err := os.WriteFile(filepath.Join(dir, "memory"), nil, 0o600); err != nil {
					t.Fatalf("setup: %v", err)
				}
				return Spec{Dir: dir, Kernel: kernel, MemoryMiB: 64}
			},
			kind:    errkind.Conflict,
			message: "memory",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "vm")
			spec := tt.spec(dir)
			v, err := d.Start(t.Context(), spec)
			if err == nil {
				v.Stop(t.Context())
				t.Fatalf("Boot() = nil error, want error")
			}
			t.Logf("Boot() = %v", err)
			if tt.kind != nil && !errors.Is(err, tt.kind) {
				t.Errorf("Boot() = %v, want kind %v", err, tt.kind)
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("Boot() = %q, want it to mention %q", err, tt.message)
			}
			if pids := qemuProcessesUsing(t, dir); len(pids) > 0 {
				t.Errorf("qemu processes left for %s: %v", dir, pids)
			}
			for _, name := range []string{qmpSocket, serialSocket, agentSocket} {
				if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind: %v", name, err)
				}
			}
		})
	}
}

// qemuProcessesUsing lists processes whose command line mentions dir.
func qemuProcessesUsing(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatalf("read /proc: %v", err)
	}
	var pids []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(dir)) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read dir: %v", err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
