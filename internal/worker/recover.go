package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"space/internal/errkind"
	"space/internal/guestvm"
	"space/internal/hostaddr"
	"space/internal/netns"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/vmm"
)

// Start prepares the worker's directories and recovers what an earlier
// process of this worker left: see the package doc. It returns once every
// record is handled; a sandbox it cannot re-adopt is marked failed, not
// fatal to the worker.
func (w *Worker) Start(ctx context.Context) error {
	for _, d := range []string{w.cfg.DataDir, w.sandboxesDir(), w.cfg.RunRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	if err := errors.Join(w.removeIncompleteSnapshots(), w.removeIncompleteWarm()); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	// The host's own addresses, which gateways refuse (from the
	// namespace they dial from: the worker's).
	addrs, err := hostaddr.New("", w.log)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.hostAddrs = addrs
	// Before the records: a worker that enforces re-adopts its guests
	// paused.
	if w.cfg.Fencing {
		if err := w.loadEpoch(); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	// An earlier life's watchdog may have stopped the guests (watchdog.go):
	// it goes, and they are continued before they are re-adopted.
	stoppedGuests := w.killEarlierWatchdog()
	entries, err := os.ReadDir(w.sandboxesDir())
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	for _, e := range entries {
		dir := filepath.Join(w.sandboxesDir(), e.Name())
		rec, err := readRecord(dir)
		if err != nil {
			w.log.Warn("removing sandbox directory without a usable record", "dir", dir, "err", err)
			s := &sbx{dir: dir, runDir: filepath.Join(w.cfg.RunRoot, e.Name())}
			s.rec.ID = e.Name()
			if err := w.destroy(ctx, s); err != nil {
				return fmt.Errorf("worker: remove leftover %s: %w", dir, err)
			}
			continue
		}
		if stoppedGuests && rec.VM != nil {
			continueGuest(rec.VM.PID)
		}
		s := &sbx{dir: dir, runDir: filepath.Join(w.cfg.RunRoot, rec.slot())}
		s.loadUsage(w)
		s.mu.Lock()
		s.rec = rec
		s.lastActive = time.Now() // what it did before this process is unknown: idle from now
		s.mu.Unlock()
		w.mu.Lock()
		w.sandboxes[rec.ID] = s
		w.mu.Unlock()
		s.op.Lock()
		err = w.recover(ctx, s)
		s.op.Unlock()
		if err != nil {
			return fmt.Errorf("worker: recover %s: %w", rec.ID, err)
		}
	}
	if err := w.removeStrays(ctx); err != nil {
		return err
	}
	if w.cfg.ReflinkStorage {
		w.watchers.Add(1)
		go w.writeback()
	}
	w.watchers.Add(1)
	go w.poolLoop()
	w.watchers.Add(1)
	go w.memoryLoop()
	w.watchers.Add(1)
	go w.fenceLoop()
	if w.cfg.Fencing {
		w.watchers.Add(1)
		go w.watchdogLoop()
	}
	w.watchers.Go(func() {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-w.stop
			cancel()
		}()
		w.hostAddrs.Run(ctx)
	})
	return nil
}

// recover brings one sandbox found on disk back into service, or finishes
// what was under way. The caller holds s.op.
func (w *Worker) recover(ctx context.Context, s *sbx) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	log := w.log.With("sandbox_id", rec.ID)
	if rec.Internal {
		log.Info("removing the worker's own sandbox left by a restart")
		return w.forget(ctx, s)
	}
	if rec.State == sandbox.Creating && rec.RestoreFrom != "" {
		return w.redoRestore(ctx, s)
	}
	switch rec.State {
	case sandbox.Running, sandbox.Paused, sandbox.Creating:
		if rec.Handle == nil { // a create that never got a VMM handle
			log.Info("rolling back interrupted create")
			return w.forget(ctx, s)
		}
		vm, err := w.cfg.Driver.Recover(ctx, *rec.Handle)
		if err != nil {
			if rec.State == sandbox.Creating {
				log.Info("rolling back interrupted create", "err", err)
				return w.forget(ctx, s)
			}
			log.Warn("sandbox vm is gone", "err", err)
			return w.fail(ctx, s, fmt.Sprintf("vm lost while the worker was down: %v", err))
		}
		s.mu.Lock()
		s.vm = vm
		s.mu.Unlock()
		if rec.State != sandbox.Creating {
			if err := w.settleVCPUs(ctx, s, vm, rec.State); err != nil {
				log.Warn("sandbox vm does not answer", "err", err)
				return w.fail(ctx, s, fmt.Sprintf("vm does not answer after the worker restarted: %v", err))
			}
			if err := w.attachGateway(ctx, s); err != nil {
				log.Warn("sandbox network not reattached", "err", err)
			}
			log.Info("re-adopted sandbox", "vm_pid", rec.Handle.PID, "state", rec.State)
			w.watch(s, vm)
			return nil
		}
		// The VM of an interrupted create runs: complete it if its agent
		// answers in time.
		cctx, cancel := context.WithTimeout(ctx, w.cfg.BootTimeout)
		defer cancel()
		c, err := guestvm.Connect(cctx, vm)
		if err != nil {
			log.Info("rolling back interrupted create", "err", err)
			return w.forget(ctx, s)
		}
		s.mu.Lock()
		s.agent = c
		err = s.setStateLocked(sandbox.Running)
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if err := s.save(); err != nil {
			return err
		}
		if err := w.attachGateway(ctx, s); err != nil {
			log.Warn("sandbox network not attached", "err", err)
		}
		log.Info("completed interrupted create", "vm_pid", rec.Handle.PID)
		w.watch(s, vm)
		w.holdFence(ctx, s)
		return nil
	case sandbox.Stopping:
		log.Info("finishing interrupted delete")
		return w.forget(ctx, s)
	case sandbox.Failed:
		return nil
	}
	log.Warn("removing sandbox in unexpected state", "state", rec.State)
	return w.forget(ctx, s)
}

