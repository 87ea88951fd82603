package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"space/api"
	"space/internal/checkpoint"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/origin"
	"space/internal/sandbox"
	"space/internal/store"
)

// Checkpoints. A checkpoint is a snapshot of a running sandbox taken
// because its policy (spec.Checkpoints) said so, or because its owner
// asked with POST .../checkpoints; its metadata says which
// (snapshotMeta.Checkpoint). The leader looks at every running sandbox
// with a policy every CheckpointInterval, has its worker take the ones
// that are due (at most maxCheckpointsAtOnce at a time, one per sandbox:
// a checkpoint that comes due while one runs waits for it), and then
// prunes what the policy no longer keeps. A sandbox's checkpoints go
// with it when it is deleted.

// checkpointMeta is what a checkpoint's snapshot metadata adds.
type checkpointMeta struct {
	Trigger string `json:"trigger"`
	Command string `json:"command,omitempty"`
}

const (
	// maxCheckpointsAtOnce bounds the automatic checkpoints in flight.
	maxCheckpointsAtOnce = 4
	// pruneEvery is how often a sandbox's checkpoints are pruned when no
	// new one was taken (an age limit passes without one).
	pruneEvery = time.Minute
)

// checkpointer is one leadership term's automatic checkpointing.
type checkpointer struct {
	slots   chan struct{}
	running sync.WaitGroup

	mu sync.Mutex
	// +checklocks:mu
	sandboxes map[string]*ckState
}

// ckState is what the leader knows of one sandbox's checkpoints; its
// fields are guarded by checkpointer.mu.
type ckState struct {
	// last is when its latest checkpoint began (or, before the first, when
	// it started); zero until read from the store.
	last time.Time
	// exec is the end (the worker's clock) of the last command a
	// checkpoint covers; zero until one does.
	exec time.Time
	// busy: a checkpoint of it is in flight.
	busy   bool
	pruned time.Time
}

func newCheckpointer() *checkpointer {
	return &checkpointer{slots: make(chan struct{}, maxCheckpointsAtOnce), sandboxes: map[string]*ckState{}}
}

// candidate is a running sandbox with a policy that takes checkpoints.
type candidate struct {
	sb  store.Sandbox
	pol checkpoint.Policy
}

// runCheckpoints checkpoints the sandboxes that are due every
// CheckpointInterval until ctx ends, then waits for those in flight.
func (s *Server) runCheckpoints(ctx context.Context) {
	ck := newCheckpointer()
	defer ck.running.Wait()
	t := time.NewTicker(s.cfg.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Automatic checkpoints are the sandboxes' policy acting;
			// each round is one request.
			s.checkpointRound(origin.Background(ctx, origin.KindPolicy, "checkpoints"), ck)
		}
	}
}

// checkpointRound starts the checkpoints that are due, worker by worker.
func (s *Server) checkpointRound(ctx context.Context, ck *checkpointer) {
	for _, wk := range s.workerList() {
		if ctx.Err() != nil {
			return
		}
		if !s.answering(wk) {
			continue
		}
		cands, err := s.candidates(ctx, wk)
		if err != nil {
			s.log.Warn("checkpoints: list sandboxes", "worker_id", wk.ID(), "err", err)
			continue
		}
		if len(cands) == 0 {
			continue
		}
		execs := map[string]*checkpoint.Exec{}
		// The worker knows the commands that ended; one list answers for
		// all of its sandboxes.
		if infos, err := wk.List(ctx); err == nil {
			for _, inf := range infos {
				if e := inf.LastExec; e != nil {
					execs[inf.ID] = &checkpoint.Exec{Command: e.Command, Started: e.Started, Ended: e.Ended}
				}
			}
		} else {
			s.log.Warn("checkpoints: list the worker's sandboxes", "worker_id", wk.ID(), "err", err)
		}
		for _, c := range cands {
			s.consider(ctx, ck, wk, c, execs[c.sb.ID])
		}
	}
}

