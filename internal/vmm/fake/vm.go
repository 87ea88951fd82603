package fake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/proc"
	"space/internal/vmm"
)

// VM is one fake guest: a jailed process and the processes it started,
// in a PID namespace of their own. Its methods are safe for concurrent use.
type VM struct {
	d       *Driver
	log     *slog.Logger
	h       vmm.Handle
	st      state
	cmd     *exec.Cmd     // or nil for a guest re-attached by Recover
	proc    *proc.Handle  // the guest's PID 1, signalled and watched by pidfd
	done    chan struct{} // closed once the guest has exited
	stopped chan struct{} // closed when the first Stop or Detach has finished
	// stopErr is the first Stop's result; set before stopped is closed.
	stopErr  error
	stopping atomic.Bool // set by the first Stop or Detach

	mu sync.Mutex // serializes Pause, Resume and Snapshot
	// +checklocks:mu
	paused bool
}

func newVM(d *Driver, h vmm.Handle, st state, p *proc.Handle, cmd *exec.Cmd) *VM {
	v := &VM{
		d: d, log: d.log.With("vm_pid", h.PID, "dir", h.RunDir), h: h, st: st, cmd: cmd, proc: p,
		done: make(chan struct{}), stopped: make(chan struct{}),
	}
	go v.reap()
	return v
}

// reap waits for the guest to exit: cmd.Wait for our child, the pidfd for
// a recovered guest (Detach ends that wait without the guest exiting).
func (v *VM) reap() {
	if v.cmd != nil {
		if err := v.cmd.Wait(); err != nil {
			v.log.Info("fake guest exited", "err", err)
		}
	} else if err := v.proc.Wait(context.Background()); errors.Is(err, proc.ErrClosed) {
		return
	}
	close(v.done)
}

// Handle returns the guest's persistable identity (vmm.VM).
func (v *VM) Handle() vmm.Handle { return v.h }

// Done is closed once the guest's PID 1 has exited (vmm.VM); the kernel
// has then ended every other process of the guest too.
func (v *VM) Done() <-chan struct{} { return v.done }

func (v *VM) exited() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

// Info describes the guest's PID 1, the agent (vmm.VM): its resident
// size and CPU time, not those of the processes it started.
// vmm.ErrExited once it ended.
func (v *VM) Info() (vmm.ProcessInfo, error) {
	if v.exited() {
		return vmm.ProcessInfo{}, vmm.ErrExited
	}
	dir := filepath.Join("/proc", strconv.Itoa(v.h.PID))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		if v.exited() {
			return vmm.ProcessInfo{}, vmm.ErrExited
		}
		return vmm.ProcessInfo{}, fmt.Errorf("info vm %d: %w", v.h.PID, err)
	}
	st, err := proc.ReadStat(v.h.PID)
	if v.exited() || errors.Is(err, proc.ErrGone) {
		return vmm.ProcessInfo{}, vmm.ErrExited
	}
	if err != nil {
		return vmm.ProcessInfo{}, fmt.Errorf("info vm %d: %w", v.h.PID, err)
	}
	rss, ok, err := proc.ParseVmRSS(status)
	if err != nil {
		return vmm.ProcessInfo{}, fmt.Errorf("info vm %d: %w", v.h.PID, err)
	}
	if !ok {
		return vmm.ProcessInfo{}, vmm.ErrExited // a zombie has no memory
	}
	return vmm.ProcessInfo{PID: v.h.PID, RSS: rss, CPUTime: st.CPU}, nil
}

// Stop kills the guest, waits for it and removes its socket, and its
// writable dirs when they live in the run dir; fake.log stays (vmm.VM).
// A fake guest holds nothing worth a graceful end, so there is no grace
// period. Idempotent: later calls wait for the first and return its
// result, or their ctx's cause if it ends first.
func (v *VM) Stop(ctx context.Context) error {
	if err := v.d.fault(ctx, PointStop); err != nil {
		return fmt.Errorf("stop vm %d: %w", v.h.PID, err)
	}
	if v.stopping.CompareAndSwap(false, true) {
		v.stopErr = v.stop(ctx)
		close(v.stopped)
		return v.stopErr
	}
	select {
	case <-v.stopped:
		return v.stopErr
	case <-ctx.Done():
		return fmt.Errorf("stop vm %d: %w", v.h.PID, context.Cause(ctx))
	}
}