// settleVCPUs makes a re-adopted VM's vCPUs match its record: a worker
// that died while a snapshot had the guest paused leaves it paused, and a
// running sandbox must not stay frozen, unless the worker enforces a
// fence and holds no lease (as at every start after its first lease):
// then the fence pauses it until the next. The calls are no-ops when the
// VM is already in that state.
func (w *Worker) settleVCPUs(ctx context.Context, s *sbx, vm vmm.VM, state sandbox.State) error {
	p, ok := vm.(vmm.Pauser)
	if !ok {
		return nil
	}
	defer s.stopVM()()
	if state == sandbox.Paused {
		return p.Pause(ctx)
	}
	if !w.serving() && !s.internal() {
		s.vcpus.Lock()
		defer s.vcpus.Unlock()
		if err := p.Pause(ctx); err != nil {
			return err
		}
		s.fenced = true
		s.fencedNow.Store(true)
		w.log.Info("sandbox paused: no lease of the control plane", "sandbox_id", s.id())
		return nil
	}
	return p.Resume(ctx)
}

// forget destroys the sandbox and drops it from the worker.
func (w *Worker) forget(ctx context.Context, s *sbx) error {
	s.mu.Lock()
	vm := s.vm
	s.mu.Unlock()
	if vm == nil {
		// Not recovered: whatever runs is found through the cgroup.
		if err := w.killStray(ctx, s); err != nil {
			return err
		}
	}
	if err := w.destroy(ctx, s); err != nil {
		return err
	}
	w.mu.Lock()
	delete(w.sandboxes, s.id())
	w.mu.Unlock()
	return nil
}