// candidates returns wk's running sandboxes whose policy takes
// checkpoints.
func (s *Server) candidates(ctx context.Context, wk Worker) ([]candidate, error) {
	recs, err := s.cfg.Store.SandboxesByWorker(ctx, wk.ID())
	if err != nil {
		return nil, err
	}
	var out []candidate
	for _, rec := range recs {
		rec = loaded(rec)
		if rec.State != sandbox.Running {
			continue // a paused guest changes nothing; the others have no VM
		}
		sp, err := specOf(rec)
		if err != nil || sp.Checkpoints == nil {
			continue
		}
		pol, err := checkpoint.FromAPI("checkpoints", *sp.Checkpoints)
		if err != nil {
			s.log.Error("checkpoints: stored policy does not parse", "sandbox_id", rec.ID, "err", err)
			continue
		}
		if !pol.Off() {
			out = append(out, candidate{rec, pol})
		}
	}
	return out, nil
}

// consider starts a checkpoint of c if one is due and none is in
// flight, or prunes its checkpoints now and then.
func (s *Server) consider(ctx context.Context, ck *checkpointer, wk Worker, c candidate, exec *checkpoint.Exec) {
	ck.mu.Lock()
	st, known := ck.sandboxes[c.sb.ID]
	if !known {
		st = &ckState{}
		ck.sandboxes[c.sb.ID] = st
	}
	cur := *st
	ck.mu.Unlock()
	if cur.busy {
		return
	}
	if cur.last.IsZero() {
		last, err := s.latestCheckpoint(ctx, c.sb)
		if err != nil {
			s.log.Warn("checkpoints: read the history", "sandbox_id", c.sb.ID, "err", err)
			return
		}
		cur.last = last
	}
	// A command counts once: after the checkpoint that followed it (or,
	// at the start of a term, after the latest checkpoint in the store).
	fresh := exec
	if exec != nil && (!exec.Ended.After(cur.exec) || (cur.exec.IsZero() && !exec.Ended.After(cur.last))) {
		fresh = nil
	}
	now := s.now()
	trigger, due := c.pol.Due(now, cur.last, fresh)
	if !due {
		prune := now.Sub(cur.pruned) >= pruneEvery
		ck.mu.Lock()
		st.last = cur.last
		if prune {
			st.pruned = now
		}
		ck.mu.Unlock()
		if prune {
			s.pruneCheckpoints(ctx, c.sb, c.pol)
		}
		return
	}
	select {
	case ck.slots <- struct{}{}:
	default:
		return // enough in flight: the next round looks again
	}
	cmd := ""
	if exec != nil {
		cmd = exec.Command
	}
	ck.mu.Lock()
	st.last, st.busy = cur.last, true
	ck.mu.Unlock()
	ck.running.Go(func() {
		defer func() { <-ck.slots }()
		started := s.now()
		sn, err := s.autoCheckpoint(ctx, wk, c.sb, trigger, cmd)
		if err == nil && sn.ID != "" {
			s.pruneCheckpoints(ctx, c.sb, c.pol)
		}
		ck.mu.Lock()
		st.busy = false
		// One that failed is not tried again before it would come due
		// anew: a full quota is not asked every round.
		if err != nil || sn.ID != "" {
			st.last, st.pruned = started, s.now()
			if exec != nil {
				st.exec = exec.Ended
			}
		}
		ck.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("automatic checkpoint failed", "sandbox_id", c.sb.ID, "trigger", trigger, "err", err)
		}
	})
}

// latestCheckpoint returns when sb's newest checkpoint was taken, or,
// with none, when sb was created.
func (s *Server) latestCheckpoint(ctx context.Context, sb store.Sandbox) (time.Time, error) {
	cps, err := s.checkpointsOf(ctx, sb.TeamID, sb.ID)
	if err != nil {
		return time.Time{}, err
	}
	if len(cps) == 0 {
		return sb.Created, nil
	}
	return cps[0].Created, nil
}

