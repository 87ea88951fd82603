package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/proc"
	"space/internal/qmp"
	"space/internal/vmm"
)

// ErrExited is returned by RSS and CPUTime once QEMU has exited.
var ErrExited = vmm.ErrExited

// VM is one running QEMU process. Its methods are safe for concurrent use.
type VM struct {
	log       *slog.Logger
	spec      Spec         // normalized
	cmd       *exec.Cmd    // or nil for a VM re-attached by Recover
	proc      *proc.Handle // the QEMU process, signalled and watched by pidfd
	startTime uint64       // the process start time, for the handle
	version   string       // QEMU's version, from the QMP greeting
	accel     string       // "kvm" or "tcg"
	// confinement is how QEMU is confined, observed once it ran; set by
	// Boot and Recover before the VM is returned.
	confinement vmm.Confinement
	stopGrace   time.Duration
	qmp         *qmp.Conn     // set by Boot before the VM is returned
	serial      net.Conn      // console connection; set by Boot before the VM is returned
	serialOut   *cappedFile   // serial.log
	stderr      *cappedFile   // qemu.log, written by exec's copier until reap
	done        chan struct{} // closed by reap once QEMU has exited and been reaped
	exitErr     error         // why QEMU exited, or nil for status 0; set before done is closed
	serialDone  chan struct{} // closed when copySerial returns
	stopping    atomic.Bool   // set by the first Stop
	stopped     chan struct{} // closed when the first Stop has finished
	stopErr     error         // the first Stop's result; set before stopped is closed
}

// AgentSocket returns the unix socket of the guest agent's virtio-serial
// port. It accepts one client at a time.
func (v *VM) AgentSocket() string { return v.spec.path(agentSocket) }

// Dir returns the VM's run directory.
func (v *VM) Dir() string { return v.spec.Dir }

// QMP returns the VM's QMP connection. Stop closes it.
func (v *VM) QMP() *qmp.Conn { return v.qmp }

// Pid returns QEMU's process id.
func (v *VM) Pid() int { return v.proc.Pid }

// Done is closed once QEMU has exited and been reaped.
func (v *VM) Done() <-chan struct{} { return v.done }

// Wait waits for QEMU to exit and returns nil if it exited with status 0,
// else an error that holds the end of its stderr. It does not clean up;
// call Stop for that.
func (v *VM) Wait(ctx context.Context) error {
	select {
	case <-v.done:
		return v.exitErr
	case <-ctx.Done():
		return fmt.Errorf("wait for vm %d: %w", v.Pid(), context.Cause(ctx))
	}
}

// SerialLog returns the console output captured so far (at most
// Spec.SerialLogLimit bytes). It works after Stop too.
func (v *VM) SerialLog() ([]byte, error) {
	b, err := os.ReadFile(v.spec.path(serialLog))
	if err != nil {
		return nil, fmt.Errorf("read console log: %w", err)
	}
	return b, nil
}

// RSS returns QEMU's resident set size in bytes (VmRSS; shared guest RAM
// pages count once touched). It returns ErrExited once QEMU has exited.
func (v *VM) RSS() (int64, error) {
	var rss int64
	err := v.readProc("status", func(b []byte) error {
		n, ok, err := proc.ParseVmRSS(b)
		if err == nil && !ok {
			return ErrExited // a zombie has no memory
		}
		rss = n
		return err
	})
	return rss, err
}

// CPUTime returns the user plus system CPU time all of QEMU's threads have
// used, in 10ms steps. It returns ErrExited once QEMU has exited.
func (v *VM) CPUTime() (time.Duration, error) {
	var d time.Duration
	err := v.readProc("stat", func(b []byte) error {
		var err error
		d, err = proc.ParseCPUTime(b)
		return err
	})
	return d, err
}

// readProc reads /proc/<pid>/name while QEMU is known not to have been
// reaped, so the pid cannot have been reused.
func (v *VM) readProc(name string, parse func([]byte) error) error {
	if v.exited() {
		return ErrExited
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(v.Pid()), name))
	if v.exited() {
		return ErrExited
	}
	if err != nil {
		return fmt.Errorf("read qemu %s: %w", name, err)
	}
	if err := parse(b); err != nil {
		return fmt.Errorf("read qemu %s: %w", name, err)
	}
	return nil
}

func (v *VM) exited() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

// Stop ends the VM: it sends QMP quit, kills QEMU if it has not exited
// within Config.StopGrace (or when ctx ends), reaps it, and removes the
// sockets and the memory file, keeping serial.log and qemu.log. Stop is
// idempotent: later calls wait for the first and return its result, or
// their ctx's cause if it ends first. It does not report how QEMU exited;
// Wait does.
func (v *VM) Stop(ctx context.Context) error {
	if v.stopping.CompareAndSwap(false, true) {
		v.stopErr = v.stop(ctx)
		close(v.stopped)
		return v.stopErr
	}
	select {
	case <-v.stopped:
		return v.stopErr
	case <-ctx.Done():
		return fmt.Errorf("stop vm %d: %w", v.Pid(), context.Cause(ctx))
	}
}