// killStray kills a VMM of s that runs without being recovered: through
// the sandbox's control group, or its handle when cgroups are off.
func (w *Worker) killStray(ctx context.Context, s *sbx) error {
	if w.cfg.Cgroups != nil {
		return w.removeCgroupNamed(ctx, w.cgroupOf(s))
	}
	s.mu.Lock()
	h := s.rec.Handle
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	vm, err := w.cfg.Driver.Recover(ctx, *h)
	if errors.Is(err, errkind.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return vm.Stop(ctx)
}

// fail marks a sandbox failed and releases its VM resources; the record
// stays until the sandbox is deleted.
func (w *Worker) fail(ctx context.Context, s *sbx, why string) error {
	s.closeGateway()
	if err := w.killStray(ctx, s); err != nil {
		return err
	}
	if err := os.RemoveAll(s.runDir); err != nil {
		return err
	}
	s.mu.Lock()
	err := s.setStateLocked(sandbox.Failed)
	s.failure = why
	s.vm, s.agent = nil, nil
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.save()
}

// removeStrays removes control groups and run directories of this worker
// that no record points to.
func (w *Worker) removeStrays(ctx context.Context) error {
	names := map[string]bool{} // run directories and control groups in use
	all := w.all()
	for _, s := range all {
		names[filepath.Base(s.runDir)] = true
		names[filepath.Base(w.cgroupOf(s))] = true
	}
	known := func(name string) bool { return names[name] }
	var errs []error
	if w.cfg.Cgroups != nil {
		names, err := w.cfg.Cgroups.List(w.cgroupParent())
		if err != nil && !errors.Is(err, errkind.NotFound) {
			errs = append(errs, err)
		}
		for _, name := range names {
			id := filepath.Base(name)
			if !known(id) {
				w.log.Warn("removing stray cgroup", "cgroup", name)
				errs = append(errs, w.removeCgroupNamed(ctx, w.cgroupName(id)))
			}
		}
	}
	entries, err := os.ReadDir(w.cfg.RunRoot)
	if err != nil {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if !known(e.Name()) {
			w.log.Warn("removing stray run directory", "dir", e.Name())
			errs = append(errs, os.RemoveAll(filepath.Join(w.cfg.RunRoot, e.Name())))
		}
	}
	// Network namespaces (tap NICs) are named after run directories.
	if pinned, err := filepath.Glob(filepath.Join(netnsDir, w.netnsPrefix()+"*")); err == nil {
		for _, p := range pinned {
			// Only slots (sandbox IDs, no '-'): "space-a-" is also the
			// start of worker "a-b"'s namespaces.
			slot := strings.TrimPrefix(filepath.Base(p), w.netnsPrefix())
			if store.ValidSandboxID(slot) && !known(slot) {
				w.log.Warn("removing stray network namespace", "netns", p)
				errs = append(errs, netns.Remove(p))
			}
		}
	}
	return errors.Join(errs...)
}

// redoRestore finishes a create from a snapshot or an in-place restore
// that a crash interrupted: whatever VM runs is replaced by one restored
// from the snapshot again. The caller holds s.op.
func (w *Worker) redoRestore(ctx context.Context, s *sbx) error {
	s.mu.Lock()
	h, snapID, id := s.rec.Handle, s.rec.RestoreFrom, s.rec.ID
	s.mu.Unlock()
	if _, err := w.snapshotInfo(snapID); err != nil {
		return w.fail(ctx, s, fmt.Sprintf("restore from snapshot %s interrupted and the snapshot is gone: %v", snapID, err))
	}
	if h != nil {
		if vm, err := w.cfg.Driver.Recover(ctx, *h); err == nil {
			s.mu.Lock()
			s.vm = vm
			s.mu.Unlock()
		}
	}
	w.log.Info("finishing interrupted restore", "sandbox_id", id, "snapshot_id", snapID)
	if _, err := w.restoreLocked(ctx, s); err != nil {
		w.log.Warn("interrupted restore failed again", "sandbox_id", id, "err", err)
	}
	return nil
}
