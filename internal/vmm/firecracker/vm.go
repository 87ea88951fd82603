package firecracker

import (
	"context"
	"encoding/json"
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
	"syscall"
	"time"

	"space/internal/errkind"
	"space/internal/netns"
	"space/internal/proc"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
)

// killWait bounds the wait for a SIGKILLed Firecracker to go.
const killWait = 10 * time.Second

// VM is one Firecracker process and its guest. Its methods are safe for
// concurrent use.
type VM struct {
	log       *slog.Logger
	runDir    string
	stopGrace time.Duration

	// Set while the VM is built (Boot, Restore, Recover), then immutable.
	st      handleState // Snapshots is mu's; the rest is immutable
	api     *fcapi.Client
	proc    *process   // or nil until started
	keeper  *logKeeper // or nil; closed by teardown
	version string     // as GET /version reports it
	ver     fcapi.Version

	stopping atomic.Bool   // set by the first Stop
	stopped  chan struct{} // closed when the first Stop has finished
	stopErr  error         // the first Stop's result; set before stopped is closed

	mu sync.Mutex
	// +checklocks:mu
	snapshots int // snapshots taken of this guest (since boot, per the handle)
	// +checklocks:mu
	snapshotting bool
}

var (
	_ vmm.VM          = (*VM)(nil)
	_ vmm.Pauser      = (*VM)(nil)
	_ vmm.Detacher    = (*VM)(nil)
	_ vmm.Snapshotter = (*VM)(nil)
	_ vmm.Restorer    = (*Driver)(nil)
)

// handleState is the driver-private part of a vmm.Handle.
type handleState struct {
	ID        string     `json:"id"`         // Firecracker's --id
	APISocket string     `json:"api_socket"` // host path
	Root      string     `json:"root"`       // Firecracker's root: run dir or chroot
	Jail      *jailState `json:"jail,omitempty"`
	Layout    Layout     `json:"layout"`
	Netns     string     `json:"netns,omitempty"`     // network namespace Firecracker runs in
	Restored  bool       `json:"restored,omitempty"`  // the guest came from a snapshot
	Snapshots int        `json:"snapshots,omitempty"` // snapshots taken so far
	// Base is where a link to the guest's memory as of its last snapshot
	// or restore is kept (vmm.Spec.MemoryPath): a diff is merged onto a
	// copy of it. "" = none: a diff is a layer on its own.
	Base string `json:"base,omitempty"`
}

type jailState struct {
	Dir string `json:"dir"` // removed by Stop
	UID int    `json:"uid"`
	GID int    `json:"gid"`
}

func (d *Driver) newVM(runDir string, st handleState) *VM {
	return &VM{
		log:       d.log.With("vm_id", st.ID),
		runDir:    runDir,
		stopGrace: d.stopGrace,
		st:        st,
		api:       fcapi.New(st.APISocket),
		stopped:   make(chan struct{}),
		snapshots: st.Snapshots,
	}
}

// startProcess starts Firecracker (or the jailer) in placer's control
// group, if any.
func (v *VM) startProcess(cmd *exec.Cmd, placer vmm.Placer) error {
	console, err := openLog(filepath.Join(v.runDir, consoleLog), true)
	if err != nil {
		return err
	}
	defer console.Close()
	stderr, err := openLog(filepath.Join(v.runDir, vmmLog), true)
	if err != nil {
		return err
	}
	defer stderr.Close()
	// Files, not writers: Firecracker writes to them directly and no pipe
	// dies with this process.
	cmd.Stdout, cmd.Stderr = console, stderr
	var p *process
	// The jailer joins the namespace itself (--netns).
	nsPath := v.st.Netns
	if v.st.Jail != nil {
		nsPath = ""
	}
	err = netns.Do(nsPath, func() error {
		var err error
		p, err = startProcess(cmd, placer)
		return err
	})
	if err != nil {
		return fmt.Errorf("start firecracker: %w", err)
	}
	v.proc = p
	v.log = v.log.With("vm_pid", p.pid)
	return nil
}

// API returns the client of the VM's Firecracker API, for what the
// driver does not wrap (balloon, metrics, rate limits).
func (v *VM) API() *fcapi.Client { return v.api }

// Version returns the Firecracker version the VM runs.
func (v *VM) Version() string { return v.version }

// Done is closed once the Firecracker process has exited.
func (v *VM) Done() <-chan struct{} { return v.proc.done }

