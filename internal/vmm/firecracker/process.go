package firecracker

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/vmm"
)

// userHZ is the unit of the times in /proc/<pid>/stat (USER_HZ, fixed at
// 100 in the Linux ABI).
const userHZ = 100

// process is a firecracker (or jailer-then-firecracker) process, either
// started here or re-attached to.
type process struct {
	pid       int
	startTime uint64        // /proc/<pid>/stat field 22
	done      chan struct{} // closed once the process has exited
	exitErr   error         // how it exited (nil: status 0, or unknown); set before done is closed
	signalFn  func(syscall.Signal) error
	release   func() // or nil; stops watching an attached process that is not kept
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig; a process that has already exited is no error.
func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	if err := p.signalFn(sig); err != nil {
		return fmt.Errorf("signal %d: %w", p.pid, err)
	}
	return nil
}

// startProcess starts cmd and reaps it in a goroutine.
func startProcess(cmd *exec.Cmd) (*process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{pid: cmd.Process.Pid, done: make(chan struct{})}
	// os.Process signals through a pidfd: no risk of hitting a reused pid.
	p.signalFn = func(sig syscall.Signal) error {
		if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return err
		}
		return nil
	}
	// Our unreaped child cannot disappear, so its stat is readable.
	st, err := readStat(p.pid)
	go func() {
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	if err != nil {
		cmd.Process.Kill()
		<-p.done
		return nil, err
	}
	p.startTime = st.startTime
	return p, nil
}

// attachProcess re-attaches to a process that is not our child. It
// returns vmm.ErrGone unless pid runs and started at startTime. Call
// release on the result if it is not kept.
func attachProcess(pid int, startTime uint64) (*process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, vmm.ErrGone)
	}
	// Open the pidfd first, then check the start time: if it matches, the
	// pidfd refers to that process (a reused pid would start later).
	pf, err := openPidfd(pid)
	switch {
	case errors.Is(err, unix.ESRCH):
		return nil, fmt.Errorf("pid %d: %w", pid, vmm.ErrGone)
	case errors.Is(err, unix.ENOSYS):
		pf = nil // kernel < 5.3: poll /proc instead
	case err != nil:
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	st, err := readStat(pid)
	if err != nil || st.startTime != startTime || st.state == 'Z' || st.state == 'X' {
		if pf != nil {
			pf.close()
		}
		if err == nil {
			err = fmt.Errorf("start time %d, state %c; want start time %d", st.startTime, st.state, startTime)
		}
		return nil, fmt.Errorf("pid %d: %v: %w", pid, err, vmm.ErrGone)
	}
	p := &process{pid: pid, startTime: startTime, done: make(chan struct{})}
	if pf == nil {
		stop := make(chan struct{})
		var once sync.Once
		p.release = func() { once.Do(func() { close(stop) }) }
		p.signalFn = func(sig syscall.Signal) error { return signalIfSame(pid, startTime, sig) }
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for sameProcess(pid, startTime) {
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
			close(p.done)
		}()
		return p, nil
	}
	p.release = pf.close
	p.signalFn = pf.signal
	go func() {
		if pf.wait() {
			close(p.done)
		}
		pf.close()
	}()
	return p, nil
}

// pidfd is a pidfd of a process that is not our child, registered with
// the runtime poller: it turns readable when the process exits, and
// closing it ends a wait.
type pidfd struct {
	f  *os.File
	rc syscall.RawConn
}

func openPidfd(pid int) (*pidfd, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so that os.NewFile hands it to the poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &pidfd{f: f, rc: rc}, nil
}

// wait blocks until the process exits (true) or the pidfd is closed
// (false).
func (p *pidfd) wait() bool {
	ready := func(fd uintptr) bool {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return err == nil && n > 0
	}
	err := p.rc.Read(ready)
	if err == nil {
		return true
	}
	if errors.Is(err, os.ErrClosed) {
		return false
	}
	// Not pollable after all: block in poll(2), which cannot be
	// interrupted; the process's exit ends it.
	var exited bool
	if cerr := p.rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
				exited = err == nil
				return
			}
		}
	}); cerr != nil {
		return false
	}
	return exited
}

func (p *pidfd) signal(sig syscall.Signal) error {
	var err error
	if cerr := p.rc.Control(func(fd uintptr) { err = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); cerr != nil {
		return nil // closed: the process has exited, or was released
	}
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

func (p *pidfd) close() { p.f.Close() }

func sameProcess(pid int, startTime uint64) bool {
	st, err := readStat(pid)
	return err == nil && st.startTime == startTime && st.state != 'Z' && st.state != 'X'
}

// signalIfSame is the fallback without pidfds; a pid reused between the
// check and the kill would be signalled (a narrow race).
func signalIfSame(pid int, startTime uint64, sig syscall.Signal) error {
	if !sameProcess(pid, startTime) {
		return nil
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// procStat holds what we read from /proc/<pid>/stat.
type procStat struct {
	state     byte
	cpu       time.Duration // utime + stime
	startTime uint64        // clock ticks after boot
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// parseStat parses the contents of /proc/<pid>/stat.
func parseStat(b []byte) (procStat, error) {
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses itself; the fields after the last ')' are plain.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("parse stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("parse stat: %d fields after the command name", len(f))
	}
	var n [3]uint64
	for j, field := range []int{14, 15, 22} {
		v, err := strconv.ParseUint(f[field-3], 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("parse stat field %d: %w", field, err)
		}
		n[j] = v
	}
	return procStat{
		state:     f[0][0],
		cpu:       time.Duration(n[0]+n[1]) * (time.Second / userHZ),
		startTime: n[2],
	}, nil
}
