package cgroup

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// JoinNamespaceOf moves every thread of this process into the cgroup
// namespace of process pid, normally 1: the host's init, as a worker in a
// pod with the host's PID namespace sees it. It reports whether a move was
// needed. A container runtime may give a container a cgroup namespace of
// its own (the rule on cgroup v2), and on a host whose cgroup2 is mounted
// with nsdelegate the kernel then refuses to move a process, or start one,
// into a group outside that namespace: a worker could not put its VMs into
// the host's groups it was given with At, and they would die with its pod.
//
// It needs CAP_SYS_ADMIN in the host's user namespace (a privileged
// container) and a build without cgo, since only then can the Go runtime
// apply setns(2) to all of the process's threads at once.
func JoinNamespaceOf(pid int) (joined bool, err error) {
	target := fmt.Sprintf("/proc/%d/ns/cgroup", pid)
	var self, other unix.Stat_t
	if err := unix.Stat("/proc/self/ns/cgroup", &self); err != nil {
		return false, fmt.Errorf("cgroup namespace: %w", &os.PathError{Op: "stat", Path: "/proc/self/ns/cgroup", Err: err})
	}
	if err := unix.Stat(target, &other); err != nil {
		return false, fmt.Errorf("cgroup namespace of pid %d: %w", pid, &os.PathError{Op: "stat", Path: target, Err: err})
	}
	if self.Dev == other.Dev && self.Ino == other.Ino {
		return false, nil
	}
	fd, err := unix.Open(target, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("cgroup namespace of pid %d: %w", pid, &os.PathError{Op: "open", Path: target, Err: err})
	}
	defer unix.Close(fd)
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_SETNS, uintptr(fd), unix.CLONE_NEWCGROUP, 0)
	switch {
	case errno == 0:
		return true, nil
	case errors.Is(errno, syscall.ENOTSUP):
		return false, fmt.Errorf("join the cgroup namespace of pid %d: this binary is built with cgo, which rules out setns for all threads (build it with CGO_ENABLED=0)", pid)
	default:
		return false, fmt.Errorf("join the cgroup namespace of pid %d: setns: %w", pid, errno)
	}
}