func (v *VM) stop(ctx context.Context) error {
	var errs []error
	if !v.exited() {
		gctx, cancel := context.WithTimeout(ctx, v.stopGrace)
		if err := v.qmp.Execute(gctx, "quit", nil, nil); err != nil {
			// QEMU may close the socket before replying; its exit is what counts.
			v.log.Debug("qmp quit", "err", err)
		}
		select {
		case <-v.done:
		case <-gctx.Done():
			v.log.Warn("qemu did not quit; killing it", "grace", v.stopGrace)
			errs = append(errs, v.kill())
		}
		cancel()
	}
	errs = append(errs, v.qmp.Close(), v.detachSerial())
	if err := v.serialOut.Err(); err != nil {
		v.log.Warn("console log write failed", "err", err)
	}
	if n := v.serialOut.Dropped(); n > 0 {
		v.log.Info("console output truncated", "dropped_bytes", n)
	}
	errs = append(errs, v.serialOut.Close(), v.proc.Close())
	if v.stderr != nil {
		errs = append(errs, v.stderr.Close())
	}
	for _, name := range []string{qmpSocket, serialSocket, agentSocket} {
		errs = append(errs, removeIfExists(v.spec.path(name)))
	}
	errs = append(errs, removeIfExists(v.spec.memoryPath()))
	v.log.Info("vm stopped", "exit", v.exitErr)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop vm %d: %w", v.Pid(), err)
	}
	return nil
}

// kill sends SIGKILL and waits until QEMU has been reaped.
func (v *VM) kill() error {
	if v.exited() {
		return nil
	}
	// Signalled through a pidfd, so this cannot hit a reused pid.
	if err := v.proc.Signal(unix.SIGKILL); err != nil && !errors.Is(err, proc.ErrGone) {
		return fmt.Errorf("kill qemu: %w", err)
	}
	<-v.done
	return nil
}

// reap waits for QEMU to exit; it is the goroutine that owns cmd.Wait (or,
// for a re-attached VM that is not our child, the pidfd wait).
func (v *VM) reap() {
	var err error
	if v.cmd != nil {
		err = v.cmd.Wait()
	} else {
		// The exit status belongs to our predecessor. Detach closes the
		// pidfd, which ends this wait without QEMU having exited.
		if werr := v.proc.Wait(context.Background()); errors.Is(werr, proc.ErrClosed) {
			return
		}
	}
	if err != nil {
		msg, _ := tail(v.spec.path(stderrLog), 2048)
		if s := strings.TrimSpace(string(msg)); s != "" {
			err = fmt.Errorf("qemu exited: %s: %w", s, err)
		} else {
			err = fmt.Errorf("qemu exited: %w", err)
		}
	}
	v.exitErr = err
	close(v.done)
}

// explain turns an error seen while talking to a starting QEMU into QEMU's
// own complaint when QEMU has exited (or exits shortly).
func (v *VM) explain(ctx context.Context, err error) error {
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-v.done:
		if v.exitErr != nil {
			return v.exitErr
		}
		return fmt.Errorf("qemu exited with status 0: %w", err)
	case <-ctx.Done():
	case <-t.C:
	}
	return err
}

// attachSerial connects to the console socket and starts copying it into
// serial.log. Once it returns nil, detachSerial must be called.
func (v *VM) attachSerial(ctx context.Context) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", v.spec.path(serialSocket))
	if err != nil {
		return fmt.Errorf("attach console: %w", err)
	}
	v.serial = c
	go v.copySerial()
	return nil
}

// waitSerialAccepted waits until QEMU has accepted the console connection:
// until then QEMU discards console output.
func (v *VM) waitSerialAccepted(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var chardevs []struct {
			Label    string `json:"label"`
			Filename string `json:"filename"`
		}
		if err := v.qmp.Execute(ctx, "query-chardev", nil, &chardevs); err != nil {
			return fmt.Errorf("attach console: %w", err)
		}
		for _, c := range chardevs {
			if c.Label == "ser0" && !strings.HasPrefix(c.Filename, "disconnected:") {
				return nil
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("attach console: %w", context.Cause(ctx))
		}
	}
}

// copySerial drains the console into serial.log until the connection ends.
func (v *VM) copySerial() {
	defer close(v.serialDone)
	if _, err := io.Copy(v.serialOut, v.serial); err != nil && !errors.Is(err, net.ErrClosed) {
		v.log.Debug("console copy ended", "err", err)
	}
}

func (v *VM) detachSerial() error {
	err := v.serial.Close()
	<-v.serialDone
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("detach console: %w", err)
	}
	return nil
}

// openProcess takes a pidfd on a process we just started.
func openProcess(pid int) (*proc.Handle, uint64, error) {
	start, err := proc.StartTime(pid)
	if err != nil {
		return nil, 0, fmt.Errorf("qemu process %d: %w", pid, err)
	}
	h, err := proc.Open(pid, start)
	return h, start, err
}
