package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/worker"
	"space/internal/workerproto"
)

// Recovery from a lost worker.
//
// The leader leases every standalone worker that states
// Capabilities.Fencing (the Lease verb, every leaseEvery): a worker
// serves and runs its sandboxes only while its lease holds (leaseTTL
// after it received the latest), and freezes them otherwise. A worker
// whose Lease calls have failed for RecoverAfter is lost: the leader
// raises its fencing epoch in the store (so that, if it comes back, its
// next lease tells it to remove what was taken from it) and restores
// each of its running sandboxes on another worker from the latest
// checkpoint, with the same ID, policy, secrets, labels and expiry. One
// with no checkpoint fails, saying so.
//
// Why no two workers ever run one sandbox: a lease the worker received
// at t ends at t+leaseTTL by its clock. The leader stops sending leases
// to a worker it has not leased for suspectAfter, and raises the epoch
// only after RecoverAfter without a lease and leaseTTL+leaseCall since
// its last attempt (the longest a lease it sent may reach and last). By
// then the lost worker has frozen its guests and refuses its data plane,
// however long it stalled; when it is back, it learns the new epoch
// before it may serve again. The leader also sends leases only while it
// leads, and a new leader waits RecoverAfter from the start of its term
// before it declares anyone lost.

// DefaultRecoverAfter is Config.RecoverAfter's default.
const DefaultRecoverAfter = 30 * time.Second

const (
	// maxRecoveriesAtOnce bounds the restores in flight.
	maxRecoveriesAtOnce = 4
	// recoverAttempts is how often a sandbox's restore may fail before
	// it is failed.
	recoverAttempts = 3
)

// leaseTimes are the lease's times, all from RecoverAfter.
type leaseTimes struct {
	ttl, every, call, suspectAfter time.Duration
}

func (s *Server) leaseTimes() leaseTimes {
	ra := s.cfg.RecoverAfter
	// Half the delay: a leader that fails over (a few seconds) leases
	// again well before a lease runs out.
	lt := leaseTimes{ttl: ra / 2}
	lt.every = min(2*time.Second, lt.ttl/5)
	lt.call = min(3*time.Second, lt.ttl/3)
	lt.suspectAfter = ra - lt.ttl - lt.call - time.Second
	return lt
}

// recovery is a recovering sandbox's plan, kept in its handle.
type recovery struct {
	LostWorker   string    `json:"lost_worker"`
	LastSeen     time.Time `json:"last_seen"`
	LostAt       time.Time `json:"lost_at"`
	Checkpoint   string    `json:"checkpoint"`
	CheckpointAt time.Time `json:"checkpoint_at"`
	Attempts     int       `json:"attempts,omitempty"`
	LastError    string    `json:"last_error,omitempty"`
}

func (r *recovery) reason() string {
	msg := fmt.Sprintf("worker %s was lost at %s; restoring from checkpoint %s of %s",
		r.LostWorker, r.LostAt.Format(time.RFC3339), r.Checkpoint, r.CheckpointAt.Format(time.RFC3339))
	if r.LastError != "" {
		msg += fmt.Sprintf(" (attempt %d failed: %s)", r.Attempts, r.LastError)
	}
	return msg
}

// fencer is one leadership term's leasing and recovery.
type fencer struct {
	start time.Time
	slots chan struct{}
	calls sync.WaitGroup

	mu sync.Mutex
	// +checklocks:mu
	workers map[string]*leaseState
	// +checklocks:mu
	recovering map[string]bool // sandboxes whose restore is in flight
}

// leaseState is what the leader knows of one worker's lease; guarded by
// fencer.mu.
type leaseState struct {
	leased  time.Time // the end of the last successful Lease call (the term's start before one)
	tried   time.Time // the start of the last Lease call
	pending bool      // a call is out
	epoch   int64     // as the store had it last
}

func newFencer(now time.Time) *fencer {
	return &fencer{start: now, slots: make(chan struct{}, maxRecoveriesAtOnce),
		workers: map[string]*leaseState{}, recovering: map[string]bool{}}
}

