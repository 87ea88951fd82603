package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"space/api"
	"space/internal/errkind"
	"space/internal/store"
	"space/internal/workerproto"
)

// Which workers may start a sandbox from a snapshot. A VMM restores only
// snapshots of its own kind and version: QEMU loads a migration stream
// only in the version that wrote it, Firecracker a snapshot only in a
// release of the same snapshot format, and the fake VMM only its own
// (each driver refuses any other version with vmm.ErrIncompatible). So
// a snapshot's metadata records the VMM that took it (vmmID), and a
// restore, a fork's children, a resume and a create from a template's
// snapshot are placed only on workers whose capabilities match it:
//
//   - the kind must be the same; a worker that states no kind matches no
//     snapshot that records one;
//   - the version must be the same where both are known; a worker of the
//     kind whose version is not known matches too, but is taken only
//     when no exact match has room (its driver still checks);
//   - the accelerator is recorded for information and not compared.
//
// A snapshot whose metadata records no VMM (taken before it was
// recorded, or by a VM and worker that said nothing of theirs) may start
// on any worker, as before; the worker's driver refuses one it cannot
// load. When no connected worker matches, placement fails with
// FailedPrecondition (a worker running that VMM must connect, or the
// sandbox be built again on one that is there); when matching workers
// are known but unhealthy, or unhealthy workers have not said what they
// run, with Unavailable (they may come back); when matching workers have
// no room, with Unavailable, as any placement.

// vmmKinds are the VMM kinds a snapshot's metadata records.
var vmmKinds = []string{"qemu", "firecracker", "fake"}

// vmmID is the VMM that took a snapshot. The zero value says nothing.
type vmmID struct {
	Kind    string `json:"kind"`              // one of vmmKinds
	Version string `json:"version,omitempty"` // "" = not known
	Accel   string `json:"accel,omitempty"`   // for information; not compared
}

// takenBy returns the VMM a snapshot of a sandbox whose VM is vm (or
// nil), on a worker with capabilities caps (or nil), is taken by: the
// VM's own, which is what wrote the snapshot (a VM started before its
// worker's VMM was upgraded keeps its version), or, when the VM does not
// name a known kind, the worker's.
func takenBy(vm *api.VMInfo, caps *workerproto.Capabilities) vmmID {
	switch {
	case vm != nil && slices.Contains(vmmKinds, vm.VMM):
		return vmmID{Kind: vm.VMM, Version: vm.VMMVersion, Accel: vm.Accel}
	case caps != nil && slices.Contains(vmmKinds, caps.VMM):
		return vmmID{Kind: caps.VMM, Version: caps.VMMVersion, Accel: caps.Accel}
	}
	return vmmID{}
}

// match reports whether a worker with capabilities c may restore a
// snapshot taken by v (see the rules above), and whether that is certain
// (exact) rather than only possible (the worker's version is not known).
func (v vmmID) match(c workerproto.Capabilities) (ok, exact bool) {
	switch {
	case v.Kind == "":
		return true, true
	case c.VMM != v.Kind:
		return false, false
	case v.Version == "" || c.VMMVersion == v.Version:
		return true, true
	}
	return c.VMMVersion == "", false
}

func (v vmmID) String() string {
	if v.Version == "" {
		return v.Kind + " (version not known)"
	}
	return v.Kind + " " + v.Version
}

// capsString names the VMM capabilities c state: "qemu 8.2.0".
func capsString(c workerproto.Capabilities) string {
	if c.VMM == "" {
		return "no vmm stated"
	}
	return vmmID{Kind: c.VMM, Version: c.VMMVersion}.String()
}

