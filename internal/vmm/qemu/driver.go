package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"space/internal/errkind"
	"space/internal/proc"
	"space/internal/qmp"
	"space/internal/tap"
	"space/internal/vmm"
)

var (
	_ vmm.Driver   = (*Driver)(nil)
	_ vmm.VM       = (*VM)(nil)
	_ vmm.Pauser   = (*VM)(nil)
	_ vmm.Detacher = (*VM)(nil)
)

// Boot starts a VM for the driver-neutral spec (vmm.Driver). Disks are raw;
// the accelerator is the one Accel chose.
func (d *Driver) Boot(ctx context.Context, s vmm.Spec) (vmm.VM, error) {
	accel, err := d.Accel(ctx, s.Kernel)
	if err != nil {
		return nil, err
	}
	spec := Spec{
		Dir: s.RunDir, Kernel: s.Kernel, Initrd: s.Initrd, Cmdline: s.Cmdline,
		VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB, Accel: accel, Placer: s.Placer, MemoryPath: s.MemoryPath,
	}
	if accel != "kvm" && !d.tcgASLR {
		spec.Cmdline += " norandmaps" // see Config.TCGGuestASLR
	}
	for _, disk := range s.Disks {
		spec.Disks = append(spec.Disks, Disk{Path: disk.Path, Format: "raw", ReadOnly: disk.ReadOnly})
	}
	nic, err := openNIC(s.NIC)
	if err != nil {
		return nil, err
	}
	if nic != nil {
		defer nic.closeTap() // QEMU has its own copy
		spec.NIC = nic
	}
	if !d.noVsock && vsockAvailable() {
		vs, err := OpenVsock()
		if err != nil {
			return nil, err
		}
		defer vs.FD.Close() // QEMU has its own copy
		spec.Vsock = vs
		spec.Cmdline += " space.transport=vsock space.vsock_port=1024"
	}
	v, err := d.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// handleState is the driver-private part of a vmm.Handle.
type handleState struct {
	Spec Spec `json:"spec"` // normalized
	// Missing is what Boot could not confine (vmm.Confinement.Missing).
	Missing string `json:"missing,omitempty"`
}

// Handle returns the VM's persistable identity.
func (v *VM) Handle() vmm.Handle {
	state, _ := json.Marshal(handleState{Spec: v.spec, Missing: v.confinement.Missing}) // plain data: cannot fail
	c := v.confinement
	return vmm.Handle{
		Confinement: &c,
		Driver:      "qemu",
		Version:     v.version,
		PID:         v.proc.Pid,
		StartTime:   v.startTime,
		RunDir:      v.spec.Dir,
		Agent:       v.agentEndpoint(),
		Memory:      v.spec.guestMemory(),
		Accel:       v.accel,
		State:       state,
	}
}

// Recover re-attaches to a QEMU started by an earlier process (vmm.Driver):
// it checks the pid still names that QEMU, reconnects QMP and the console,
// and watches the process through a pidfd. vmm.ErrGone when it has exited.
func (d *Driver) Recover(ctx context.Context, h vmm.Handle) (_ vmm.VM, err error) {
	if h.Driver != "qemu" {
		return nil, fmt.Errorf("recover: handle of driver %q: %w", h.Driver, errkind.InvalidArgument)
	}
	var st handleState
	if err := json.Unmarshal(h.State, &st); err != nil {
		return nil, fmt.Errorf("recover: handle state: %v: %w", err, errkind.InvalidArgument)
	}
	p, err := proc.Open(h.PID, h.StartTime)
	if errors.Is(err, proc.ErrGone) {
		return nil, fmt.Errorf("recover qemu %d: %w", h.PID, vmm.ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("recover qemu %d: %w", h.PID, err)
	}
	var undo undoStack
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("recover qemu %d: %w", h.PID, err), undo.run())
		}
	}()
	undo.push(p.Close)
	spec := st.Spec
	f, err := os.OpenFile(spec.path(serialLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	// The cap counts what the first process wrote.
	limit := spec.SerialLogLimit
	if fi, err := f.Stat(); err == nil {
		limit = max(0, limit-fi.Size())
	}
	serialOut := newCappedFile(f, limit)
	undo.push(serialOut.Close)
	v := &VM{
		log:        d.log.With("vm_pid", h.PID, "dir", spec.Dir),
		spec:       spec,
		proc:       p,
		startTime:  h.StartTime,
		version:    h.Version,
		accel:      h.Accel,
		stopGrace:  d.stopGrace,
		serialOut:  serialOut,
		done:       make(chan struct{}),
		serialDone: make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	go v.reap()
	if v.confinement, err = observeConfinement(h.PID, st.Missing); err != nil {
		return nil, err
	}
	// On failure the VM keeps running: recovery failing is no reason to
	// kill a guest. Only our own goroutine and connections go.
	v.qmp, err = qmp.Dial(ctx, spec.path(qmpSocket))
	if err != nil {
		return nil, fmt.Errorf("reconnect qmp: %w", err)
	}
	undo.push(v.qmp.Close)
	if err := v.attachSerial(ctx); err != nil {
		return nil, err
	}
	v.log.Info("vm re-attached", "version", v.version, "accel", v.accel, "confinement", v.confinement)
	return v, nil
}

// Pause stops the guest's vCPUs (vmm.Pauser).
func (v *VM) Pause(ctx context.Context) error {
	if err := v.qmp.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pause vm %d: %w", v.Pid(), err)
	}
	return nil
}

// Resume restarts the guest's vCPUs (vmm.Pauser).
func (v *VM) Resume(ctx context.Context) error {
	if err := v.qmp.Execute(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("resume vm %d: %w", v.Pid(), err)
	}
	return nil
}

// Info describes the QEMU process (vmm.VM).
func (v *VM) Info() (vmm.ProcessInfo, error) {
	rss, err := v.RSS()
	if err != nil {
		return vmm.ProcessInfo{}, err
	}
	cpu, err := v.CPUTime()
	if err != nil {
		return vmm.ProcessInfo{}, err
	}
	return vmm.ProcessInfo{PID: v.Pid(), RSS: rss, CPUTime: cpu}, nil
}

// Detach closes this process's connections to QEMU and stops watching it,
// leaving the VM running for Recover (vmm.Detacher).
func (v *VM) Detach() error {
	if !v.stopping.CompareAndSwap(false, true) {
		return fmt.Errorf("detach vm %d: already stopped or detached: %w", v.Pid(), errkind.FailedPrecondition)
	}
	errs := []error{v.qmp.Close(), v.detachSerial(), v.serialOut.Close(), v.proc.Close()}
	if v.stderr != nil {
		// QEMU's stderr pipe breaks with this process; it ignores SIGPIPE
		// and keeps running, but later complaints are lost.
		errs = append(errs, v.stderr.Close())
	}
	v.stopErr = fmt.Errorf("vm %d was detached: %w", v.Pid(), errkind.FailedPrecondition)
	close(v.stopped)
	v.log.Info("vm detached")
	return errors.Join(errs...)
}

// openNIC opens the tap of a vmm.NIC for QEMU, or returns nil for none.
func openNIC(n *vmm.NIC) (*NIC, error) {
	if n == nil {
		return nil, nil
	}
	if n.Socket != "" {
		return &NIC{Socket: n.Socket, MAC: n.MAC}, nil
	}
	f, err := tap.Open(n.Netns, n.TapName)
	if err != nil {
		return nil, err
	}
	return &NIC{Tap: f, MAC: n.MAC}, nil
}

// agentEndpoint is where the host reaches the agent: vsock when the VM has
// a vhost-vsock device, else the virtio-serial socket.
func (v *VM) agentEndpoint() vmm.AgentEndpoint {
	if v.spec.Vsock != nil {
		return vmm.AgentEndpoint{Kind: "vsock", CID: v.spec.Vsock.CID, Port: agentVsockPort}
	}
	return vmm.AgentEndpoint{Kind: "unix", Path: v.AgentSocket()}
}