// runFencing leases the workers and recovers the sandboxes of lost ones
// until ctx ends.
func (s *Server) runFencing(ctx context.Context) {
	if s.cfg.RecoverAfter < 0 || s.cfg.WorkerToken == "" {
		return // no standalone workers, or recovery is off
	}
	f := newFencer(s.now())
	defer f.calls.Wait()
	t := time.NewTicker(s.leaseTimes().every)
	defer t.Stop()
	for {
		s.fenceRound(s.leaderOrigin(ctx), f) // at once in a new term: the workers wait for it
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fenceRound sends the leases that are due, fences the workers that are
// lost, and starts the restores of recovering sandboxes.
func (s *Server) fenceRound(ctx context.Context, f *fencer) {
	stored, err := s.cfg.Store.ListWorkers(ctx)
	if err != nil {
		s.log.Warn("leases: list workers", "err", err)
		return
	}
	epochs := map[string]int64{}
	storedCaps := map[string]workerproto.Capabilities{}
	for _, w := range stored {
		epochs[w.ID] = w.Epoch
		var c workerproto.Capabilities
		if len(w.Capabilities) > 0 && json.Unmarshal(w.Capabilities, &c) == nil {
			storedCaps[w.ID] = c
		}
	}
	lt := s.leaseTimes()
	now, start := s.now(), f.start
	var fencing []Worker
	for _, wk := range s.workerList() {
		_, local := wk.(*Local)
		c, ok := s.lastCaps(wk)
		if !ok {
			c, ok = storedCaps[wk.ID()] // not heard from since this process started
		}
		if !ok || !c.Fencing {
			continue // a worker that takes no lease is never declared lost
		}
		if !local { // this process's own worker is leased, never lost
			fencing = append(fencing, wk)
		}
		f.mu.Lock()
		st := f.workers[wk.ID()]
		if st == nil {
			st = &leaseState{leased: start, tried: start}
			f.workers[wk.ID()] = st
		}
		st.epoch = epochs[wk.ID()]
		fresh := now.Sub(st.leased) < lt.suspectAfter
		send, probe := !st.pending && fresh, !st.pending && !fresh
		if send {
			st.pending, st.tried = true, now
		}
		f.mu.Unlock()
		if send {
			f.calls.Go(func() { s.leaseOne(ctx, f, wk, lt) })
		} else if probe {
			// Suspect: no more leases, but a worker that answers again
			// is leased again at once.
			f.calls.Go(func() { s.probeSuspect(ctx, f, wk, lt) })
		}
	}
	for _, wk := range fencing {
		if s.lost(f, wk, lt) {
			if err := s.fenceWorker(ctx, f, wk); err != nil && ctx.Err() == nil {
				s.log.Error("fence lost worker", "worker_id", wk.ID(), "err", err)
			}
		}
	}
	s.startRecoveries(ctx, f)
}

// lost reports whether wk is to be fenced: no lease for RecoverAfter, no
// lease sent that may still reach it and last, and another worker was
// leased lately (so it is not this replica that is cut off).
func (s *Server) lost(f *fencer, wk Worker, lt leaseTimes) bool {
	now, start := s.now(), f.start
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.workers[wk.ID()]
	if st == nil || st.pending || now.Sub(st.leased) < s.cfg.RecoverAfter || now.Sub(st.tried) < lt.ttl+lt.call+time.Second {
		return false
	}
	if s.hasLocal() {
		return true
	}
	for id, o := range f.workers {
		if id != wk.ID() && now.Sub(o.leased) < lt.ttl && o.leased.After(start) {
			return true
		}
	}
	return false
}

// hasLocal reports whether this process has an embedded worker (which
// the leader reaches, so it is not cut off).
func (s *Server) hasLocal() bool {
	for _, wk := range s.workerList() {
		if _, ok := wk.(*Local); ok {
			return true
		}
	}
	return false
}

// leaseOne sends wk its lease.
func (s *Server) leaseOne(ctx context.Context, f *fencer, wk Worker, lt leaseTimes) {
	ok := false
	defer func() {
		f.mu.Lock()
		st := f.workers[wk.ID()]
		st.pending = false
		if ok {
			st.leased = s.now()
		}
		f.mu.Unlock()
	}()
	if _, leading := s.elector.Leading(); !leading {
		return // a lease is only the leader's to give
	}
	keep, err := s.kept(ctx, wk.ID())
	if err != nil {
		s.log.Warn("lease: list the worker's sandboxes", "worker_id", wk.ID(), "err", err)
		return
	}
	f.mu.Lock()
	epoch := f.workers[wk.ID()].epoch
	f.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, lt.call)
	defer cancel()
	rep, err := wk.Lease(cctx, workerproto.LeaseRequest{Epoch: epoch, TTLMS: lt.ttl.Milliseconds(), Keep: keep})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Debug("lease failed", "worker_id", wk.ID(), "epoch", epoch, "err", err)
		}
		return
	}
	ok = true
	if len(rep.Removed) > 0 {
		s.log.Warn("fenced worker removed the sandboxes taken from it", "worker_id", wk.ID(), "epoch", rep.Epoch, "removed", rep.Removed)
	}
}

