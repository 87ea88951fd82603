package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/internal/testenv"
)

// gateHelperEnv makes this test binary (see TestMain) start a
// gated program and exit without opening the gate: a caller that dies
// mid-start.
const gateHelperEnv = "SPACE_CGROUP_GATE_HELPER"

// TestGateRefused: when after cannot move the process (its group is
// gone), the program never runs and the gate exits with exitGateClosed.
func TestGateRefused(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	_, g := gateGroup(t)
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := exec.Command("/bin/sh", "-c", "touch "+marker)
	after := startPlaced(t, g.gate, cmd)
	if err := g.Remove(); err != nil {
		t.Fatalf("setup: remove the group: %v", err)
	}
	if err := after(cmd.Process.Pid); err == nil {
		t.Errorf("after(%d) into a removed group = nil, want an error", cmd.Process.Pid)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitGateClosed {
		t.Errorf("gated program exited %v, want status %d", err, exitGateClosed)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused program ran: stat %s = %v", marker, err)
	}
}

// TestGateOpened: the program runs once after has moved it, as the same
// process, with the caller's extra descriptors at their numbers and the
// gate's descriptors closed; after returns once the program itself runs.
func TestGateOpened(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	_, g := gateGroup(t)
	f, err := os.CreateTemp(t.TempDir(), "extra")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprint(f, "fd3")
	f.Seek(0, 0)
	out := filepath.Join(t.TempDir(), "out")
	// fd 3 is the caller's; fds 4 and 5 were the gate's and must be closed.
	cmd := exec.Command("/bin/sh", "-c", "{ cat <&3; echo; cat /proc/self/cgroup; for fd in 4 5; do if [ -e /proc/self/fd/$fd ]; then echo gate-fd-open $fd; fi; done; } >"+out)
	cmd.ExtraFiles = []*os.File{f}
	after := startPlaced(t, g.Place, cmd)
	if err := after(cmd.Process.Pid); err != nil {
		t.Fatalf("after = %v", err)
	}
	self, _ := os.Executable()
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid)); err == nil && exe == self {
		t.Errorf("after returned while pid %d still runs the gate, not the program", cmd.Process.Pid)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gated program: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	if lines[0] != "fd3" {
		t.Errorf("fd 3 read %q, want the caller's file", lines[0])
	}
	if !strings.Contains(string(b), g.Name()) {
		t.Errorf("the program ran outside %s:\n%s", g.Name(), b)
	}
	if strings.Contains(string(b), "gate-fd-open") {
		t.Errorf("a gate descriptor reached the program:\n%s", b)
	}
}

// TestGateExecFails: a program that cannot be executed makes after fail
// with the exec's error, as a plain start would.
func TestGateExecFails(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	_, g := gateGroup(t)
	notExec := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExec, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(notExec)
	after := startPlaced(t, g.Place, cmd)
	err := after(cmd.Process.Pid)
	if err == nil || !strings.Contains(err.Error(), "exec "+notExec) {
		t.Errorf("after for a program that cannot run = %v, want the exec error", err)
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 127 {
		t.Errorf("gate exited %v, want status 127", err)
	}
}

// TestGateCallerDies: a caller that exits after starting a gated program,
// before after, leaves nothing running: the gate sees its pipe close and
// exits without running the program.
func TestGateCallerDies(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	_, g := gateGroup(t)
	marker := filepath.Join(t.TempDir(), "ran")
	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), gateHelperEnv+"="+g.Name()+" "+marker)
	b, err := helper.Output()
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	pid, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatalf("helper said %q", b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("gated pid %d still runs 10 s after its caller died", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the program ran though its caller died before placing it: stat %s = %v", marker, err)
	}
}

// TestMain runs this test binary as the caller that dies when
// TestGateCallerDies asks for it.
func TestMain(m *testing.M) {
	if v := os.Getenv(gateHelperEnv); v != "" {
		os.Exit(gateHelperMain(v))
	}
	os.Exit(m.Run())
}

// gateHelperMain starts a gated program in the group named in v and exits
// without opening the gate, printing the gated pid.
func gateHelperMain(v string) int {
	name, marker, _ := strings.Cut(v, " ")
	h, err := Detect()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	g, err := h.Open(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command("/bin/sh", "-c", "sleep 0.2; touch "+marker)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not killed with us
	if _, _, err := g.gate(cmd); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(cmd.Process.Pid)
	return 0 // without after, release or Wait
}

// startPlaced starts cmd placed by place and returns the after to call
// with its pid.
func startPlaced(t *testing.T, place func(*exec.Cmd) (func(int) error, func(), error), cmd *exec.Cmd) func(int) error {
	t.Helper()
	after, release, err := place(cmd)
	if err != nil {
		t.Fatalf("place = %v", err)
	}
	err = cmd.Start()
	release()
	if err != nil {
		t.Fatalf("start %s: %v", cmd.Args, err)
	}
	return after
}

// gateGroup returns the host's hierarchy and a fresh group in it.
func gateGroup(t *testing.T) (*Hierarchy, *Group) {
	t.Helper()
	h, err := Detect()
	if err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "detect cgroups: "+err.Error())
	}
	g, err := h.Create(testParent(t, h)+"/gated", Limits{})
	if err != nil {
		t.Fatalf("setup: create group: %v", err)
	}
	return h, g
}

// BenchmarkGate: what starting through the gate costs over a plain start
// into the same group (v1: the gate is this binary, started and exec'd
// once more).
//
//	SPACE_TEST_TIERS=netns go test -run '^$' -bench Gate ./internal/cgroup
func BenchmarkGate(b *testing.B) {
	testenv.RequireRoot(b, testenv.TierNetns)
	h, err := Detect()
	if err != nil {
		testenv.Unavailable(b, testenv.TierNetns, "detect cgroups: "+err.Error())
	}
	name := fmt.Sprintf("space-bench-%d", os.Getpid())
	g, err := h.Create(name, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Remove()
	run := func(b *testing.B, place func(*exec.Cmd) (func(int) error, func(), error)) {
		for b.Loop() {
			cmd := exec.Command("/bin/true")
			after, release, err := place(cmd)
			if err != nil {
				b.Fatal(err)
			}
			err = cmd.Start()
			release()
			if err != nil {
				b.Fatal(err)
			}
			if err := after(cmd.Process.Pid); err != nil {
				b.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("gated", func(b *testing.B) { run(b, g.gate) })
	b.Run("moved-after-start", func(b *testing.B) {
		run(b, func(*exec.Cmd) (func(int) error, func(), error) { return g.Add, func() {}, nil })
	})
}
