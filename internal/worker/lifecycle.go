package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"space/api"
	"space/internal/agent/client"
	"space/internal/cgroup"
	"space/internal/errkind"
	"space/internal/guestvm"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/vmm"
)

// CrashPoints are the steps Config.CrashAt can name, in the order a create
// and a delete pass them.
var CrashPoints = []string{
	"create.recorded",         // record says creating; nothing else exists
	"create.vm-started",       // the VMM runs; its handle is not persisted (also on restores)
	"create.handle-saved",     // handle persisted; agent not yet confirmed (also on restores)
	"create.running-saved",    // record says running; the caller has no answer
	"delete.stopping-saved",   // record says stopping; the VM still runs
	"delete.vm-stopped",       // VM stopped; files and record remain
	"restore.recorded",        // record names the snapshot to restore; the old VM runs
	"restore.old-vm-gone",     // the old VM and its files are gone; no new VM yet
	"snapshot.vm-paused",      // guest paused, device state written; memory not copied
	"snapshot.vm-saved",       // the snapshot's files are complete; not in the chunk store
	"snapshot.chunks-stored",  // the chunk store has its manifest; the info file is not written
	"create.pool-handed-over", // a pool member has its new identity in the guest; its record is the member's
}

// crash kills the process at step if the configuration asks for it.
func (w *Worker) crash(step string) {
	if w.cfg.CrashAt == step {
		w.log.Warn("crashing at crash point", "step", step)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// undoStack runs cleanup steps in reverse order.
type undoStack []func(context.Context) error

func (u *undoStack) push(f func(context.Context) error) { *u = append(*u, f) }

func (u undoStack) run(ctx context.Context) error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		errs = append(errs, u[i](ctx))
	}
	return errors.Join(errs...)
}

// ErrNotRunning is returned by data-plane calls on a sandbox whose VM
// does not run.
var ErrNotRunning = fmt.Errorf("sandbox is not running: %w", errkind.FailedPrecondition)

// Create does what req asks: it boots sandbox req.ID for req.Team with
// req.Spec, or restores it from req.FromSnapshot (see
// CreateFromSnapshot), with the granted secrets' values, and returns
// once its agent answers. On error nothing of it remains. The record is
// durable before Create returns.
func (w *Worker) Create(ctx context.Context, req CreateRequest) (inf Info, err error) {
	defer func(start time.Time) { w.metrics.observeCreate(start, inf, err) }(time.Now())
	if err := w.checkServing("create " + req.ID); err != nil {
		return Info{}, err
	}
	if req.FromSnapshot != "" {
		return w.createFromSnapshot(ctx, req.ID, req.Team, req.FromSnapshot, req.Overrides(), req.SecretValues, req.TakeSnapshot)
	}
	req.Spec = withNIC(req.Spec)
	if len(req.Spec.Secrets) == 0 {
		if inf, ok := w.fromPool(ctx, req.ID, req.Team, req.Spec); ok {
			return inf, nil
		}
	}
	return w.create(ctx, req.ID, req.Team, req.Spec, createOpts{secretValues: req.SecretValues})
}

// createOpts are create's variants.
type createOpts struct {
	snapID   string // restore this snapshot; "" boots (or restores the warm template)
	take     bool   // spend snapID: move its files into the sandbox (CreateRequest.TakeSnapshot)
	internal bool   // the worker's own sandbox (see record.Internal)
	pool     string // a member of this pool (see record.Pool)
	// secretValues are the values of spec's granted secrets.
	secretValues map[string][]byte
}

// create makes sandbox id by booting or by restoring a snapshot.
func (w *Worker) create(ctx context.Context, id, team string, spec Spec, opts createOpts) (Info, error) {
	if !store.ValidSandboxID(id) {
		return Info{}, fmt.Errorf("sandbox id %q: %w", id, errkind.InvalidArgument)
	}
	if !store.ValidID(team) {
		return Info{}, fmt.Errorf("team %q: %w", team, errkind.InvalidArgument)
	}
	if err := validateSpec(spec); err != nil {
		return Info{}, err
	}
	if _, err := w.cfg.Templates.Template(ctx, spec.Template); err != nil {
		return Info{}, err
	}
	sealed, err := w.sealValues(id, spec, opts.secretValues)
	if err != nil {
		return Info{}, err
	}
	s := &sbx{
		dir:    filepath.Join(w.sandboxesDir(), id),
		runDir: filepath.Join(w.cfg.RunRoot, id),
	}
	s.mu.Lock()
	s.rec = record{ID: id, Team: team, Spec: spec, State: sandbox.Creating, Created: time.Now().UTC(), RestoreFrom: opts.snapID,
		Internal: opts.internal, Pool: opts.pool, Secrets: sealed}
	s.lastActive = time.Now()
	s.mu.Unlock()
	s.op.Lock()
	defer s.op.Unlock()
	return w.createLocked(ctx, s, opts.snapID, opts.take)
}

