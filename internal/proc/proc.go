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
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// ErrGone is returned when the process no longer runs, or its pid now names
// another process.
var ErrGone = fmt.Errorf("process is gone: %w", errkind.NotFound)

// ErrClosed is returned by Wait when the Handle was closed meanwhile.
var ErrClosed = errors.New("process handle closed")

// Stat is what /proc/<pid>/stat says of a process.
type Stat struct {
	State     byte          // R, S, D, Z, X, ...
	CPU       time.Duration // utime + stime of all threads
	StartTime uint64        // clock ticks after boot: with the pid, one process
}

// Alive reports whether the process is neither a zombie nor dead.
func (s Stat) Alive() bool { return s.State != 'Z' && s.State != 'X' }

// ReadStat reads /proc/<pid>/stat; ErrGone when there is no such pid.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return Stat{}, ErrGone
	}
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(b)
}

// ParseStat parses the contents of /proc/<pid>/stat.
func ParseStat(b []byte) (Stat, error) {
	// The command name (field 2) is in parentheses and may hold anything,
	// parentheses included; the fields after the last ')' are plain.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("parse stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("parse stat: %d fields after the command name", len(f))
	}
	var n [3]uint64
	for j, field := range []int{14, 15, 22} {
		v, err := strconv.ParseUint(f[field-3], 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("parse stat field %d: %w", field, err)
		}
		n[j] = v
	}
	return Stat{State: f[0][0], CPU: time.Duration(n[0]+n[1]) * (time.Second / userHZ), StartTime: n[2]}, nil
}

// StartTime returns the start time of a live process; ErrGone for no such
// pid or a zombie.
func StartTime(pid int) (uint64, error) {
	st, err := ReadStat(pid)
	if err != nil {
		return 0, err
	}
	if !st.Alive() {
		return 0, ErrGone
	}
	return st.StartTime, nil
}

// Handle is an open reference (a pidfd) to one process, which need not be
// our child. It is safe for concurrent use.
type Handle struct {
	Pid int
	f   *os.File // the pidfd, registered with the runtime poller
	rc  syscall.RawConn

	closed atomic.Bool
}

// Open returns a Handle on the process pid that started at start, or
// ErrGone. The pidfd is opened first and the start time checked after, so
// a pid reused in between is detected.
func Open(pid int, start uint64) (*Handle, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, ErrGone
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd") // non-blocking: the poller takes it
	got, err := StartTime(pid)
	if err != nil || got != start {
		f.Close()
		if err != nil && !errors.Is(err, ErrGone) {
			return nil, err
		}
		return nil, ErrGone
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Handle{Pid: pid, f: f, rc: rc}, nil
}

// Signal sends sig to the process. It cannot reach a later process that
// reused the pid; ErrGone once the process has exited or h was closed.
func (h *Handle) Signal(sig syscall.Signal) error {
	var err error
	if cerr := h.rc.Control(func(fd uintptr) { err = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); cerr != nil {
		return ErrGone // closed
	}
	if errors.Is(err, unix.ESRCH) {
		return ErrGone
	}
	return err
}

// Wait blocks until the process has exited, ctx ends, or h is closed
// (ErrClosed). It costs no CPU while it waits: the pidfd turns readable on
// exit and the runtime poller wakes it. One Wait at a time.
func (h *Handle) Wait(ctx context.Context) error {
	h.f.SetReadDeadline(time.Time{}) // an earlier Wait's ctx may have set one
	stop := context.AfterFunc(ctx, func() { h.f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	err := h.rc.Read(func(fd uintptr) bool {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return err == nil && n > 0
	})
	switch {
	case err == nil:
		return nil
	case h.closed.Load():
		return ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
		return context.Cause(ctx)
	}
	return fmt.Errorf("wait for process %d: %w", h.Pid, err)
}

// Close releases the pidfd and ends a Wait in progress. Idempotent.
func (h *Handle) Close() error {
	h.closed.Store(true)
	if err := h.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}
