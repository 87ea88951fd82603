package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
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
	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/proc"
	"space/internal/testenv"
)

func TestCheckName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"space-w1/sbx_abc", true},
		{"A.b/c-d_e/9", true},
		{"...", true},
		{"", false},
		{"/abs", false},
		{"a/../b", false},
		{"..", false},
		{".", false},
		{"a/./b", false},
		{"a//b", false},
		{"a/", false},
		{"a b", false},
		{"a\x00b", false},
		{"sbx\n", false},
		{"ü", false},
		{"a*", false},
		{strings.Repeat("a", 255), true},
		{strings.Repeat("a", 256), false},
	}
	for _, tt := range tests {
		err := checkName(tt.name)
		if tt.ok && err != nil {
			t.Errorf("checkName(%q) = %v, want nil", tt.name, err)
		}
		if !tt.ok && !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("checkName(%q) = %v, want InvalidArgument", tt.name, err)
		}
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := NewV2(t.TempDir()); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("NewV2(not a cgroup) = %v, want InvalidArgument", err)
	}
	if _, err := NewV1(map[Controller]string{CPU: t.TempDir()}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("NewV1(not a cgroup) = %v, want InvalidArgument", err)
	}
	if _, err := NewV1(map[Controller]string{"cpuset": "/sys/fs/cgroup/cpuset"}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("NewV1(cpuset) = %v, want InvalidArgument", err)
	}
	if _, err := NewV1(nil); !errors.Is(err, ErrUnavailable) {
		t.Errorf("NewV1(nil) = %v, want ErrUnavailable", err)
	}
}

// TestReadOnly checks that a read-only cgroup file system (as in many
// containers) is reported as unavailable.
func TestReadOnly(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	dir := mountV2(t, unix.MS_RDONLY)
	_, err := NewV2(dir)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errkind.Unavailable) {
		t.Errorf("NewV2(read-only) = %v, want ErrUnavailable", err)
	}
	t.Logf("NewV2(read-only) = %v", err)
}

// TestHost runs a process in a group of the host's own hierarchy (cgroup v1
// on the CI machines, v2 on most others) with every limit it has.
func TestHost(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	h, err := Detect()
	if err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "detect cgroups: "+err.Error())
	}
	t.Logf("cgroup v%d, controllers %v", h.Version(), h.Controllers())
	parent := testParent(t, h)
	name := parent + "/sbx_a"

	l := Limits{CPUs: 1.5, MemoryBytes: 256 << 20, Pids: 64}
	g, err := h.Create(name, l)
	if err != nil {
		t.Fatalf("Create(%s) = %v", name, err)
	}
	want := map[string]string{
		"cpu.max": "150000 100000", "memory.max": "268435456", "memory.swap.max": "0", "pids.max": "64",
		"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "150000",
		"memory.limit_in_bytes": "268435456", "memory.memsw.limit_in_bytes": "268435456",
	}
	checkLimitFiles(t, g, want)

	// Creating it again sets the limits again: memory up, the rest off.
	l = Limits{MemoryBytes: 512 << 20}
	if g, err = h.Create(name, l); err != nil {
		t.Fatalf("Create(%s) again = %v", name, err)
	}
	want = map[string]string{
		"cpu.max": "max 100000", "memory.max": "536870912", "memory.swap.max": "0", "pids.max": "max",
		"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1",
		"memory.limit_in_bytes": "536870912", "memory.memsw.limit_in_bytes": "536870912",
	}
	checkLimitFiles(t, g, want)

	if got, err := h.List(parent); err != nil || !cmp.Equal(got, []string{name}) {
		t.Errorf("List(%s) = %v, %v; want [%s]", parent, got, err, name)
	}
	if got, err := h.List(parent + "/none"); err != nil || len(got) != 0 {
		t.Errorf("List(absent) = %v, %v; want none", got, err)
	}

	cmd := startIn(t, g, "sleep", "60")
	pid := cmd.Process.Pid
	if got, err := g.Procs(); err != nil || !cmp.Equal(got, []int{pid}) {
		t.Errorf("Procs = %v, %v; want [%d]", got, err, pid)
	}
	checkProcCgroup(t, h, pid, name)
	st, err := g.Stats()
	if err != nil {
		t.Errorf("Stats = %v", err)
	}
	t.Logf("stats: %+v", st)
	if h.has(Pids) && st.Pids != 1 {
		t.Errorf("Stats Pids = %d, want 1", st.Pids)
	}
	// On v1 what sleep charged before after moved it stays outside.
	if h.version == 2 && h.has(Memory) && st.MemoryBytes <= 0 {
		t.Errorf("Stats MemoryBytes = %d, want > 0", st.MemoryBytes)
	}

	if err := g.Remove(); !errors.Is(err, ErrNotEmpty) || !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Remove of a busy group = %v, want ErrNotEmpty", err)
	}
	killAndReap(t, g, cmd)
	if h.has(Freezer) {
		if b, err := os.ReadFile(filepath.Join(g.dir(Freezer), "freezer.state")); err != nil || strings.TrimSpace(string(b)) != "THAWED" {
			t.Errorf("freezer.state after Kill = %q, %v; want THAWED", b, err)
		}
	}

	if err := g.Remove(); err != nil {
		t.Fatalf("Remove = %v", err)
	}
	for _, dir := range g.dirs() {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after Remove, stat %s = %v; want not exist", dir, err)
		}
	}
	if err := g.Remove(); err != nil {
		t.Errorf("Remove again = %v, want nil", err)
	}
	if _, err := h.Open(name); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Open(removed) = %v, want NotFound", err)
	}
	if _, err := h.Open(parent); err != nil {
		t.Errorf("Open(parent) = %v", err)
	}
}

