package firecracker

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"space/internal/errkind"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
)

// Recover re-attaches to the VM h describes, typically after a restart of
// the calling process. The VM is not this process's child: the driver
// learns of its exit through a pidfd. It returns vmm.ErrGone when the
// process no longer runs or its pid now belongs to another process (the
// start time differs), and an errkind.InvalidArgument error for a handle
// of another driver. The caller must Stop the returned VM (a *VM).
func (d *Driver) Recover(ctx context.Context, h vmm.Handle) (_ vmm.VM, err error) {
	if h.Driver != "firecracker" {
		return nil, fmt.Errorf("recover vm: handle of driver %q: %w", h.Driver, errkind.InvalidArgument)
	}
	var st handleState
	if err := json.Unmarshal(h.State, &st); err != nil {
		return nil, fmt.Errorf("recover vm %d: handle state: %v: %w", h.PID, err, errkind.InvalidArgument)
	}
	if st.ID == "" || st.Root == "" || st.APISocket == "" || h.RunDir == "" {
		return nil, fmt.Errorf("recover vm %d: incomplete handle: %w", h.PID, errkind.InvalidArgument)
	}
	p, err := attachProcess(h.PID, h.StartTime)
	if err != nil {
		return nil, fmt.Errorf("recover vm: %w", err)
	}
	v := d.newVM(h.RunDir, st)
	v.proc = p
	v.log = v.log.With("vm_pid", p.pid)
	defer func() {
		if err != nil {
			p.release()
		}
	}()

	wctx, done := v.watch(ctx)
	defer done()
	info, err := v.api.Instance(wctx)
	if err != nil {
		if p.exited() {
			err = vmm.ErrGone
		}
		return nil, fmt.Errorf("recover vm %d: %w", p.pid, err)
	}
	if info.ID != st.ID {
		return nil, fmt.Errorf("recover vm %d: %s answers as instance %q, want %q: %w", p.pid, st.APISocket, info.ID, st.ID, errkind.FailedPrecondition)
	}
	if info.State == fcapi.StateNotStarted {
		return nil, fmt.Errorf("recover vm %d: instance was never started: %w", p.pid, errkind.FailedPrecondition)
	}
	v.version = info.VMMVersion
	if v.ver, err = fcapi.ParseVersion(v.version); err != nil {
		return nil, fmt.Errorf("recover vm %d: %w", p.pid, err)
	}
	v.keeper, err = startLogKeeper(v.log, filepath.Join(st.Root, logFIFO), filepath.Join(h.RunDir, vmmLog),
		[]string{filepath.Join(h.RunDir, consoleLog), filepath.Join(h.RunDir, vmmLog)}, d.logLimit, d.capInterval)
	if err != nil {
		return nil, fmt.Errorf("recover vm %d: %w", p.pid, err)
	}
	v.log.Info("vm recovered", "state", info.State, "version", v.version)
	return v, nil
}