// createLocked does create's work; the caller holds s.op.
func (w *Worker) createLocked(ctx context.Context, s *sbx, snapID string, take bool) (_ Info, err error) {
	s.mu.Lock()
	id, spec, member := s.rec.ID, s.rec.Spec, s.rec.Pool != ""
	s.mu.Unlock()
	err = w.reserve(id, s, spec)
	if errors.Is(err, ErrNoCapacity) && !member && w.evictMember(ctx) {
		err = w.reserve(id, s, spec) // a pool member made room
	}
	if err != nil {
		return Info{}, err
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			err = errors.Join(fmt.Errorf("create %s: %w", id, err), w.removeNetns(s), s.removeFiles())
			if rerr := w.removeCgroupNamed(rctx, w.cgroupName(id)); rerr != nil {
				err = errors.Join(err, rerr)
			}
			w.mu.Lock()
			delete(w.sandboxes, id)
			w.mu.Unlock()
		}
	}()
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return Info{}, fmt.Errorf("%w (leftover directory %s)", ErrExists, s.dir)
		}
		return Info{}, err
	}
	if err := s.save(); err != nil {
		return Info{}, err
	}
	w.crash("create.recorded")
	if err := w.launch(ctx, s, snapID, take); err != nil {
		return Info{}, err
	}
	w.crash("create.running-saved")
	return s.info(), nil
}