// Handle returns the VM's persistable identity. It changes when a
// snapshot is taken (the count decides whether a later diff is loadable):
// persist it again then.
func (v *VM) Handle() vmm.Handle {
	st := v.st
	v.mu.Lock()
	st.Snapshots = v.snapshots
	v.mu.Unlock()
	raw, err := json.Marshal(st)
	if err != nil {
		panic(fmt.Sprintf("marshal firecracker handle state: %v", err))
	}
	return vmm.Handle{
		Driver:    "firecracker",
		Version:   v.version,
		PID:       v.proc.pid,
		StartTime: v.proc.startTime,
		RunDir:    v.runDir,
		Agent:     vmm.AgentEndpoint{Kind: "hybrid-vsock", Path: filepath.Join(st.Root, st.Layout.Vsock.Path), Port: st.Layout.Vsock.Port},
		Accel:     "kvm",
		State:     raw,
	}
}

// Info describes the Firecracker process; vmm.ErrExited once it ended.
func (v *VM) Info() (vmm.ProcessInfo, error) {
	pid := v.proc.pid
	gone := fmt.Errorf("vm %d: %w", pid, vmm.ErrExited)
	if v.proc.exited() || !sameProcess(pid, v.proc.startTime) {
		return vmm.ProcessInfo{}, gone
	}
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	// Read stat after status: if it is still our process, status was too.
	st, serr := proc.ReadStat(pid)
	if serr != nil || st.StartTime != v.proc.startTime || !st.Alive() {
		return vmm.ProcessInfo{}, gone
	}
	if err != nil {
		return vmm.ProcessInfo{}, fmt.Errorf("vm %d: %w", pid, err)
	}
	rss, ok, err := proc.ParseVmRSS(status)
	if err != nil {
		return vmm.ProcessInfo{}, fmt.Errorf("vm %d: %w", pid, err)
	}
	if !ok {
		return vmm.ProcessInfo{}, gone
	}
	return vmm.ProcessInfo{PID: pid, RSS: rss, CPUTime: st.CPU}, nil
}

// Pause stops the vCPUs. Pausing a paused VM does nothing.
func (v *VM) Pause(ctx context.Context) error { return v.patchVM(ctx, fcapi.Paused) }

// Resume restarts the vCPUs. Resuming a running VM does nothing.
func (v *VM) Resume(ctx context.Context) error { return v.patchVM(ctx, fcapi.Resumed) }

func (v *VM) patchVM(ctx context.Context, s fcapi.VMState) error {
	verb := strings.ToLower(strings.TrimSuffix(string(s), "d"))
	if v.proc.exited() || v.stopping.Load() {
		return fmt.Errorf("%s vm %d: %w", verb, v.proc.pid, vmm.ErrExited)
	}
	wctx, done := v.watch(ctx)
	defer done()
	if err := v.api.PatchVM(wctx, s); err != nil {
		if v.proc.exited() {
			err = vmm.ErrExited
		}
		return fmt.Errorf("%s vm %d: %w", verb, v.proc.pid, err)
	}
	return nil
}

// SerialLog returns the guest's console output kept so far (the rotated
// part, then the current one; each at most Config.LogLimit bytes, plus
// what arrived within a second). It works after Stop too.
func (v *VM) SerialLog() ([]byte, error) {
	path := filepath.Join(v.runDir, consoleLog)
	old, err := os.ReadFile(rotated(path))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read console log: %w", err)
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read console log: %w", err)
	}
	return append(old, cur...), nil
}

// Detach lets go of the VM without stopping it, for a successor to
// Recover it from its Handle (vmm.Detacher): it stops the log keeper,
// closes the API client and stops watching the process. Firecracker runs
// on and keeps appending to its logs (uncapped until someone recovers
// it). After Detach only Handle may be called; Stop returns an
// errkind.FailedPrecondition error.
func (v *VM) Detach() error {
	if !v.stopping.CompareAndSwap(false, true) {
		return fmt.Errorf("detach vm %d: already stopped or detached: %w", v.proc.pid, errkind.FailedPrecondition)
	}
	var err error
	if v.keeper != nil {
		err = v.keeper.Close()
		v.keeper = nil
	}
	v.api.Close()
	if v.proc.release != nil {
		v.proc.release()
	}
	v.stopErr = fmt.Errorf("vm %d was detached: %w", v.proc.pid, errkind.FailedPrecondition)
	close(v.stopped)
	v.log.Info("vm detached")
	return err
}