func (v *VM) stop(ctx context.Context) error {
	var errs []error
	if !v.exited() {
		// SIGKILL works on a stopped (paused) process too. PID 1's end
		// takes the namespace's other processes with it.
		if err := v.proc.Signal(unix.SIGKILL); err != nil && !errors.Is(err, proc.ErrGone) {
			errs = append(errs, fmt.Errorf("kill: %w", err))
		}
		select {
		case <-v.done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("wait for the guest: %w", context.Cause(ctx)))
		}
	}
	errs = append(errs, v.proc.Close(), removeIfExists(v.h.Agent.Path))
	if v.st.NICSocket != "" {
		errs = append(errs, removeIfExists(v.st.NICSocket))
	}
	if v.st.OwnGuestDir {
		errs = append(errs, os.RemoveAll(v.st.GuestDir))
	}
	v.log.Info("fake guest stopped")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop vm %d: %w", v.h.PID, err)
	}
	return nil
}

// Detach lets go of the guest without stopping it, for Recover by a
// successor (vmm.Detacher). After Detach only Handle may be called.
func (v *VM) Detach() error {
	if !v.stopping.CompareAndSwap(false, true) {
		return fmt.Errorf("detach vm %d: already stopped or detached: %w", v.h.PID, errkind.FailedPrecondition)
	}
	err := v.proc.Close()
	v.stopErr = fmt.Errorf("vm %d was detached: %w", v.h.PID, errkind.FailedPrecondition)
	close(v.stopped)
	v.log.Info("fake guest detached")
	return err
}

// Pause stops every process of the guest (SIGSTOP) and returns once they
// all are stopped (vmm.Pauser): the agent does not answer until Resume.
func (v *VM) Pause(ctx context.Context) error {
	if err := v.d.fault(ctx, PointPause); err != nil {
		return fmt.Errorf("pause vm %d: %w", v.h.PID, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.pauseLocked(ctx); err != nil {
		// Half stopped is not paused: let the guest run on.
		return fmt.Errorf("pause vm %d: %w", v.h.PID, errors.Join(err, v.resumeLocked()))
	}
	return nil
}

// Resume continues the guest's processes (vmm.Pauser).
func (v *VM) Resume(ctx context.Context) error {
	if err := v.d.fault(ctx, PointResume); err != nil {
		return fmt.Errorf("resume vm %d: %w", v.h.PID, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.resumeLocked(); err != nil {
		return fmt.Errorf("resume vm %d: %w", v.h.PID, err)
	}
	return nil
}

// +checklocks:v.mu
func (v *VM) pauseLocked(ctx context.Context) error {
	if v.exited() {
		return vmm.ErrExited
	}
	// PID 1 first: a stopped agent starts nothing new. Then its
	// processes, until a scan finds every one stopped (a process may fork
	// until its own SIGSTOP lands).
	if err := v.proc.Signal(unix.SIGSTOP); err != nil {
		return vmm.ErrExited
	}
	v.paused = true
	// A process in uninterruptible sleep ('D') takes its SIGSTOP only when
	// it leaves the kernel, and it may never leave while the guest is
	// stopped: a vfork parent waits there for a child that was stopped
	// before it could exec. Once signalled, it runs no more of its own
	// code, so it counts as stopped.
	signalled := map[int]bool{v.h.PID: true}
	deadline := time.Now().Add(pauseTimeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		pids, err := v.members()
		if err != nil {
			return err
		}
		var running []string
		for _, pid := range pids {
			s, err := proc.ReadStat(pid)
			if err != nil || !s.Alive() || s.State == 'T' || s.State == 't' {
				continue
			}
			if s.State == 'D' && signalled[pid] {
				continue
			}
			running = append(running, fmt.Sprintf("%d (%s, state %c)", pid, comm(pid), s.State))
			if pid != v.h.PID {
				unix.Kill(pid, unix.SIGSTOP) // a pid of the guest's namespace, just read: ESRCH at worst
				signalled[pid] = true
			}
		}
		if len(running) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("guest processes still running %s after SIGSTOP: %s", pauseTimeout, strings.Join(running, ", "))
		}
		select {
		case <-tick.C:
		case <-v.done:
			return vmm.ErrExited
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// +checklocks:v.mu
func (v *VM) resumeLocked() error {
	if v.exited() {
		return vmm.ErrExited
	}
	pids, err := v.members()
	if err != nil {
		return err
	}
	// The others first, PID 1 last, so the agent finds its processes
	// running again.
	for _, pid := range pids {
		if pid != v.h.PID {
			unix.Kill(pid, unix.SIGCONT)
		}
	}
	if err := v.proc.Signal(unix.SIGCONT); err != nil {
		return vmm.ErrExited
	}
	v.paused = false
	return nil
}

// members returns the host pids of the processes in the guest's PID
// namespace, PID 1 included.
func (v *VM) members() ([]int, error) {
	ns, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(v.h.PID), "ns", "pid"))
	if err != nil {
		return nil, vmm.ErrExited
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	pids := []int{v.h.PID}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == v.h.PID {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "pid")); err == nil && l == ns {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// comm returns a process's command name, for messages.
func comm(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