// launch starts the sandbox's VM, booting it (snapID "") or restoring
// snapshot snapID, in a fresh control group, persists its handle as soon
// as it runs, waits for its agent, and records the sandbox running. With
// take the snapshot is spent: its files move into the sandbox and it is
// gone afterwards, whatever the outcome. On error the VM and its run files
// are gone. The caller holds s.op.
func (w *Worker) launch(ctx context.Context, s *sbx, snapID string, take bool) (err error) {
	s.mu.Lock()
	id, spec := s.rec.ID, s.rec.Spec
	s.mu.Unlock()
	img, err := w.cfg.Templates.Template(ctx, spec.Template)
	if err != nil {
		return err
	}
	cfg := w.guestConfig(s, spec, img)
	if cfg.NIC, err = w.nicFor(s); err != nil {
		return err
	}
	if w.cfg.Cgroups != nil {
		g, err := w.cfg.Cgroups.Create(w.cgroupName(id), limits(spec))
		if err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, removeCgroup(context.WithoutCancel(ctx), g))
			}
		}()
		cfg.Placer = g
		s.mu.Lock()
		s.rec.Cgroup = w.cgroupName(id)
		s.mu.Unlock()
	}
	cfg.Started = func(vm vmm.VM) error {
		w.crash("create.vm-started")
		h := vm.Handle()
		s.mu.Lock()
		s.rec.Handle = &h
		s.mu.Unlock()
		if err := s.save(); err != nil {
			return fmt.Errorf("persist handle: %w", err)
		}
		w.crash("create.handle-saved")
		return nil
	}
	bctx, cancel := context.WithTimeout(ctx, w.cfg.BootTimeout)
	defer cancel()
	// A boot that may become its shape's warm template carries nothing of
	// this sandbox's: sandboxes of other teams restore it, and its kernel
	// command line (the hostname on it) and machine-id with it. The
	// sandbox gets its name and ids of its own after the capture.
	mayCapture := !spec.ColdBoot && spec.Network != nil
	bootCfg := cfg
	if mayCapture {
		bootCfg.Hostname = "" // the guest's default, "sandbox"
	}
	var gv *guestvm.VM
	startedBy := "boot"
	switch {
	case snapID != "":
		// A sandbox restored from a snapshot of its own (a resume from
		// suspend, a rollback to its checkpoint) is the machine it was; a
		// restore into another sandbox (a fork, a template's sandbox)
		// makes a new machine.
		info, ierr := w.snapshotInfo(snapID)
		cfg.KeepIdentity = ierr == nil && info.SandboxID == id
		var dir string
		if dir, err = w.snapshotDir(snapID); err == nil && take {
			dir, err = w.spendSnapshot(snapID, id)
			defer os.RemoveAll(dir)
			cfg.TakeSnapshot = true
		}
		if err == nil {
			startedBy = "restore"
			gv, err = guestvm.Restore(bctx, cfg, filepath.Join(dir, "vm"))
		}
	case !spec.ColdBoot && spec.Network != nil && w.warmReady(spec, img):
		startedBy = "warm"
		gv, err = guestvm.Restore(bctx, cfg, filepath.Join(w.warmDir(spec, img), "vm"))
		if errors.Is(err, vmm.ErrIncompatible) {
			// Another VMM version wrote it: boot, and capture anew.
			w.log.Warn("dropping incompatible warm template", "dir", w.warmDir(spec, img), "err", err)
			os.RemoveAll(w.warmDir(spec, img))
			startedBy = "boot"
			gv, err = guestvm.Boot(bctx, bootCfg)
		}
	default:
		gv, err = guestvm.Boot(bctx, bootCfg)
	}
	if err != nil {
		return err
	}
	// Warm templates and pools are of sandboxes with a NIC (the NIC is
	// part of a snapshot's device layout; see withNIC).
	if startedBy == "boot" && mayCapture {
		if !w.warmReady(spec, img) {
			// The first sandbox of its shape: capture it, fresh from
			// boot, as the warm template the next ones restore from.
			if err := w.captureWarm(ctx, gv.VMM, spec, img); err != nil {
				w.log.Warn("capture warm template", "err", err)
			}
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		gv.Identity, err = guestvm.PostRestore(pctx, gv.Client, cfg.Hostname)
		cancel()
		if err != nil {
			return errors.Join(fmt.Errorf("post-restore: %w", err), gv.Close(context.WithoutCancel(ctx)))
		}
	}
	if gv.Identity.MachineID == "" && !cfg.KeepIdentity {
		w.log.Warn("agent predates per-sandbox machine and boot ids; the sandbox keeps its snapshot's", "sandbox_id", id, "by", startedBy)
	}
	h := gv.VMM.Handle()
	s.mu.Lock()
	s.vm, s.agent, s.agentDown = gv.VMM, gv.Client, nil
	s.rec.RestoreFrom = ""
	s.rec.VM = &api.VMInfo{
		VMM: h.Driver, VMMVersion: h.Version, Accel: h.Accel, StartedBy: startedBy,
		BootMS: gv.BootTime.Milliseconds(), PID: h.PID,
	}
	s.mu.Unlock()
	s.measureMemory() // its charge from now on
	// Running only once nothing here can fail any more: a reconcile that
	// asks meanwhile (its caller gone) must see a create that may still
	// be rolled back as creating, not complete it.
	err = w.attachGateway(ctx, s)
	if err == nil {
		s.mu.Lock()
		err = s.setStateLocked(sandbox.Running)
		s.mu.Unlock()
	}
	if err == nil {
		err = s.save()
	}
	if err != nil {
		s.closeGateway()
		return errors.Join(err, gv.Close(context.WithoutCancel(ctx)))
	}
	w.watch(s, gv.VMM)
	w.metrics.observeStart(startedBy, gv.BootTime)
	w.log.InfoContext(ctx, "sandbox started", "sandbox_id", id, "vm_pid", h.PID, "by", startedBy, "took", gv.BootTime, "confinement", h.Confinement)
	w.holdFence(ctx, s) // the lease ran out while it started
	return nil
}