// TestV2Mount uses a private mount of the cgroup2 hierarchy. On a v1 host
// its controllers are bound to v1, so groups there have no limits, but
// CLONE_INTO_CGROUP, cgroup.kill and cgroup.freeze work.
func TestV2Mount(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	dir := mountV2(t, 0)
	h, err := NewV2(dir)
	if err != nil {
		t.Fatalf("NewV2(%s) = %v", dir, err)
	}
	t.Logf("controllers %v", h.Controllers())
	parent := testParent(t, h)

	if !h.has(Memory) {
		name := parent + "/limited"
		if _, err := h.Create(name, Limits{MemoryBytes: 1 << 20}); !errors.Is(err, ErrNoController) {
			t.Errorf("Create with a memory limit = %v, want ErrNoController", err)
		}
		if _, err := h.Open(name); !errors.Is(err, errkind.NotFound) {
			t.Errorf("Open(refused group) = %v, want NotFound", err)
		}
	}

	for _, tt := range []struct {
		name   string
		noKill bool
	}{{"kill_file", false}, {"freeze_and_kill", true}} {
		t.Run(tt.name, func(t *testing.T) {
			h := *h
			h.noKill = tt.noKill
			name := parent + "/" + tt.name
			g, err := h.Create(name, Limits{})
			if err != nil {
				t.Fatalf("Create(%s) = %v", name, err)
			}
			if !tt.noKill && !exists(filepath.Join(g.unified(), "cgroup.kill")) {
				testenv.Unavailable(t, testenv.TierNetns, "no cgroup.kill (Linux before 5.14)")
			}
			// A shell with two children: Kill must get all three.
			cmd := startIn(t, g, "sh", "-c", "sleep 60 & sleep 60 & wait")
			var pids []int
			testenv.Eventually(t, 5*time.Second, func() bool {
				pids, err = g.Procs()
				return err == nil && len(pids) == 3
			})
			for _, pid := range pids {
				checkProcCgroup(t, &h, pid, name)
			}
			if st, err := g.Stats(); err != nil {
				t.Errorf("Stats = %v", err)
			} else {
				t.Logf("stats: %+v", st)
			}
			if err := g.Remove(); !errors.Is(err, ErrNotEmpty) {
				t.Errorf("Remove of a busy group = %v, want ErrNotEmpty", err)
			}
			killAndReap(t, g, cmd)
			// The orphaned children were reparented and are reaped there.
			for _, pid := range pids {
				testenv.Eventually(t, 5*time.Second, func() bool {
					st, err := proc.ReadStat(pid)
					return errors.Is(err, proc.ErrGone) || err == nil && !st.Alive()
				})
			}
			if b, err := os.ReadFile(filepath.Join(g.unified(), "cgroup.freeze")); err != nil || strings.TrimSpace(string(b)) != "0" {
				t.Errorf("cgroup.freeze after Kill = %q, %v; want 0 (thawed)", b, err)
			}
			if err := g.Remove(); err != nil {
				t.Fatalf("Remove = %v", err)
			}
			if exists(g.unified()) {
				t.Errorf("after Remove, %s exists", g.unified())
			}
		})
	}

	// Remove takes the groups below with it.
	g, err := h.Create(parent+"/a/b", Limits{})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	top, err := h.Open(parent)
	if err != nil {
		t.Fatalf("Open(%s) = %v", parent, err)
	}
	if err := top.Remove(); err != nil {
		t.Errorf("Remove(%s) = %v", parent, err)
	}
	if exists(g.unified()) || exists(top.unified()) {
		t.Errorf("after Remove, %s or its parent exists", g.unified())
	}
}

