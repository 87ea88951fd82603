package cgroup

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"space/internal/testenv"
)

const joinHelperEnv = "SPACE_CGROUP_JOIN_HELPER"

// TestJoinNamespaceOf starts a copy of the test binary in a cgroup
// namespace of its own, as a container runtime starts a worker, and has it
// join the namespace of this process (standing in for the host's init).
func TestJoinNamespaceOf(t *testing.T) {
	if os.Getenv(joinHelperEnv) != "" {
		return // the helper's run of this test
	}
	testenv.RequireRoot(t, testenv.TierNetns)
	if joined, err := JoinNamespaceOf(os.Getpid()); err != nil || joined {
		t.Fatalf("JoinNamespaceOf(self) = %v, %v; want no move", joined, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestJoinNamespaceHelper$", "-test.v")
	cmd.Env = append(os.Environ(), joinHelperEnv+"=1", "SPACE_CGROUP_JOIN_PARENT="+strconv.Itoa(os.Getpid()))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWCGROUP}
	out, err := cmd.CombinedOutput()
	switch {
	case strings.Contains(string(out), "HELPER cgo"):
		testenv.Unavailable(t, testenv.TierUnit, "the test binary is built with cgo; the worker's release build is not")
	case err != nil || !strings.Contains(string(out), "HELPER joined"):
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

// TestJoinNamespaceHelper is the child of TestJoinNamespaceOf.
func TestJoinNamespaceHelper(t *testing.T) {
	parent := os.Getenv("SPACE_CGROUP_JOIN_PARENT")
	if os.Getenv(joinHelperEnv) == "" || parent == "" {
		return
	}
	var self, want unix.Stat_t
	unix.Stat("/proc/self/ns/cgroup", &self)
	unix.Stat("/proc/"+parent+"/ns/cgroup", &want)
	if self.Ino == want.Ino {
		t.Fatalf("the helper shares its parent's cgroup namespace already")
	}
	pid, err := strconv.Atoi(parent)
	if err != nil {
		t.Fatal(err)
	}
	joined, err := JoinNamespaceOf(pid)
	if err != nil && strings.Contains(err.Error(), "cgo") {
		t.Log("HELPER cgo")
		return
	}
	if err != nil || !joined {
		t.Fatalf("JoinNamespaceOf = %v, %v", joined, err)
	}
	// Every thread moved, the one reading here included.
	for _, th := range tasks(t) {
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/task/"+th+"/ns/cgroup", &st); err != nil {
			t.Fatal(err)
		}
		if st.Ino != want.Ino {
			t.Fatalf("thread %s is still in cgroup namespace %d, want %d", th, st.Ino, want.Ino)
		}
	}
	t.Log("HELPER joined")
}

func tasks(t *testing.T) []string {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}