// reserve adds s to the worker if the ID is free and capacity allows.
func (w *Worker) reserve(id string, s *sbx, spec Spec) error {
	w.admit.Lock()
	st := w.status(true)
	fits := st.UsedVCPUs+spec.VCPUs <= st.VCPUs && st.UsedMemoryMiB+spec.MemoryMiB <= st.MemoryMiB
	avail, err := hostAvailableMiB()
	pressed := err == nil && avail < w.cfg.MemoryReserveMiB
	w.mu.Lock()
	closed := w.closed
	_, taken := w.sandboxes[id]
	admitted := fits && !pressed && !closed && !taken
	if admitted {
		w.sandboxes[id] = s
	}
	w.mu.Unlock()
	var diskErr error
	if admitted {
		if diskErr = w.admitDisk(s, spec); diskErr != nil {
			w.mu.Lock()
			delete(w.sandboxes, id)
			w.mu.Unlock()
		}
	}
	w.admit.Unlock()
	switch {
	case diskErr != nil:
		return diskErr
	case closed:
		return fmt.Errorf("worker is shutting down: %w", errkind.Unavailable)
	case taken:
		return fmt.Errorf("%s: %w", id, ErrExists)
	case !fits:
		return fmt.Errorf("%d vcpus and %d MiB asked, %d vcpus and %d MiB free: %w", spec.VCPUs, spec.MemoryMiB,
			st.VCPUs-st.UsedVCPUs, st.MemoryMiB-st.UsedMemoryMiB, ErrNoCapacity)
	case pressed:
		return fmt.Errorf("the host has %d MiB of memory available, under the %d MiB it keeps in reserve: %w",
			avail, w.cfg.MemoryReserveMiB, ErrNoCapacity)
	}
	return nil
}

// setStateLocked moves the sandbox to state to, if the transition table
// allows it.
//
// +checklocks:s.mu
func (s *sbx) setStateLocked(to sandbox.State) error {
	if err := sandbox.Check(s.rec.State, to); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.rec.ID, err)
	}
	s.rec.State = to
	return nil
}

// save persists the sandbox's record.
func (s *sbx) save() error {
	s.mu.Lock()
	r := s.rec
	s.mu.Unlock()
	return writeRecord(s.dir, r)
}

func (w *Worker) cgroupName(id string) string { return w.cgroupParent() + "/" + id }

// cgroupOf returns the control group s's VMM runs in (or would).
func (w *Worker) cgroupOf(s *sbx) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cmp.Or(s.rec.Cgroup, w.cgroupName(s.rec.slot()))
}

// vmmOverheadMiB is what a VMM process needs beyond guest RAM (QEMU's
// own heap and, under TCG, its translation cache).
const vmmOverheadMiB = 384

// vmmOverheadCPUs is the CPU time a VMM gets beyond its vCPUs: its own
// threads (device emulation, the event loop that moves virtio-serial and
// block I/O, under TCG the translator) run beside the vCPU threads, and a
// quota of exactly the vCPUs throttles the guest's I/O while its vCPUs
// are busy. Measured with BenchmarkTransferHTTP on a 1-vCPU QEMU/TCG
// sandbox: capped at 1 CPU, file reads ran at 85 MB/s; uncapped, 118 MB/s
// with the VMM using about 1.25 CPUs. It is a ceiling, not a
// reservation: the worker's capacity counts vCPUs.
const vmmOverheadCPUs = 0.5

func limits(spec Spec) cgroup.Limits {
	return cgroup.Limits{
		CPUs:        float64(spec.VCPUs) + vmmOverheadCPUs,
		MemoryBytes: (spec.MemoryMiB + vmmOverheadMiB) << 20,
		Pids:        512,
	}
}

func removeCgroup(ctx context.Context, g *cgroup.Group) error {
	if err := g.Kill(ctx); err != nil {
		return err
	}
	return g.Remove()
}