// probeSuspect asks a suspect worker for its status; one that answers is
// leased again at once.
func (s *Server) probeSuspect(ctx context.Context, f *fencer, wk Worker, lt leaseTimes) {
	f.mu.Lock()
	st := f.workers[wk.ID()]
	if st.pending {
		f.mu.Unlock()
		return
	}
	st.pending = true
	f.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, lt.call)
	_, err := wk.Status(cctx)
	cancel()
	f.mu.Lock()
	st.pending = err == nil
	if err == nil {
		st.tried = s.now()
	}
	f.mu.Unlock()
	if err == nil {
		s.leaseOne(ctx, f, wk, lt)
	}
}

// kept returns the sandboxes the store places on worker id that the
// worker keeps: all but those recovering elsewhere or failed.
func (s *Server) kept(ctx context.Context, id string) ([]string, error) {
	recs, err := s.cfg.Store.SandboxesByWorker(ctx, id)
	if err != nil {
		return nil, err
	}
	keep := []string{}
	for _, rec := range recs {
		if rec = loaded(rec); rec.State != sandbox.Recovering && rec.State != sandbox.Failed {
			keep = append(keep, rec.ID)
		}
	}
	return keep, nil
}

// fenceWorker takes the running sandboxes of lost worker wk away from it:
// it raises wk's epoch, then marks each recovering (or failed, without a
// checkpoint). A worker with none keeps its epoch.
func (s *Server) fenceWorker(ctx context.Context, f *fencer, wk Worker) error {
	recs, err := s.cfg.Store.SandboxesByWorker(ctx, wk.ID())
	if err != nil {
		return err
	}
	var take []store.Sandbox
	for _, rec := range recs {
		if rec = loaded(rec); rec.State == sandbox.Running || rec.State == sandbox.Paused {
			take = append(take, rec)
		}
	}
	if len(take) == 0 {
		return nil
	}
	cctx, release, err := s.claim(ctx, "fence/"+wk.ID())
	if err != nil {
		return err
	}
	defer release()
	f.mu.Lock()
	from := f.workers[wk.ID()].epoch
	f.mu.Unlock()
	epoch, err := s.writes(cctx).RaiseWorkerEpoch(cctx, wk.ID(), from)
	if err != nil {
		return err // a conflict: the next round reads the epoch again
	}
	lostAt := s.now()
	f.mu.Lock()
	f.workers[wk.ID()].epoch = epoch
	seen := f.workers[wk.ID()].leased
	f.mu.Unlock()
	s.metrics.workersLost.Inc()
	s.log.Warn("worker lost: fenced", "worker_id", wk.ID(), "epoch", epoch, "sandboxes", len(take), "recover_after", s.cfg.RecoverAfter)
	var errs []error
	for _, rec := range take {
		err := s.settle(ctx, rec.ID, func(ctx context.Context) error { return s.markRecovering(ctx, wk.ID(), rec, seen, lostAt) })
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", rec.ID, err))
		}
	}
	return errors.Join(errs...)
}