// TestKillEmpty checks Kill, Remove and Procs on empty and removed groups.
func TestKillEmpty(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	h, err := Detect()
	if err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "detect cgroups: "+err.Error())
	}
	parent := testParent(t, h)
	g, err := h.Create(parent+"/empty", Limits{})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	if err := g.Kill(t.Context()); err != nil {
		t.Errorf("Kill(empty) = %v", err)
	}
	if err := g.Remove(); err != nil {
		t.Fatalf("Remove = %v", err)
	}
	if err := g.Kill(t.Context()); err != nil {
		t.Errorf("Kill(removed) = %v", err)
	}
	if _, err := g.Procs(); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Procs(removed) = %v, want NotFound", err)
	}
	if _, err := h.Create("../escape", Limits{}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Create(../escape) = %v, want InvalidArgument", err)
	}
	// A name that is one of the kernel's files is no group.
	if _, err := h.Create(parent+"/cgroup.procs", Limits{}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Create(%s/cgroup.procs) = %v, want InvalidArgument", parent, err)
	}
	if _, err := h.Open(parent + "/cgroup.procs"); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Open(%s/cgroup.procs) = %v, want NotFound", parent, err)
	}
}

// mountV2 mounts the cgroup2 hierarchy on a temporary directory until t
// ends.
func mountV2(t *testing.T, flags uintptr) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("none", dir, "cgroup2", flags, ""); err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "mount cgroup2: "+err.Error())
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s: %v", dir, err)
		}
	})
	return dir
}

