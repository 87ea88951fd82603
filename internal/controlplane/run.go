package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"space/internal/errkind"
	"space/internal/origin"
	"space/internal/sandbox"
	"space/internal/store"
)

// Reconcile settles what a crash left between the control plane's steps,
// for every sandbox placed on a connected worker: a create the worker
// finished becomes running, one it does not have is rolled back; a delete
// under way is finished; a running sandbox its worker lost is failed. Run
// it before serving.
func (s *Server) Reconcile(ctx context.Context) (err error) {
	defer func() { s.metrics.reconciles.WithLabelValues(outcome(err)).Inc() }()
	if origin.From(ctx).Kind == "" {
		ctx = s.leaderOrigin(ctx)
	}
	// What any replica works on is left alone (claims.go).
	busy, err := s.claims.all(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	// Each worker on its own: one that hangs holds up only its own
	// sandboxes (every call to it has a deadline), and one that does
	// not answer is skipped until it does.
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, wk := range s.workerList() {
		if !s.answering(wk) {
			continue
		}
		wg.Go(func() {
			err := s.reconcileWorker(ctx, wk, busy)
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		})
	}
	wg.Wait()
	return errors.Join(append(errs, s.reconcileSnapshots(ctx, busy), s.reconcileTemplates(ctx, busy))...)
}

// reconcileWorker settles the sandboxes placed on wk.
func (s *Server) reconcileWorker(ctx context.Context, wk Worker, busy claimed) error {
	recs, err := s.cfg.Store.SandboxesByWorker(ctx, wk.ID())
	if err != nil {
		return err
	}
	var errs []error
	for _, rec := range recs {
		if busy.busy(rec.ID) {
			continue // a replica's operation is under way
		}
		err := s.settle(ctx, rec.ID, func(ctx context.Context) error {
			// Read again under the claim: what the list said may be
			// settled already.
			rec, err := s.cfg.Store.Sandbox(ctx, rec.TeamID, rec.ID)
			if errors.Is(err, store.ErrNotFound) || (err == nil && rec.WorkerID != wk.ID()) {
				return nil
			}
			if err != nil {
				return err
			}
			return s.reconcile(ctx, wk, rec)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("reconcile %s on %s: %w", rec.ID, wk.ID(), err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// reconcileSnapshots settles the snapshots a crash left being created or
// deleted. A creating one is rolled back: its caller never had an answer,
// and until it is ready nothing may start from it. A deleting one is
// deleted. Either way every worker's copy and the chunk store's manifest
// go before the record, so no half-written snapshot is ever listed ready.
// A snapshot whose worker has not registered yet waits for it. A creating
// fork snapshot means the fork never answered: the children it made go
// first (a child that cannot go yet keeps the snapshot for the next
// round).
func (s *Server) reconcileSnapshots(ctx context.Context, busy claimed) error {
	pending, err := s.cfg.Store.UnsettledSnapshots(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, sn := range pending {
		if busy.busy(sn.ID) {
			continue
		}
		if _, err := s.worker(sn.WorkerID); err != nil {
			continue
		}
		err := s.settle(ctx, sn.ID, func(ctx context.Context) error {
			sn, err := s.cfg.Store.Snapshot(ctx, sn.TeamID, sn.ID)
			if errors.Is(err, store.ErrNotFound) || (err == nil && sn.State != store.SnapshotCreating && sn.State != store.SnapshotDeleting) {
				return nil
			}
			if err != nil {
				return err
			}
			s.log.Info("settling interrupted snapshot", "snapshot_id", sn.ID, "state", sn.State)
			if sn.State == store.SnapshotCreating {
				if err := s.removeForkChildren(ctx, sn); err != nil {
					return err
				}
			}
			if err := s.deleteSnapshot(ctx, sn); err != nil && !errors.Is(err, store.ErrVersionConflict) && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("settle snapshot %s: %w", sn.ID, err))
		}
	}
	return errors.Join(errs...)
}

// removeForkChildren deletes the sandboxes made by the fork whose
// snapshot sn is (none if it is not a fork's). A sandbox whose spec does
// not decode cannot be told apart and is reported, not removed.
func (s *Server) removeForkChildren(ctx context.Context, sn store.Snapshot) error {
	all, err := s.cfg.Store.ListSandboxes(ctx, sn.TeamID, store.Filter{})
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range all {
		sp, err := specOf(sb)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if sp.Fork != sn.ID {
			continue
		}
		s.log.Info("removing a child of an interrupted fork", "sandbox_id", sb.ID, "snapshot_id", sn.ID)
		if err := s.delete(ctx, sb); err != nil && !errors.Is(err, store.ErrNotFound) {
			return errors.Join(append(errs, fmt.Errorf("fork child %s: %w", sb.ID, err))...)
		}
	}
	return errors.Join(errs...)
}

func (s *Server) reconcile(ctx context.Context, wk Worker, rec store.Sandbox) error {
	rec = loaded(rec)
	snap, err := suspendedFrom(rec)
	if err != nil {
		return err
	}
	inf, err := wk.Sandbox(ctx, rec.ID)
	missing := errors.Is(err, errkind.NotFound)
	if err != nil && !missing {
		return err
	}
	log := s.log.With("sandbox_id", rec.ID, "worker_id", wk.ID())
	if rec.State == sandbox.Recovering {
		return nil // the leader's recovery drives it (recovery.go)
	}
	if snap != "" {
		switch rec.State {
		case sandbox.Stopping: // a suspend: its snapshot is safe; finish it
			log.Info("finishing interrupted suspend")
			_, err := s.finishSuspend(ctx, rec)
			return err
		case sandbox.Creating: // a resume
			if !missing && inf.State == sandbox.Running {
				log.Info("completing interrupted resume")
				if _, err := s.transition(ctx, rec, sandbox.Running, func(sb *store.Sandbox) { setVM(sb, inf.VM) }); err != nil {
					return err
				}
				s.dropSuspendSnapshot(ctx, rec.TeamID, snap)
				return nil
			}
			log.Info("rolling back interrupted resume")
			return s.unresume(ctx, wk, rec)
		}
	}
	switch rec.State {
	case sandbox.Creating:
		if missing || inf.State != sandbox.Running {
			log.Info("rolling back interrupted create")
			return s.rollback(store.WithReason(ctx, "reconcile: the create was interrupted; rolled back"), wk, rec)
		}
		log.Info("completing interrupted create")
		_, err := s.transition(ctx, rec, sandbox.Running, func(sb *store.Sandbox) { setVM(sb, inf.VM) })
		return err
	case sandbox.Stopping:
		log.Info("finishing interrupted delete")
		return s.delete(ctx, rec)
	case sandbox.Running, sandbox.Paused:
		if missing || inf.State == sandbox.Failed {
			log.Warn("worker lost the sandbox", "error", inf.Error)
			reason := fmt.Sprintf("reconcile: worker %s no longer has the VM", wk.ID())
			if !missing {
				reason = fmt.Sprintf("reconcile: worker %s reports the VM failed", wk.ID())
				if inf.Error != "" {
					reason += ": " + inf.Error
				}
			}
			_, err := s.transition(store.WithReason(ctx, reason), rec, sandbox.Failed, nil)
			return err
		}
		if inf.State != rec.State && (inf.State == sandbox.Running || inf.State == sandbox.Paused) {
			// A pause or resume the worker did, whose record the
			// control plane did not write before it stopped.
			log.Info("recording the worker's state", "state", inf.State)
			_, err := s.transition(ctx, rec, inf.State, nil)
			return err
		}
	}
	return nil
}

// Run probes the workers until ctx ends and, while this replica leads
// (package leader: one replica of those sharing the store at a time),
// does the background work: it removes expired sandboxes, reconciles the
// workers' sandboxes with the store, and prunes egress logs. A new term
// starts with a reconcile, which settles what a dead leader (or any dead
// replica) left half done once its claims expire.
func (s *Server) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.runProbes(ctx) })
	s.releaseEarlierLeadership(ctx)
	wg.Go(func() {
		if err := s.elector.Run(ctx); err != nil {
			s.log.Error("leader election", "err", err)
		}
	})
	for {
		term, lease, err := s.elector.Await(ctx)
		if err != nil {
			return nil // ctx ended
		}
		s.log.Info("leading the background work", "token", lease.Token)
		s.metrics.leaderChanges.Inc()
		lctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(term, cancel)
		s.lead(lctx)
		stop()
		cancel()
		s.metrics.leaderChanges.Inc()
		if ctx.Err() != nil {
			return nil
		}
		s.log.Info("no longer leading the background work", "cause", context.Cause(term))
	}
}

// lead does the leader's background work until ctx ends: reaping,
// reconciling, automatic checkpoints (checkpoints.go) and webhook
// deliveries (webhooks.go).
func (s *Server) lead(ctx context.Context) {
	reap := newReapTimer(s.cfg.ReapInterval, s.now)
	defer reap.t.Stop()
	rec := time.NewTicker(s.cfg.ReconcileInterval)
	defer rec.Stop()
	round := func() {
		if err := s.Reconcile(s.leaderOrigin(ctx)); err != nil && ctx.Err() == nil {
			s.log.Warn("reconcile", "err", err)
		}
		s.pruneEgressLogs(ctx)
		s.pruneEvents(ctx)
		s.pruneAudit(ctx)
	}
	round()
	var ckpts sync.WaitGroup
	defer ckpts.Wait()
	ckpts.Go(func() { s.runCheckpoints(ctx) })
	ckpts.Go(func() { s.runFencing(ctx) })
	ckpts.Go(func() { s.runWebhooks(ctx) })
	watch := time.NewTicker(deadClaimsEvery)
	defer watch.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reap.t.C:
			reap.at(s.reapExpired(ctx))
		case <-s.expiries.wake:
			reap.sooner(s.expiries.take())
		case <-rec.C:
			round()
		case <-watch.C:
			// A replica died with work claimed: settle it now rather
			// than at the next round.
			if dead, err := s.claims.anyDead(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("watch for dead claims", "err", err)
			} else if dead {
				round()
				rec.Reset(s.cfg.ReconcileInterval)
			}
		}
	}
}

// deadClaimsEvery is how often the leader looks for claims of dead
// replicas.
const deadClaimsEvery = time.Second

// releaseEarlierLeadership ends the leader lease of an earlier life of
// this replica, so that a replica restarted after a crash need not wait
// for it to expire (that process is gone: the data dir is locked while
// a replica runs).
func (s *Server) releaseEarlierLeadership(ctx context.Context) {
	ls, err := s.cfg.Store.ListLeases(ctx, leaderLease)
	if err != nil {
		s.log.Warn("look for an earlier life's leadership", "err", err)
		return
	}
	for _, l := range ls {
		if l.Name == leaderLease && l.Holder != s.claims.holder && sameReplica(l.Holder, s.cfg.ReplicaID) {
			if err := s.cfg.Store.ReleaseLease(ctx, l); err != nil {
				s.log.Warn("release an earlier life's leadership", "err", err)
			}
		}
	}
}

// reapExpired deletes every sandbox whose TTL has passed, and suspends
// those that suspend on an idle timeout. It returns when the next round
// is due for what it saw: the soonest expiry within one ReapInterval, a
// second from now for an expired sandbox it had to skip, or zero for
// none (a round one interval from now).
func (s *Server) reapExpired(ctx context.Context) (next time.Time) {
	now := s.now()
	soon := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	due, err := s.cfg.Store.ExpiredSandboxes(ctx, now.Add(s.cfg.ReapInterval))
	if err != nil {
		s.log.Error("list expired sandboxes", "err", err)
		return time.Time{}
	}
	busy, err := s.claims.all(ctx)
	if err != nil {
		s.log.Error("list claims", "err", err)
		return time.Time{}
	}
	for _, sb := range due {
		if sb.Expires.After(now) {
			soon(sb.Expires)
			continue
		}
		if sb.State == sandbox.Creating || busy.busy(sb.ID) {
			soon(now.Add(retrySkipped)) // an operation is under way: look again soon
			continue
		}
		if err := s.settle(origin.Background(ctx, origin.KindPolicy, "timeout"), sb.ID, s.expire(sb)); err != nil {
			s.log.Error("expired sandbox", "sandbox_id", sb.ID, "err", err)
		}
	}
	return next
}

// expire returns what reapExpired does, under its claim, with a sandbox
// whose expiry passed.
func (s *Server) expire(listed store.Sandbox) func(context.Context) error {
	return func(ctx context.Context) error {
		// Read again under the claim: a replica may have changed it
		// since the list.
		sb, err := s.cfg.Store.Sandbox(ctx, listed.TeamID, listed.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		sb = loaded(sb)
		if sb.Expires.IsZero() || sb.Expires.After(s.now()) || sb.State == sandbox.Creating {
			return nil
		}
		sp, err := specOf(sb)
		if err != nil {
			// Its timeout cannot be told: neither deleted (it may be one
			// to keep) nor suspended.
			return err
		}
		if sp.OnTimeout == onTimeoutSuspend && sb.State != sandbox.Failed {
			s.idleTimeout(ctx, sb, time.Duration(sp.TimeoutSeconds)*time.Second)
			return nil
		}
		s.event(store.WithReason(ctx, "timeout passed; deleting"), sandbox.EventExpired, sb, nil)
		if err := s.delete(ctx, sb); err != nil {
			return err
		}
		s.log.Info("removed expired sandbox", "sandbox_id", sb.ID, "expired", sb.Expires.Format(time.RFC3339))
		return nil
	}
}

// idleTimeout handles a sandbox, claimed by the caller, that suspends
// once idle for timeout and whose expiry passed: if the data plane used
// it since, its expiry moves to timeout after that use; otherwise it is
// suspended (and then does not expire until a resume).
func (s *Server) idleTimeout(ctx context.Context, sb store.Sandbox, timeout time.Duration) {
	if sb.State != sandbox.Running && sb.State != sandbox.Paused {
		return // suspended already, or on its way somewhere
	}
	wk, err := s.worker(sb.WorkerID)
	if err != nil {
		s.log.Warn("idle sandbox's worker is not connected", "sandbox_id", sb.ID, "worker_id", sb.WorkerID)
		return
	}
	// The worker serves the data plane, so it knows the last use.
	inf, err := wk.Sandbox(ctx, sb.ID)
	if err != nil {
		s.log.Warn("ask for idle sandbox's use", "sandbox_id", sb.ID, "err", err)
		return // the next round asks again; reconcile handles a lost one
	}
	now := s.now()
	last, inUse := inf.LastActive, inf.Active > 0
	if inUse || last.Add(timeout).After(now) {
		sb.Expires = last.Add(timeout)
		if inUse {
			sb.Expires = now.Add(timeout)
		}
		if _, err := s.writes(ctx).UpdateSandbox(ctx, sb); err != nil && !errors.Is(err, store.ErrVersionConflict) {
			s.log.Error("extend idle sandbox", "sandbox_id", sb.ID, "err", err)
		} else if err == nil {
			s.expiries.note(sb.Expires)
		}
		return
	}
	s.event(store.WithReason(ctx, fmt.Sprintf("idle for %v; suspending", timeout)), sandbox.EventExpired, sb, nil)
	if _, err = s.suspend(ctx, sb, wk); err != nil {
		// It keeps running: deleting it would lose the work the caller
		// asked to keep. The next round tries again.
		s.log.Error("suspend idle sandbox", "sandbox_id", sb.ID, "err", err)
		return
	}
	s.log.Info("suspended idle sandbox", "sandbox_id", sb.ID, "idle_for", timeout)
}

// leaderOrigin returns ctx with this replica as the actor of the
// leader's background work, and a new request ID for the round.
func (s *Server) leaderOrigin(ctx context.Context) context.Context {
	return origin.Background(ctx, origin.KindLeader, s.cfg.ReplicaID)
}

// claimsHeld is the number of claims this replica holds.
func (s *Server) claimsHeld() int { return s.claims.count() }

// workerHealth counts the workers this replica knows by health.
func (s *Server) workerHealth() (healthy, unhealthy int) {
	for _, w := range s.workerList() {
		if s.healthy(w) {
			healthy++
		} else {
			unhealthy++
		}
	}
	return healthy, unhealthy
}

// Leading reports whether this replica does the background work now.
func (s *Server) Leading() bool {
	_, ok := s.elector.Leading()
	return ok
}
