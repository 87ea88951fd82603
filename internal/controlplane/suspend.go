package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/worker"
)

// handleSuspend snapshots a sandbox into the chunk store and stops its VM,
// freeing the worker's memory; resume starts it again from the snapshot,
// on any worker. Steps, each persisted before the next: snapshot taken;
// record stopping with the snapshot named; VM destroyed; record
// suspended (the snapshot still named).
func (s *Server) handleSuspend(w http.ResponseWriter, r *http.Request) {
	sb, wk, err := s.running(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	ctx, release, err := s.claim(context.WithoutCancel(r.Context()), sb.ID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer release()
	if sb, err = s.suspend(ctx, sb, wk); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.writeView(w, http.StatusOK, sb)
}

// handleSetTimeout sets a sandbox's timeout counted from now
// (api.SetTimeout), and its idle time if it suspends on its timeout.
func (s *Server) handleSetTimeout(w http.ResponseWriter, r *http.Request) {
	var req api.SetTimeout
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if max := int64(s.cfg.Limits.MaxTTL / time.Second); req.TimeoutSeconds < 1 || req.TimeoutSeconds > max {
		httpapi.WriteError(w, httpapi.Invalid("timeout_seconds", "%d is outside 1..%d", req.TimeoutSeconds, max))
		return
	}
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if !live(sb.State) && sb.State != sandbox.Suspended {
		httpapi.WriteError(w, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errkind.FailedPrecondition))
		return
	}
	d := time.Duration(req.TimeoutSeconds) * time.Second
	sb, err = s.updateRecord(r.Context(), sb, func(rec *store.Sandbox, sp *spec) {
		sp.TimeoutSeconds = req.TimeoutSeconds
		if rec.State != sandbox.Suspended || sp.OnTimeout != onTimeoutSuspend {
			rec.Expires = s.now().Add(d)
		}
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.expiries.note(sb.Expires)
	s.writeView(w, http.StatusOK, sb)
}

// suspend snapshots sb to the chunk store and stops its VM. The caller
// claims sb.
func (s *Server) suspend(ctx context.Context, sb store.Sandbox, wk Worker) (_ store.Sandbox, err error) {
	defer s.metrics.observeOp(opSuspend, time.Now(), &err)
	sn, err := s.snapshot(ctx, sb, wk, "")
	if err != nil {
		return sb, err
	}
	m, err := metaOf(sn)
	if err != nil {
		return sb, errors.Join(fmt.Errorf("suspend %s: %w", sb.ID, err), s.deleteSnapshot(ctx, sn))
	}
	if !m.Chunked {
		return sb, errors.Join(
			fmt.Errorf("suspend %s: its worker keeps snapshots only on its own disk: %w", sb.ID, errkind.FailedPrecondition),
			s.deleteSnapshot(ctx, sn))
	}
	if sb, err = s.transition(ctx, sb, sandbox.Stopping, func(rec *store.Sandbox) { setSuspended(rec, sn.ID) }); err != nil {
		return sb, err
	}
	s.crash("api.suspend.stopping-saved")
	if sb, err = s.finishSuspend(ctx, sb); err != nil {
		return sb, err
	}
	s.log.Info("sandbox suspended", "sandbox_id", sb.ID, "snapshot_id", sn.ID)
	return sb, nil
}

// finishSuspend destroys the VM of a sandbox whose suspend snapshot is
// recorded, and records it suspended (no worker: it may resume anywhere).
func (s *Server) finishSuspend(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	sp, err := specOf(sb)
	if err != nil {
		return sb, fmt.Errorf("suspend: %w", err)
	}
	if sb.WorkerID != "" {
		wk, err := s.worker(sb.WorkerID)
		if err != nil {
			return sb, err
		}
		if err := s.archiveEgress(ctx, wk, sb); err != nil {
			return sb, err
		}
		if err := wk.Delete(ctx, sb.ID); err != nil && !errors.Is(err, errkind.NotFound) {
			return sb, err
		}
	}
	sb, err = s.transition(ctx, sb, sandbox.Suspended, func(rec *store.Sandbox) {
		rec.WorkerID = ""
		if sp.OnTimeout == onTimeoutSuspend {
			rec.Expires = time.Time{} // it waits, suspended, for a resume
		}
	})
	return sb, err
}

// resumeSuspended starts a suspended sandbox from its snapshot, on the
// worker with the most room, with its ID, and then drops the snapshot.
func (s *Server) resumeSuspended(w http.ResponseWriter, r *http.Request, sb store.Sandbox) {
	ctx, release, err := s.claim(context.WithoutCancel(r.Context()), sb.ID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer release()
	snap, err := suspendedFrom(sb)
	if err != nil {
		httpapi.WriteError(w, fmt.Errorf("resume: %w", err))
		return
	}
	sp, err := specOf(sb)
	if err != nil {
		httpapi.WriteError(w, fmt.Errorf("resume: %w", err))
		return
	}
	// It resumes on a worker whose VMM took the snapshot.
	pl, err := s.suspendPlacement(ctx, sb.TeamID, snap)
	if err != nil {
		httpapi.WriteError(w, fmt.Errorf("resume: %w", err))
		return
	}
	// The store admits the resumed sandbox within the team's quota in
	// the transaction that records it creating.
	q, err := s.quota(ctx, sb.TeamID)
	var wk Worker
	if err == nil {
		wk, err = s.place(ctx, s.healthyWorkers(), sp.Spec, pl)
	}
	if err == nil {
		err = sandbox.Check(sb.State, sandbox.Creating)
	}
	if err == nil {
		sb.State = sandbox.Creating
		sb.WorkerID = wk.ID()
		if sp.OnTimeout == onTimeoutSuspend {
			sb.Expires = s.now().Add(time.Duration(sp.TimeoutSeconds) * time.Second) // idle from now
		}
		sb, err = s.writes(ctx).UpdateSandboxWithinQuota(ctx, sb, storeQuota(q))
		s.metrics.quotaRefused(err)
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.expiries.note(sb.Expires)
	s.crash("api.resume.creating-saved")
	// The worker seals the grants' values anew: the snapshot has the
	// grants (and the policy) as stored, not the values.
	values, err := s.secretValues(ctx, sb.TeamID, sp.Secrets)
	var inf worker.Info
	if err == nil {
		inf, err = wk.Create(ctx, worker.CreateRequest{ID: sb.ID, Team: sb.TeamID, FromSnapshot: snap, SecretValues: values})
	}
	if err != nil {
		httpapi.WriteError(w, errors.Join(err, s.unresume(ctx, wk, sb)))
		return
	}
	if sb, err = s.transition(ctx, sb, sandbox.Running, func(rec *store.Sandbox) { setVM(rec, inf.VM) }); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.dropSuspendSnapshot(ctx, sb.TeamID, snap)
	s.log.Info("sandbox resumed", "sandbox_id", sb.ID, "worker_id", wk.ID())
	s.writeView(w, http.StatusOK, sb)
}

// suspendPlacement is where a suspended sandbox of team resumes from its
// snapshot snap: any worker whose VMM took it.
func (s *Server) suspendPlacement(ctx context.Context, team, snap string) (placement, error) {
	sn, err := s.cfg.Store.Snapshot(ctx, team, snap)
	if errors.Is(err, store.ErrNotFound) {
		return placement{}, fmt.Errorf("its suspend snapshot %s is gone: %w", snap, errkind.FailedPrecondition)
	}
	if err != nil {
		return placement{}, err
	}
	m, err := metaOf(sn)
	if err != nil {
		return placement{}, err
	}
	return placement{snapshot: snap, vmm: m.VMM}, nil
}

// unresume puts a sandbox whose resume failed back to suspended.
func (s *Server) unresume(ctx context.Context, wk Worker, sb store.Sandbox) error {
	if err := wk.Delete(ctx, sb.ID); err != nil && !errors.Is(err, errkind.NotFound) {
		return err
	}
	sb, err := s.transition(ctx, sb, sandbox.Stopping, nil)
	if err != nil {
		return err
	}
	_, err = s.finishSuspend(ctx, sb)
	return err
}

// dropSuspendSnapshot removes a resumed sandbox's suspend snapshot: the
// sandbox owns copies of everything in it now.
func (s *Server) dropSuspendSnapshot(ctx context.Context, team, snap string) {
	sn, err := s.cfg.Store.Snapshot(ctx, team, snap)
	if err == nil {
		err = s.deleteSnapshot(ctx, sn)
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("remove suspend snapshot", "snapshot_id", snap, "err", err)
	}
}

func (s *Server) healthyWorkers() []Worker {
	var healthy []Worker
	for _, w := range s.workerList() {
		if s.healthy(w) {
			healthy = append(healthy, w)
		}
	}
	return healthy
}