// markRecovering records rec, on worker lost (last heard from at seen,
// declared lost at lostAt), as recovering from its latest checkpoint, or
// failed if it has none.
func (s *Server) markRecovering(ctx context.Context, lost string, rec store.Sandbox, seen, lostAt time.Time) error {
	rec, err := s.cfg.Store.Sandbox(ctx, rec.TeamID, rec.ID)
	if err != nil {
		return err
	}
	if rec = loaded(rec); rec.WorkerID != lost || (rec.State != sandbox.Running && rec.State != sandbox.Paused) {
		return nil
	}
	cps, err := s.checkpointsOf(ctx, rec.TeamID, rec.ID)
	if err != nil {
		return err
	}
	if len(cps) == 0 {
		reason := fmt.Sprintf("worker %s was lost at %s and the sandbox has no checkpoint to recover from (set a checkpoint policy to have one)", lost, lostAt.Format(time.RFC3339))
		s.log.Warn("lost sandbox has no checkpoint: failed", "sandbox_id", rec.ID, "worker_id", lost)
		_, err := s.transition(ctx, rec, sandbox.Failed, func(sb *store.Sandbox) { setHandle(sb, stored{Reason: reason, LostWorker: lost}) })
		if err == nil {
			s.metrics.recoveries.WithLabelValues(recoveryNoCheckpoint).Inc()
		}
		return err
	}
	plan := &recovery{LostWorker: lost, LastSeen: seen, LostAt: lostAt, Checkpoint: cps[0].ID, CheckpointAt: cps[0].Created}
	why := fmt.Sprintf("worker %s was lost at %s; restoring from checkpoint %s", lost, lostAt.Format(time.RFC3339), cps[0].ID)
	_, err = s.transition(store.WithReason(ctx, why), rec, sandbox.Recovering, func(sb *store.Sandbox) { setHandle(sb, stored{Recovery: plan}) })
	return err
}

// setHandle stores st as sb's handle.
func setHandle(sb *store.Sandbox, st stored) {
	b, _ := json.Marshal(st)
	sb.Handle = b
}

// startRecoveries starts the restore of every recovering sandbox that
// has none in flight.
func (s *Server) startRecoveries(ctx context.Context, f *fencer) {
	for _, wk := range s.workerList() {
		recs, err := s.cfg.Store.SandboxesByWorker(ctx, wk.ID())
		if err != nil {
			s.log.Warn("recovery: list sandboxes", "worker_id", wk.ID(), "err", err)
			continue
		}
		for _, rec := range recs {
			if rec = loaded(rec); rec.State != sandbox.Recovering {
				continue
			}
			f.mu.Lock()
			busy := f.recovering[rec.ID]
			f.mu.Unlock()
			if busy {
				continue
			}
			select {
			case f.slots <- struct{}{}:
			default:
				return
			}
			f.mu.Lock()
			f.recovering[rec.ID] = true
			f.mu.Unlock()
			f.calls.Go(func() {
				defer func() {
					f.mu.Lock()
					delete(f.recovering, rec.ID)
					f.mu.Unlock()
					<-f.slots
				}()
				err := s.settle(ctx, rec.ID, func(ctx context.Context) error { return s.recoverOne(ctx, rec) })
				if err != nil && ctx.Err() == nil {
					s.log.Warn("recovery attempt failed", "sandbox_id", rec.ID, "err", err)
				}
			})
		}
	}
}