// watch returns a ctx that also ends (with vmm.ErrExited) when
// Firecracker exits, so that no call waits on a dead process.
func (v *VM) watch(ctx context.Context) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-v.proc.done:
			cancel(vmm.ErrExited)
		case <-stop:
		}
	})
	return wctx, func() {
		close(stop)
		wg.Wait()
		cancel(nil)
	}
}

// Stop ends the VM: SIGTERM (which ends Firecracker at once: it has no
// handler for it), SIGKILL after Config.StopGrace or when ctx ends, then
// it removes the sockets, links and jail, keeping the logs. Stop is
// idempotent: later calls wait for the first and return its result, or
// their ctx's cause if it ends first. It works on a recovered VM, which
// is not this process's child.
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
		return fmt.Errorf("stop vm %d: %w", v.proc.pid, context.Cause(ctx))
	}
}

func (v *VM) stop(ctx context.Context) error {
	if err := v.terminate(ctx); err != nil {
		// Still running: its sockets and jail stay too.
		return fmt.Errorf("stop vm %d: %w", v.proc.pid, err)
	}
	if err := v.teardown(); err != nil {
		return fmt.Errorf("stop vm %d: %w", v.proc.pid, err)
	}
	v.log.Info("vm stopped", "exit", v.proc.exitErr)
	return nil
}

func (v *VM) terminate(ctx context.Context) error {
	p := v.proc
	if p.exited() {
		return nil
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		v.log.Warn("sigterm", "err", err)
	}
	t := time.NewTimer(v.stopGrace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		v.log.Warn("firecracker did not exit on sigterm; killing it", "grace", v.stopGrace)
	case <-ctx.Done():
	}
	return v.kill()
}

// kill sends SIGKILL and waits (boundedly) for the process to go.
func (v *VM) kill() error {
	p := v.proc
	if p == nil || p.exited() {
		return nil
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("firecracker %d still runs %v after SIGKILL: %w", p.pid, killWait, errkind.Unavailable)
	}
}

// teardown removes what the VM put in Firecracker's root (the whole jail
// when jailed) and stops the log keeper. Firecracker must have exited.
func (v *VM) teardown() error {
	var errs []error
	if v.keeper != nil {
		errs = append(errs, v.keeper.Close())
		v.keeper = nil
	}
	v.api.Close()
	if v.st.Base != "" {
		errs = append(errs, removeIfExists(v.st.Base))
	}
	if v.st.Jail != nil {
		errs = append(errs, os.RemoveAll(v.st.Jail.Dir))
		return errors.Join(errs...)
	}
	names := []string{apiSocket, vsockSocket, logFIFO}
	for _, d := range v.st.Layout.Disks {
		names = append(names, d.Path)
	}
	for _, name := range names {
		errs = append(errs, removeIfExists(filepath.Join(v.st.Root, name)))
	}
	return errors.Join(errs...)
}

// abort undoes a VM whose construction failed after start returned it.
func (v *VM) abort(ctx context.Context, err error) error {
	err = v.explain(ctx, err)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	v.stopGrace = 0
	return errors.Join(err, v.Stop(cctx))
}

// explain adds Firecracker's last words to an error seen while it
// started, if it has exited (or exits shortly).
func (v *VM) explain(ctx context.Context, err error) error {
	if v.proc == nil {
		return err
	}
	// A failed call may be the first sign of an exit: then wait a little
	// for it. An answer (even a refusal) means Firecracker is alive.
	if !v.proc.exited() {
		if !errors.Is(err, errkind.Unavailable) && !errors.Is(err, vmm.ErrExited) {
			return err
		}
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case <-v.proc.done:
		case <-ctx.Done():
			return err
		case <-t.C:
			return err
		}
	}
	var words []string
	for _, name := range []string{vmmLog, consoleLog} {
		if s := strings.TrimSpace(string(tail(filepath.Join(v.runDir, name), 1024))); s != "" {
			words = append(words, name+": "+s)
		}
	}
	how := "with status 0"
	if v.proc.exitErr != nil {
		how = "(" + v.proc.exitErr.Error() + ")"
	}
	return fmt.Errorf("firecracker exited %s; %s: %w", how, strings.Join(words, "; "), err)
}