// lastCaps returns what wk last said it can do, without asking it: its
// last successful probe's answer, or else what it stated at
// registration.
func (s *Server) lastCaps(wk Worker) (workerproto.Capabilities, bool) {
	s.mu.Lock()
	p := s.probes[wk.ID()]
	probed := p != nil && p.answered
	var c workerproto.Capabilities
	if probed {
		c = p.status.Capabilities
	}
	s.mu.Unlock()
	if probed {
		return c, true
	}
	if rm, ok := wk.(*Remote); ok {
		if _, c := rm.statement(); c != nil {
			return *c, true
		}
	}
	return workerproto.Capabilities{}, false
}

// capsOf returns wk's capabilities: what it last said, or, if it has
// said nothing yet, its answer now; ok is false if it does not answer.
func (s *Server) capsOf(ctx context.Context, wk Worker) (workerproto.Capabilities, bool) {
	if c, ok := s.lastCaps(wk); ok {
		return c, true
	}
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := wk.Status(sctx)
	return st.Capabilities, err == nil
}

// snapshotVMM returns the VMM a snapshot of sb, which runs on wk, is
// taken by (see takenBy); the worker is asked only when sb's VM does not
// say.
func (s *Server) snapshotVMM(ctx context.Context, sb store.Sandbox, wk Worker) vmmID {
	if st, err := handleOf(sb); err == nil {
		if id := takenBy(st.VM, nil); id.Kind != "" {
			return id
		}
	}
	// A handle that does not decode names no VM: the worker's VMM took it.
	c, ok := s.capsOf(ctx, wk)
	if !ok {
		return vmmID{}
	}
	return takenBy(nil, &c)
}

// checkWorkerVMM returns nil if wk, the one worker a sandbox from
// snapshot snap (taken by want) may start on, may restore it, or if
// that is not known (wk does not answer; the restore fails on its own),
// and otherwise a FailedPrecondition error saying why.
func (s *Server) checkWorkerVMM(ctx context.Context, wk Worker, snap string, want vmmID) error {
	if want.Kind == "" {
		return nil
	}
	c, ok := s.capsOf(ctx, wk)
	if !ok {
		return nil
	}
	if match, _ := want.match(c); !match {
		s.metrics.placementRefusals.WithLabelValues(refusedVMM).Inc()
		return fmt.Errorf("snapshot %s was taken by %s; it can start only on worker %s, which runs %s: %w",
			snap, want, wk.ID(), capsString(c), errkind.FailedPrecondition)
	}
	return nil
}

// noVMM is the error of a placement of a sandbox from snapshot snap,
// taken by want, when no worker that answered (answered) runs want:
// Unavailable if some known worker that did not answer, or is unhealthy,
// last said it does or has said nothing, and FailedPrecondition
// otherwise. It lists every known worker with its VMM.
func (s *Server) noVMM(snap string, want vmmID, answered map[string]workerproto.Status) error {
	var list, away []string
	unknown := false
	for _, wk := range s.workerList() {
		if st, ok := answered[wk.ID()]; ok {
			list = append(list, wk.ID()+" "+capsString(st.Capabilities))
			continue
		}
		c, known := s.lastCaps(wk)
		if !known {
			list = append(list, wk.ID()+" (unhealthy, vmm not known)")
			unknown = true
			continue
		}
		list = append(list, wk.ID()+" "+capsString(c)+" (unhealthy)")
		if ok, _ := want.match(c); ok {
			away = append(away, wk.ID())
		}
	}
	workers := "no workers connected"
	if len(list) > 0 {
		workers = "workers: " + strings.Join(list, ", ")
	}
	switch {
	case len(away) > 0:
		return fmt.Errorf("snapshot %s was taken by %s; the workers that run it (%s) are unhealthy (%s): %w",
			snap, want, strings.Join(away, ", "), workers, errkind.Unavailable)
	case unknown:
		return fmt.Errorf("snapshot %s was taken by %s; no healthy worker runs %s (%s): %w",
			snap, want, want, workers, errkind.Unavailable)
	}
	return fmt.Errorf("snapshot %s was taken by %s; no connected worker runs %s (%s): %w",
		snap, want, want, workers, errkind.FailedPrecondition)
}
