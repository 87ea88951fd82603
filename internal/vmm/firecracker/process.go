package firecracker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"space/internal/proc"
	"space/internal/vmm"
)

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
func startProcess(cmd *exec.Cmd, placer vmm.Placer) (*process, error) {
	placed := func(int) error { return nil }
	if placer != nil {
		after, release, err := placer.Place(cmd)
		if err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		defer release()
		placed = after
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := placed(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("cgroup: %w", err)
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
	st, err := proc.ReadStat(p.pid)
	go func() {
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	if err != nil {
		cmd.Process.Kill()
		<-p.done
		return nil, err
	}
	p.startTime = st.StartTime
	return p, nil
}

// attachProcess re-attaches to a process that is not our child. It
// returns vmm.ErrGone unless pid runs and started at startTime. Call
// release on the result if it is not kept.
func attachProcess(pid int, startTime uint64) (*process, error) {
	h, err := proc.Open(pid, startTime)
	if errors.Is(err, proc.ErrGone) {
		return nil, fmt.Errorf("pid %d: %w", pid, vmm.ErrGone)
	}
	if err != nil {
		return nil, err
	}
	p := &process{pid: pid, startTime: startTime, done: make(chan struct{})}
	p.release = func() { h.Close() }
	p.signalFn = func(sig syscall.Signal) error {
		if err := h.Signal(sig); err != nil && !errors.Is(err, proc.ErrGone) {
			return err
		}
		return nil
	}
	go func() {
		// Release closes the pidfd, which ends the wait without an exit.
		if h.Wait(context.Background()) == nil {
			close(p.done)
		}
		h.Close()
	}()
	return p, nil
}

// sameProcess reports whether pid still names the live process that
// started at startTime.
func sameProcess(pid int, startTime uint64) bool {
	st, err := proc.ReadStat(pid)
	return err == nil && st.StartTime == startTime && st.Alive()
}