// autoCheckpoint checkpoints sb on wk for trigger unless an operation on
// sb is under way (then it returns the zero Snapshot: the next round
// looks again) or sb no longer runs there.
func (s *Server) autoCheckpoint(ctx context.Context, wk Worker, sb store.Sandbox, trigger, cmd string) (store.Snapshot, error) {
	var sn store.Snapshot
	err := s.settle(ctx, sb.ID, func(ctx context.Context) error {
		cur, err := s.cfg.Store.Sandbox(ctx, sb.TeamID, sb.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur = loaded(cur); cur.State != sandbox.Running || cur.WorkerID != wk.ID() {
			return nil
		}
		sn, err = s.checkpoint(ctx, cur, wk, checkpointMeta{Trigger: trigger, Command: cmd})
		return err
	})
	return sn, err
}

// checkpoint takes a checkpoint of sb on wk and records it ready.
func (s *Server) checkpoint(ctx context.Context, sb store.Sandbox, wk Worker, cm checkpointMeta) (_ store.Snapshot, err error) {
	defer s.metrics.observeOp(opCheckpoint, time.Now(), &err)
	id := store.NewSnapshotID()
	ctx, release, err := s.claim(ctx, id)
	if err != nil {
		return store.Snapshot{}, err
	}
	defer release()
	sn, err := s.takeSnapshot(ctx, sb, wk, snapshotOpts{id: id, checkpoint: &cm})
	if err != nil {
		return sn, err
	}
	// A delete that listed the sandbox's checkpoints before this one was
	// ready did not see it: it goes now.
	cur, err := s.cfg.Store.Sandbox(ctx, sb.TeamID, sb.ID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && loaded(cur).State == sandbox.Stopping) {
		return store.Snapshot{}, errors.Join(fmt.Errorf("sandbox %s was deleted while it was checkpointed: %w", sb.ID, errkind.NotFound),
			s.deleteSnapshot(ctx, sn))
	}
	s.event(ctx, sandbox.EventCheckpointed, sb, map[string]string{"snapshot_id": sn.ID, "trigger": cm.Trigger})
	return sn, nil
}

// checkpointsOf returns the checkpoints of sandbox sbID, newest first.
func (s *Server) checkpointsOf(ctx context.Context, team, sbID string) ([]store.Snapshot, error) {
	all, err := s.cfg.Store.ListSnapshots(ctx, team, sbID)
	if err != nil {
		return nil, err
	}
	var out []store.Snapshot
	for _, sn := range all {
		if m, err := metaOf(sn); err == nil && m.Checkpoint != nil && sn.State == store.SnapshotReady {
			out = append(out, sn)
		}
	}
	slices.SortFunc(out, func(a, b store.Snapshot) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// pruneCheckpoints removes the checkpoints of sb that pol no longer keeps.
func (s *Server) pruneCheckpoints(ctx context.Context, sb store.Sandbox, pol checkpoint.Policy) {
	cps, err := s.checkpointsOf(ctx, sb.TeamID, sb.ID)
	if err != nil {
		s.log.Warn("prune checkpoints: list", "sandbox_id", sb.ID, "err", err)
		return
	}
	entries := make([]checkpoint.Entry, 0, len(cps))
	byID := map[string]store.Snapshot{}
	for _, c := range cps {
		entries = append(entries, checkpoint.Entry{ID: c.ID, Created: c.Created})
		byID[c.ID] = c
	}
	for _, id := range pol.Prune(s.now(), entries) {
		err := s.settle(ctx, id, func(ctx context.Context) error { return s.deleteSnapshot(ctx, byID[id]) })
		if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrVersionConflict) {
			s.log.Warn("prune checkpoint", "sandbox_id", sb.ID, "snapshot_id", id, "err", err)
			continue
		}
		s.log.Debug("checkpoint pruned", "sandbox_id", sb.ID, "snapshot_id", id)
	}
}

// dropCheckpoints removes every checkpoint of sb (being deleted). One
// still being taken is not listed: its taker removes it once it sees
// sb going (checkpoint).
func (s *Server) dropCheckpoints(ctx context.Context, sb store.Sandbox) error {
	cps, err := s.checkpointsOf(ctx, sb.TeamID, sb.ID)
	if err != nil {
		return err
	}
	for _, c := range cps {
		if err := s.deleteSnapshot(ctx, c); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrVersionConflict) {
			return fmt.Errorf("remove checkpoint %s of %s: %w", c.ID, sb.ID, err)
		}
	}
	return nil
}

// checkpointView is the API's picture of a checkpoint.
func checkpointView(sn store.Snapshot, m snapshotMeta) api.Checkpoint {
	return api.Checkpoint{
		ID: sn.ID, SandboxID: sn.SandboxID, CreatedAt: sn.Created, Trigger: m.Checkpoint.Trigger, Command: m.Checkpoint.Command,
		StoredBytes: sn.NewBytes, LogicalBytes: sn.LogicalBytes, ReadBytes: m.ReadBytes, PausedMS: m.PausedMS,
	}
}

// policyOf returns the checkpoint policy in force for sp (none: the zero
// value, which takes no checkpoints).
func policyOf(sp spec) api.CheckpointPolicy {
	if sp.Checkpoints == nil {
		return api.CheckpointPolicy{}
	}
	return *sp.Checkpoints
}

// createPolicy returns what a new sandbox's spec records as its policy:
// the one asked for (nil: the server's default), checked and with its
// defaults filled in; nil for one that takes no checkpoints.
func (s *Server) createPolicy(asked *api.CheckpointPolicy) (*api.CheckpointPolicy, error) {
	if asked == nil {
		return s.cfg.DefaultCheckpoints, nil
	}
	pol, err := checkpoint.FromAPI("checkpoints", *asked)
	if err != nil || pol.Off() {
		return nil, err
	}
	p := pol.API()
	return &p, nil
}

func (s *Server) handleListCheckpoints(w http.ResponseWriter, r *http.Request) {
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	sp, err := specOf(sb)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	cps, err := s.checkpointsOf(r.Context(), sb.TeamID, sb.ID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.CheckpointList{Checkpoints: make([]api.Checkpoint, 0, len(cps)), Policy: policyOf(sp)}
	for _, c := range cps {
		m, _ := metaOf(c) // checkpointsOf decoded it
		out.Checkpoints = append(out.Checkpoints, checkpointView(c, m))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) handleCreateCheckpoint(w http.ResponseWriter, r *http.Request) {
	sb, wk, err := s.running(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	sn, err := s.checkpoint(context.WithoutCancel(r.Context()), sb, wk, checkpointMeta{Trigger: api.CheckpointManual})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	noteCreated(r.Context(), sn.ID)
	m, _ := metaOf(sn) // just encoded
	httpapi.WriteJSON(w, http.StatusCreated, checkpointView(sn, m))
}

func (s *Server) handleSetCheckpointPolicy(w http.ResponseWriter, r *http.Request) {
	var req api.CheckpointPolicy
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	pol, err := checkpoint.FromAPI("policy", req)
	if err != nil {
		httpapi.WriteError(w, err)
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
	var set *api.CheckpointPolicy
	if !pol.Off() {
		p := pol.API()
		set = &p
	}
	sb, err = s.updateSpec(r.Context(), sb, func(sp *spec) { sp.Checkpoints = set })
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.writeView(w, http.StatusOK, sb)
}

// readyCheckpoint returns the team's checkpoint id if sandboxes may start
// from it; errors name field.
func (s *Server) readyCheckpoint(ctx context.Context, team, id, field string) (store.Snapshot, error) {
	if !store.ValidSnapshotID(id) {
		return store.Snapshot{}, httpapi.Invalid(field, "%.64q is not a checkpoint id (snp_...; see GET /v1/sandboxes/{id}/checkpoints)", id)
	}
	sn, err := s.ready(ctx, team, id)
	if err != nil {
		return sn, &httpapi.FieldError{Field: field, Err: err}
	}
	if m, err := metaOf(sn); err != nil || m.Checkpoint == nil {
		if err == nil {
			err = fmt.Errorf("snapshot %s is not a checkpoint (give it as a snapshot): %w", id, errkind.InvalidArgument)
		}
		return sn, &httpapi.FieldError{Field: field, Err: err}
	}
	return sn, nil
}