// recoverOne restores recovering sandbox listed on another worker from
// its plan's checkpoint, and records it running there.
func (s *Server) recoverOne(ctx context.Context, listed store.Sandbox) error {
	rec, err := s.cfg.Store.Sandbox(ctx, listed.TeamID, listed.ID)
	if err != nil {
		return err
	}
	if rec = loaded(rec); rec.State != sandbox.Recovering {
		return nil
	}
	st, err := handleOf(rec)
	if err != nil || st.Recovery == nil {
		return s.failRecovery(ctx, rec, fmt.Sprintf("recovering sandbox has no recovery plan (%v)", err))
	}
	plan := st.Recovery
	sp, err := specOf(rec)
	if err != nil {
		return s.failRecovery(ctx, rec, err.Error())
	}
	sn, err := s.cfg.Store.Snapshot(ctx, rec.TeamID, plan.Checkpoint)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return s.failRecovery(ctx, rec, fmt.Sprintf("checkpoint %s to recover from is gone", plan.Checkpoint))
		}
		return err
	}
	m, err := metaOf(sn)
	if err != nil {
		return s.failRecovery(ctx, rec, err.Error())
	}
	// The target: the one a crashed attempt recorded, if it has the
	// sandbox already; else one of the lost worker's chunk store.
	var target Worker
	if rec.WorkerID != plan.LostWorker {
		if wk, err := s.worker(rec.WorkerID); err == nil {
			if inf, err := wk.Sandbox(ctx, rec.ID); err == nil && inf.State == sandbox.Running {
				return s.recovered(ctx, rec, wk, inf, plan)
			}
			target = wk
		}
	}
	if target == nil {
		if target, err = s.recoveryTarget(ctx, rec, plan, sp, sn, m); err != nil {
			if errors.Is(err, errkind.FailedPrecondition) {
				return s.failRecovery(ctx, rec, err.Error())
			}
			return err // none has room now: the next round tries again
		}
		rec.WorkerID = target.ID()
		if rec, err = s.writes(ctx).UpdateSandbox(ctx, rec); err != nil {
			return err
		}
	}
	values, err := s.secretValues(ctx, rec.TeamID, sp.Secrets)
	if err != nil {
		return s.retryRecovery(ctx, rec, plan, err)
	}
	t0 := s.now()
	inf, err := target.Create(ctx, worker.CreateRequest{ID: rec.ID, Team: rec.TeamID, Spec: sp.Spec, FromSnapshot: plan.Checkpoint, SecretValues: values})
	if err != nil {
		if derr := target.Delete(ctx, rec.ID); derr != nil && !errors.Is(derr, errkind.NotFound) {
			err = errors.Join(err, fmt.Errorf("remove the failed restore: %w", derr))
		}
		return s.retryRecovery(ctx, rec, plan, err)
	}
	s.log.Info("sandbox restored on another worker", "sandbox_id", rec.ID, "worker_id", target.ID(), "restore_ms", s.now().Sub(t0).Milliseconds())
	return s.recovered(ctx, rec, target, inf, plan)
}

