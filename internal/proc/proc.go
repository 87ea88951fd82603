// Package proc identifies and watches host processes by pid without
// mistaking a reused pid for the process it once named: a process is its
// pid plus its start time, and waiting and signalling go through a pidfd.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// ErrGone is returned when the process no longer runs, or its pid now names
// another process.
var ErrGone = fmt.Errorf("process is gone: %w", errkind.NotFound)

// StartTime returns field 22 of /proc/<pid>/stat: when the process started,
// in clock ticks since boot. With the pid it names one process for the
// life of the host.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return 0, ErrGone
	}
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold anything
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3, so field 22 is f[19].
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, ErrGone
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Handle is an open reference to one process.
type Handle struct {
	Pid int
	fd  int // pidfd
}

// Open returns a Handle on the process pid that started at start, or
// ErrGone. The pidfd is opened first and the start time checked after, so
// a pid reused in between is detected.
func Open(pid int, start uint64) (*Handle, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, errkind.InvalidArgument)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, ErrGone
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	got, err := StartTime(pid)
	if err != nil || got != start {
		unix.Close(fd)
		if err != nil && !errors.Is(err, ErrGone) {
			return nil, err
		}
		return nil, ErrGone
	}
	return &Handle{Pid: pid, fd: fd}, nil
}

// Signal sends sig to the process; it cannot reach a later process that
// reused the pid.
func (h *Handle) Signal(sig unix.Signal) error {
	err := unix.PidfdSendSignal(h.fd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return ErrGone
	}
	return err
}

// Wait blocks until the process has exited (it need not be our child) or
// ctx ends.
func (h *Handle) Wait(ctx context.Context) error {
	// A pidfd polls readable once the process exits. Poll with a timeout
	// so ctx is honoured; the wait costs one wakeup a second.
	for {
		fds := []unix.PollFd{{Fd: int32(h.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 1000)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("poll pidfd: %w", err)
		}
		if n > 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Close releases the pidfd.
func (h *Handle) Close() error { return unix.Close(h.fd) }