// Delete stops sandbox id's VM and removes everything of it. Deleting a
// sandbox the worker does not have is ErrNotFound.
func (w *Worker) Delete(ctx context.Context, id string) error {
	s, err := w.get(id)
	if err != nil {
		return err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	gone := s.rec.State == sandbox.Deleted
	if !gone && s.rec.State != sandbox.Stopping {
		err = s.setStateLocked(sandbox.Stopping)
	}
	s.mu.Unlock()
	if gone {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	if err := s.save(); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	w.crash("delete.stopping-saved")
	if err := w.destroy(ctx, s); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	w.mu.Lock()
	delete(w.sandboxes, id)
	w.mu.Unlock()
	w.log.InfoContext(ctx, "sandbox deleted", "sandbox_id", id)
	return nil
}

// destroy stops the VM, kills whatever is left in the control group and
// removes the files, the record last. The caller holds s.op.
func (w *Worker) destroy(ctx context.Context, s *sbx) error {
	s.closeGateway()
	s.mu.Lock()
	vm, agent := s.vm, s.agent
	s.vm, s.agent = nil, nil
	s.mu.Unlock()
	if agent != nil {
		agent.Close()
	}
	var errs []error
	if vm != nil {
		errs = append(errs, vm.Stop(ctx))
	}
	w.crash("delete.vm-stopped")
	if err := w.removeCgroupNamed(ctx, w.cgroupOf(s)); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, w.removeNetns(s), os.RemoveAll(s.runDir), os.RemoveAll(s.diskDir()))
	if err := errors.Join(errs...); err != nil {
		return err // keep the record: a retry finds everything again
	}
	s.mu.Lock()
	s.rec.State = sandbox.Deleted // the record is about to go: nothing persists this state
	s.mu.Unlock()
	if err := os.Remove(filepath.Join(s.dir, recordFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(s.dir)
}

func (s *sbx) id() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.ID
}

// removeCgroupNamed kills and removes the named control group if it
// exists.
func (w *Worker) removeCgroupNamed(ctx context.Context, name string) error {
	if w.cfg.Cgroups == nil {
		return nil
	}
	return w.cfg.Cgroups.Destroy(ctx, name)
}

// agentFor returns a connected agent client of a running sandbox,
// reconnecting if the previous session ended.
func (w *Worker) agentFor(ctx context.Context, id string) (*client.Client, error) {
	s, err := w.get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	state, vm, a, down := s.rec.State, s.vm, s.agent, s.agentDown
	s.mu.Unlock()
	if state != sandbox.Running || vm == nil {
		return nil, fmt.Errorf("%s is %s: %w", id, state, ErrNotRunning)
	}
	if down != nil {
		// Fail at once: nothing waits on an agent that does not answer
		// (the heartbeat reconnects once it does).
		return nil, errAgentDown(id, down)
	}
	if a != nil {
		select {
		case <-a.Done():
		default:
			return a, nil
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := guestvm.Connect(cctx, vm)
	if err != nil {
		return nil, fmt.Errorf("%s: connect agent: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent != a && s.agent != nil { // someone else reconnected first
		c.Close()
		return s.agent, nil
	}
	s.agent = c
	return c, nil
}

// Pause stops the sandbox's vCPUs; its memory stays where it is, so
// Resume continues at once. Pausing a paused sandbox is a no-op.
func (w *Worker) Pause(ctx context.Context, id string) (Info, error) {
	return w.setRunning(ctx, id, false)
}

// Resume continues a paused sandbox. Resuming a running one is a no-op.
// While the worker holds no lease it is ErrNoLease.
func (w *Worker) Resume(ctx context.Context, id string) (Info, error) {
	if err := w.checkServing("resume " + id); err != nil {
		return Info{}, err
	}
	return w.setRunning(ctx, id, true)
}

// setRunning pauses or resumes the VM and persists the new state. A
// guest the fence paused is paused already: pausing it only records it
// so, and the fence then leaves it paused.
func (w *Worker) setRunning(ctx context.Context, id string, run bool) (Info, error) {
	s, err := w.get(id)
	if err != nil {
		return Info{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.vcpus.Lock()
	defer s.vcpus.Unlock()
	if run && !w.serving() { // the lease ran out since Resume checked
		return Info{}, fmt.Errorf("resume %s: %w", id, ErrNoLease)
	}
	from, to := sandbox.Running, sandbox.Paused
	if run {
		from, to = to, from
	}
	s.mu.Lock()
	state, vm := s.rec.State, s.vm
	s.mu.Unlock()
	if state == to {
		return s.info(), nil
	}
	if state != from || vm == nil {
		return Info{}, fmt.Errorf("%s is %s: %w", id, state, sandbox.ErrTransition)
	}
	p, ok := vm.(vmm.Pauser)
	if !ok {
		return Info{}, fmt.Errorf("%s: %T cannot pause: %w", id, vm, errkind.FailedPrecondition)
	}
	vmStopped := s.stopVM()
	if run {
		err = p.Resume(ctx)
	} else {
		err = p.Pause(ctx)
	}
	if err != nil {
		vmStopped()
		return Info{}, fmt.Errorf("%s: %w", id, err)
	}
	s.fenced = false // the vCPUs are as the user asks now, not the fence
	s.fencedNow.Store(false)
	defer vmStopped() // once the record says what the VM does
	s.mu.Lock()
	err = s.setStateLocked(to)
	s.mu.Unlock()
	if err != nil {
		return Info{}, err
	}
	if err := s.save(); err != nil {
		return Info{}, err
	}
	w.log.InfoContext(ctx, "sandbox "+to.String(), "sandbox_id", id)
	return s.info(), nil
}