// recoveryTarget picks a worker to restore rec on: healthy, not the lost
// one, with the checkpoint's VMM and the lost worker's chunk store (a
// shared one; a local chunk store is the lost host's alone, and that is
// a FailedPrecondition error).
func (s *Server) recoveryTarget(ctx context.Context, rec store.Sandbox, plan *recovery, sp spec, sn store.Snapshot, m snapshotMeta) (Worker, error) {
	if !m.Chunked {
		return nil, fmt.Errorf("checkpoint %s was kept on worker %s's own disk: %w", sn.ID, plan.LostWorker, errkind.FailedPrecondition)
	}
	chunks, err := s.chunkStoreOf(ctx, plan.LostWorker)
	if err != nil {
		return nil, err
	}
	if chunks == "" || chunks == "local" {
		return nil, fmt.Errorf("checkpoint %s is in worker %s's local chunk store: recovery on another host needs a shared (S3) chunk store: %w",
			sn.ID, plan.LostWorker, errkind.FailedPrecondition)
	}
	var cands []Worker
	for _, wk := range s.healthyWorkers() {
		if wk.ID() == plan.LostWorker {
			continue
		}
		if c, ok := s.lastCaps(wk); ok && c.ChunkStore == chunks {
			cands = append(cands, wk)
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("no healthy worker shares chunk store %s with lost worker %s: %w", chunks, plan.LostWorker, errkind.Unavailable)
	}
	return s.place(ctx, cands, sp.Spec, placement{snapshot: sn.ID, vmm: m.VMM})
}

// recovered records rec running on wk, restored from plan's checkpoint.
func (s *Server) recovered(ctx context.Context, rec store.Sandbox, wk Worker, inf worker.Info, plan *recovery) error {
	now := s.now()
	rf := &api.Recovery{
		Checkpoint: plan.Checkpoint, CheckpointAt: plan.CheckpointAt, LostWorker: plan.LostWorker,
		LastSeen: plan.LastSeen, LostAt: plan.LostAt, RecoveredAt: now, LostWorkSeconds: max(0, plan.LastSeen.Sub(plan.CheckpointAt).Seconds()),
	}
	_, err := s.transition(ctx, rec, sandbox.Running, func(sb *store.Sandbox) {
		sb.WorkerID = wk.ID()
		setHandle(sb, stored{VM: inf.VM, Recovered: rf})
	})
	if err != nil {
		return err
	}
	s.metrics.recoveries.WithLabelValues(recoveryRecovered).Inc()
	s.metrics.lostWork.Observe(rf.LostWorkSeconds)
	s.log.Warn("sandbox recovered from its latest checkpoint", "sandbox_id", rec.ID, "worker_id", wk.ID(), "lost_worker", plan.LostWorker,
		"checkpoint", plan.Checkpoint, "lost_work_s", rf.LostWorkSeconds, "down_s", now.Sub(plan.LostAt).Seconds())
	return nil
}

// retryRecovery counts a failed restore of rec: the next round tries
// again, on any worker, until recoverAttempts have failed.
func (s *Server) retryRecovery(ctx context.Context, rec store.Sandbox, plan *recovery, cause error) error {
	p := *plan
	p.Attempts++
	p.LastError = cause.Error()
	if p.Attempts >= recoverAttempts {
		return errors.Join(cause, s.failRecovery(ctx, rec, fmt.Sprintf("restore from checkpoint %s failed %d times; last: %v", p.Checkpoint, p.Attempts, cause)))
	}
	rec.WorkerID = p.LostWorker // placed anew next time
	setHandle(&rec, stored{Recovery: &p})
	_, err := s.writes(ctx).UpdateSandbox(ctx, rec)
	return errors.Join(cause, err)
}

// failRecovery records rec failed for reason.
func (s *Server) failRecovery(ctx context.Context, rec store.Sandbox, reason string) error {
	s.log.Error("sandbox recovery failed", "sandbox_id", rec.ID, "reason", reason)
	lost := ""
	if st, err := handleOf(rec); err == nil && st.Recovery != nil && st.Recovery.LostWorker == rec.WorkerID {
		lost = rec.WorkerID
	}
	_, err := s.transition(ctx, rec, sandbox.Failed, func(sb *store.Sandbox) { setHandle(sb, stored{Reason: reason, LostWorker: lost}) })
	if err == nil {
		s.metrics.recoveries.WithLabelValues(recoveryFailed).Inc()
	}
	return err
}

// chunkStoreOf returns the chunk store worker id states (its last
// answer, or what it registered with), or "" if that is not known.
func (s *Server) chunkStoreOf(ctx context.Context, id string) (string, error) {
	if wk, err := s.worker(id); err == nil {
		if c, ok := s.lastCaps(wk); ok {
			return c.ChunkStore, nil
		}
	}
	ws, err := s.cfg.Store.ListWorkers(ctx)
	if err != nil {
		return "", err
	}
	for _, w := range ws {
		var c workerproto.Capabilities
		if w.ID == id && len(w.Capabilities) > 0 && json.Unmarshal(w.Capabilities, &c) == nil {
			return c.ChunkStore, nil
		}
	}
	return "", nil
}