// testParent returns a parent group name unique to this test process, and
// kills and removes it (with everything below) when t ends.
func testParent(t *testing.T, h *Hierarchy) string {
	t.Helper()
	parent := fmt.Sprintf("space-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
	t.Cleanup(func() {
		g, err := h.Open(parent)
		if errors.Is(err, errkind.NotFound) {
			return
		}
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := errors.Join(g.Kill(ctx), g.Remove()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return parent
}

// startIn starts args in g the way a caller of Place does.
func startIn(t *testing.T, g *Group, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	after := startPlaced(t, g.Place, cmd)
	if g.h.version == 2 && !cmd.SysProcAttr.UseCgroupFD {
		t.Errorf("Place on v2 did not set UseCgroupFD")
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	if err := after(cmd.Process.Pid); err != nil {
		t.Fatalf("after(%d) = %v", cmd.Process.Pid, err)
	}
	return cmd
}

// killAndReap kills g, which holds cmd, and checks that cmd died of
// SIGKILL and left no zombie once waited for.
func killAndReap(t *testing.T, g *Group, cmd *exec.Cmd) {
	t.Helper()
	pid := cmd.Process.Pid
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	if got, err := g.Procs(); err != nil || len(got) != 0 {
		t.Errorf("Procs after Kill = %v, %v; want none", got, err)
	}
	// Killed but not yet reaped: a zombie, which the group no longer lists.
	if st, err := proc.ReadStat(pid); err != nil || st.Alive() {
		t.Errorf("ReadStat(%d) after Kill = %+v, %v; want a zombie", pid, st, err)
	}
	cmd.Wait()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("wait status = %v, want killed by SIGKILL", cmd.ProcessState)
	}
	if _, err := proc.ReadStat(pid); !errors.Is(err, proc.ErrGone) {
		t.Errorf("ReadStat(%d) after Wait = %v, want ErrGone (no zombie)", pid, err)
	}
}

// checkLimitFiles compares g's limit files with want, for the files that
// exist in g's hierarchy.
func checkLimitFiles(t *testing.T, g *Group, want map[string]string) {
	t.Helper()
	files := map[string]Controller{
		"cpu.max": CPU, "cpu.cfs_period_us": CPU, "cpu.cfs_quota_us": CPU,
		"memory.max": Memory, "memory.swap.max": Memory,
		"memory.limit_in_bytes": Memory, "memory.memsw.limit_in_bytes": Memory,
		"pids.max": Pids,
	}
	got := map[string]string{}
	for f, c := range files {
		if !g.h.has(c) {
			delete(want, f)
			continue
		}
		b, err := os.ReadFile(filepath.Join(g.dir(c), f))
		if errors.Is(err, fs.ErrNotExist) {
			delete(want, f)
			continue
		}
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		got[f] = strings.TrimSpace(string(b))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("limit files mismatch (-want +got):\n%s", diff)
	}
}

// checkProcCgroup checks /proc/<pid>/cgroup: pid is in name for every
// controller of h (v1), or in name in the unified hierarchy (v2).
func checkProcCgroup(t *testing.T, h *Hierarchy, pid int, name string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatalf("read cgroup of %d: %v", pid, err)
	}
	in := map[string]string{} // controller ("" for v2) → path
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) != 3 {
			continue
		}
		for c := range strings.SplitSeq(f[1], ",") {
			in[c] = f[2]
		}
	}
	want := []string{""}
	if h.version == 1 {
		// Every hierarchy: the limiting controllers' and those beside
		// them (devices, cpuset, name=systemd, a hybrid host's unified),
		// so nothing that finds processes by cgroup sees it in the
		// caller's groups.
		want = slices.Collect(maps.Keys(in))
		slices.Sort(want)
	}
	for _, c := range want {
		if !strings.HasSuffix(in[c], "/"+name) {
			t.Errorf("/proc/%d/cgroup: %q is in %q, want .../%s\n%s", pid, c, in[c], name, b)
		}
	}
}

// TestCreateUnderUnfilledParent: a Create that finds its parent group made
// by a concurrent Create which has not yet filled the parent's v1 cpuset
// (CPUs and memory nodes empty) still makes a group a process can join.
// Seen in CI as "write .../cpuset/.../cgroup.procs: no space left on
// device" when 200 creates raced on a fresh worker.
func TestCreateUnderUnfilledParent(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	h, err := Detect()
	if err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "detect cgroups: "+err.Error())
	}
	parent := testParent(t, h)
	if h.cpuset != "" {
		// The other Create's state: the parent is there, its sets empty.
		dir := filepath.Join(h.cpuset, parent)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "cpuset.cpus")); strings.TrimSpace(string(b)) != "" {
			t.Logf("this kernel filled the new group's cpuset itself (clone_children): %q", b)
		}
	}
	g, err := h.Create(parent+"/child", Limits{})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	cmd := startIn(t, g, "sleep", "60")
	if got, err := g.Procs(); err != nil || !cmp.Equal(got, []int{cmd.Process.Pid}) {
		t.Errorf("Procs = %v, %v; want [%d]", got, err, cmd.Process.Pid)
	}
	killAndReap(t, g, cmd)
}
