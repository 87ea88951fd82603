package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/worker"
)

// snapshotMeta is what the store keeps as a snapshot's Meta.
type snapshotMeta struct {
	Spec     worker.Spec `json:"spec"`
	PausedMS int64       `json:"paused_ms"`
	// Chunked says the snapshot is in the chunk store the workers share,
	// so any of them can restore it, not only the one that took it.
	Chunked bool `json:"chunked,omitempty"`
	// ReadBytes is what storing it in the chunk store read.
	ReadBytes int64 `json:"read_bytes,omitempty"`
	// VMM is the VMM that took it, which alone restores it (see
	// compat.go); zero in snapshots from before it was recorded, which
	// start anywhere.
	VMM vmmID `json:"vmm,omitzero"`
	// Checkpoint is set on a checkpoint (checkpoints.go).
	Checkpoint *checkpointMeta `json:"checkpoint,omitempty"`
}

// checkpointTrigger is the trigger of a checkpoint, "" for a snapshot.
func (m snapshotMeta) checkpointTrigger() string {
	if m.Checkpoint == nil {
		return ""
	}
	return m.Checkpoint.Trigger
}

// snapshotView is the API's picture of a snapshot. One whose metadata
// does not decode is shown without what only the metadata says (its
// pause and read figures), and the error is returned for the caller to
// report.
func (s *Server) snapshotView(sn store.Snapshot) (api.Snapshot, error) {
	m, err := metaOf(sn)
	return api.Snapshot{
		ID: sn.ID, Name: sn.Name, Team: sn.TeamID, SandboxID: sn.SandboxID, State: sn.State.String(),
		Worker: sn.WorkerID, CreatedAt: sn.Created, LogicalBytes: sn.LogicalBytes, NewBytes: sn.NewBytes,
		PausedMS: m.PausedMS, ReadBytes: m.ReadBytes, VMM: m.VMM.Kind, VMMVersion: m.VMM.Version,
		Checkpoint: m.checkpointTrigger(),
	}, err
}

// running returns the caller's sandbox named in the path if its VM runs
// (running or paused), with its worker.
func (s *Server) running(r *http.Request) (store.Sandbox, Worker, error) {
	sb, err := s.load(r)
	if err != nil {
		return sb, nil, err
	}
	if sb.State != sandbox.Running && sb.State != sandbox.Paused {
		return sb, nil, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errkind.FailedPrecondition)
	}
	wk, err := s.worker(sb.WorkerID)
	return sb, wk, err
}

func (s *Server) handleCreateSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSnapshot
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if req.Name != "" && (!store.ValidID(req.Name) || reservedSnapshotName(req.Name)) {
		httpapi.WriteError(w, httpapi.Invalid("name", "%.64q: 1-128 characters of [A-Za-z0-9_.-], not starting with snp_, build. or template.", req.Name))
		return
	}
	sb, wk, err := s.running(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	sn, err := s.snapshot(ctx, sb, wk, req.Name)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.event(ctx, sandbox.EventSnapshotted, sb, map[string]string{"snapshot_id": sn.ID})
	noteCreated(r.Context(), sn.ID)
	v, _ := s.snapshotView(sn) // its metadata was just encoded
	httpapi.WriteJSON(w, http.StatusCreated, v)
}

// reservedSnapshotName reports whether name is one only the server gives:
// IDs, and template builds' snapshots.
func reservedSnapshotName(name string) bool {
	return strings.HasPrefix(name, "snp_") || strings.HasPrefix(name, "build.") || strings.HasPrefix(name, "template.")
}

// snapshot records a snapshot of sb, has its worker take it, and records
// it ready.
func (s *Server) snapshot(ctx context.Context, sb store.Sandbox, wk Worker, name string) (_ store.Snapshot, err error) {
	defer s.metrics.observeOp(opSnapshot, time.Now(), &err)
	// Claimed before it is recorded: Reconcile leaves a creating snapshot
	// alone while this process works on it.
	id := store.NewSnapshotID()
	ctx, release, err := s.claim(ctx, id)
	if err != nil {
		return store.Snapshot{}, err
	}
	defer release()
	return s.takeSnapshot(ctx, sb, wk, snapshotOpts{id: id, name: name})
}

// snapshotOpts are takeSnapshot's: the snapshot's id and name, and what
// kind it is.
type snapshotOpts struct {
	id, name string
	// local keeps it on the worker's disk, out of the chunk store.
	local bool
	// fork leaves it creating (a fork's snapshot).
	fork bool
	// checkpoint makes it a checkpoint.
	checkpoint *checkpointMeta
}

// takeSnapshot records snapshot o.id of sb, has its worker take it, and
// records it ready, or, for a fork's, leaves it creating: a fork's
// snapshot is never one anyone may start from, and one that a crash
// leaves behind is rolled back by Reconcile like any other creating one.
// A local one stays on the worker's disk, out of the chunk store, and is
// not made durable. The caller claims o.id first and until the snapshot
// is ready or gone.
func (s *Server) takeSnapshot(ctx context.Context, sb store.Sandbox, wk Worker, o snapshotOpts) (store.Snapshot, error) {
	id, name, local, fork := o.id, o.name, o.local, o.fork
	q, err := s.quota(ctx, sb.TeamID)
	if err != nil {
		return store.Snapshot{}, err
	}
	if q.SnapshotMiB > 0 {
		used, err := s.cfg.Store.TeamSnapshotBytes(ctx, sb.TeamID)
		if err != nil {
			return store.Snapshot{}, err
		}
		if used >= q.SnapshotMiB<<20 {
			err := &store.QuotaError{Limit: store.LimitSnapshotBytes, Err: fmt.Errorf("team %s quota: %d of %d MiB of snapshots in use: %w", sb.TeamID, used>>20, q.SnapshotMiB, errkind.ResourceExhausted)}
			s.metrics.quotaRefused(err)
			return store.Snapshot{}, err
		}
	}
	sn, err := s.cfg.Store.CreateSnapshot(ctx, store.Snapshot{
		ID: id, TeamID: sb.TeamID, SandboxID: sb.ID, Name: name,
		State: store.SnapshotCreating, WorkerID: wk.ID(),
	})
	if err != nil {
		return sn, err
	}
	info, err := wk.Snapshot(ctx, sb.ID, worker.SnapshotRequest{SnapshotID: sn.ID, Local: local, Ephemeral: local})
	if err != nil {
		return sn, errors.Join(err, s.writes(ctx).DeleteSnapshot(ctx, sn.TeamID, sn.ID))
	}
	s.crash("api.snapshot.worker-done")
	vmm := s.snapshotVMM(ctx, sb, wk)
	meta, err := json.Marshal(snapshotMeta{Spec: info.Spec, PausedMS: info.PausedMS, Chunked: info.Chunked, ReadBytes: info.ReadBytes, VMM: vmm, Checkpoint: o.checkpoint})
	if err != nil {
		return sn, fmt.Errorf("snapshot %s: encode metadata: %w", sn.ID, err)
	}
	sn.LogicalBytes, sn.NewBytes, sn.Meta = info.LogicalBytes, info.StoredBytes, meta
	if info.Chunked {
		sn.NewBytes, sn.Manifest = info.NewBytes, sn.ID
	}
	if fork {
		sn, err = s.writes(ctx).UpdateSnapshot(ctx, sn) // still creating
	} else {
		sn, err = s.setSnapshotState(ctx, sn, store.SnapshotReady)
	}
	if err != nil {
		return sn, err
	}
	what := "snapshot taken"
	if o.checkpoint != nil {
		what = "checkpoint taken"
	}
	s.log.Info(what, "snapshot_id", sn.ID, "sandbox_id", sb.ID, "paused_ms", info.PausedMS, "new_bytes", sn.NewBytes, "vmm", vmm.Kind, "vmm_version", vmm.Version)
	return sn, nil
}

// findSnapshot returns the team's snapshot by ID or name.
func (s *Server) findSnapshot(ctx context.Context, team, ref string) (store.Snapshot, error) {
	if strings.HasPrefix(ref, "snp_") {
		if !store.ValidSnapshotID(ref) {
			return store.Snapshot{}, fmt.Errorf("snapshot %.64q: %w", ref, store.ErrNotFound)
		}
		return s.cfg.Store.Snapshot(ctx, team, ref)
	}
	if !store.ValidID(ref) {
		return store.Snapshot{}, fmt.Errorf("snapshot %.64q: %w", ref, store.ErrNotFound)
	}
	return s.cfg.Store.SnapshotByName(ctx, team, ref)
}

// ready returns the team's snapshot ref (ID or name) if sandboxes may
// start from it.
func (s *Server) ready(ctx context.Context, team, ref string) (store.Snapshot, error) {
	sn, err := s.findSnapshot(ctx, team, ref)
	if err == nil && sn.State != store.SnapshotReady {
		err = fmt.Errorf("snapshot %s is %s: %w", sn.ID, sn.State, errkind.FailedPrecondition)
	}
	return sn, err
}

func (s *Server) handleGetSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.findSnapshot(r.Context(), callerOf(r).team, r.PathValue("sid"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	v, err := s.snapshotView(sn)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, v)
}

func (s *Server) handleListSnapshots(w http.ResponseWriter, r *http.Request) {
	sbID := r.URL.Query().Get("sandbox")
	if sbID != "" && !store.ValidSandboxID(sbID) {
		httpapi.WriteError(w, httpapi.Invalid("sandbox", "%.64q is not a sandbox id", sbID))
		return
	}
	all, err := s.cfg.Store.ListSnapshots(r.Context(), callerOf(r).team, sbID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.SnapshotList{Snapshots: make([]api.Snapshot, 0, len(all))}
	for _, sn := range all {
		v, err := s.snapshotView(sn)
		if v.Checkpoint != "" {
			continue // listed with its sandbox's checkpoints
		}
		if err != nil { // listed all the same, without its metadata's figures
			s.log.Error("list snapshots: record does not decode", "snapshot_id", sn.ID, "err", err)
		}
		out.Snapshots = append(out.Snapshots, v)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.findSnapshot(r.Context(), callerOf(r).team, r.PathValue("sid"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if inUse, err := s.cfg.Store.SnapshotInUse(r.Context(), sn.TeamID, sn.ID); err != nil || inUse {
		if err == nil {
			err = fmt.Errorf("snapshot %s belongs to a template or the build cache; delete the template (space template rm) instead: %w", sn.ID, errkind.Conflict)
		}
		httpapi.WriteError(w, err)
		return
	}
	if err := s.deleteSnapshot(context.WithoutCancel(r.Context()), sn); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteSnapshot marks the snapshot deleting, removes the worker's copy and
// then the record. Sandboxes started from it keep running: they own their
// memory and disk.
func (s *Server) deleteSnapshot(ctx context.Context, sn store.Snapshot) error {
	if sn.State != store.SnapshotDeleting {
		var err error
		if sn, err = s.setSnapshotState(ctx, sn, store.SnapshotDeleting); err != nil {
			return err
		}
	}
	// Every worker may hold a copy (a chunked snapshot is cached where
	// it was restored); the one that took it must answer, unless the
	// snapshot is chunked and another worker removed it from the chunk
	// store (the one that took it may be lost for good: its sandbox was
	// recovered elsewhere).
	m, _ := metaOf(sn)
	var ownerDown error
	removed := false
	for _, wk := range s.workerList() {
		err := wk.DeleteSnapshot(ctx, sn.ID)
		switch {
		case err == nil || errors.Is(err, errkind.NotFound):
			removed = removed || wk.ID() != sn.WorkerID
		case !errors.Is(err, errkind.Unavailable):
			return err
		case wk.ID() == sn.WorkerID:
			ownerDown = err
		}
	}
	if ownerDown != nil && !(m.Chunked && removed) {
		return ownerDown
	}
	if err := s.writes(ctx).DeleteSnapshot(ctx, sn.TeamID, sn.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return nil
}

// setSnapshotState records sn in state to (checked against the one
// table), with compare-and-set on its version.
func (s *Server) setSnapshotState(ctx context.Context, sn store.Snapshot, to store.SnapshotState) (store.Snapshot, error) {
	if err := store.CheckSnapshot(sn.State, to); err != nil {
		return sn, fmt.Errorf("snapshot %s: %w", sn.ID, err)
	}
	sn.State = to
	return s.writes(ctx).UpdateSnapshot(ctx, sn)
}

func (s *Server) handleRestore(w http.ResponseWriter, r *http.Request) {
	var req api.RestoreSandbox
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if (req.Snapshot == "") == (req.Checkpoint == "") {
		httpapi.WriteError(w, httpapi.Invalid("snapshot", "give a snapshot id or name, or a checkpoint id (checkpoint), not both"))
		return
	}
	sb, wk, err := s.running(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	var sn store.Snapshot
	if req.Checkpoint != "" {
		sn, err = s.readyCheckpoint(ctx, sb.TeamID, req.Checkpoint, "checkpoint")
	} else if sn, err = s.ready(ctx, sb.TeamID, req.Snapshot); err != nil {
		err = &httpapi.FieldError{Field: "snapshot", Err: err}
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	m, err := metaOf(sn)
	if err != nil {
		httpapi.WriteError(w, fmt.Errorf("restore: %w", err))
		return
	}
	if sn.WorkerID != sb.WorkerID && !m.Chunked {
		httpapi.WriteError(w, fmt.Errorf("snapshot %s is kept on worker %s, sandbox %s runs on %s: %w",
			sn.ID, sn.WorkerID, sb.ID, sb.WorkerID, errkind.FailedPrecondition))
		return
	}
	// The sandbox's worker restores it in place: its VMM must be the
	// snapshot's.
	if c, ok := s.capsOf(ctx, wk); ok {
		if match, _ := m.VMM.match(c); !match {
			httpapi.WriteError(w, fmt.Errorf("snapshot %s was taken by %s; sandbox %s runs on worker %s, which runs %s: %w",
				sn.ID, m.VMM, sb.ID, wk.ID(), capsString(c), errkind.FailedPrecondition))
			return
		}
	}
	ctx, release, err := s.claim(ctx, sb.ID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer release()
	if sb, err = s.transition(ctx, sb, sandbox.Creating, nil); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	inf, werr := wk.Restore(ctx, sb.ID, sn.ID)
	// Record what the worker says now, whatever happened.
	to := sandbox.Running
	if werr != nil {
		if cur, err := wk.Sandbox(ctx, sb.ID); err != nil || cur.State != sandbox.Running {
			to = sandbox.Failed
		}
	}
	sb, err = s.transition(ctx, sb, to, func(rec *store.Sandbox) {
		if werr == nil {
			setVM(rec, inf.VM)
		}
	})
	if err = errors.Join(werr, err); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.event(ctx, sandbox.EventRestored, sb, map[string]string{"snapshot_id": sn.ID})
	s.writeView(w, http.StatusOK, sb)
}

// maxForks bounds one fork call.
const maxForks = 16

func (s *Server) handleFork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkSandbox
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if req.Count < 1 || req.Count > maxForks {
		httpapi.WriteError(w, httpapi.Invalid("count", "%d is outside 1..%d", req.Count, maxForks))
		return
	}
	sb, wk, err := s.running(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	t0 := s.now()
	// Children start where the parent runs when it has room for all of
	// them: the snapshot is then copied on that disk (a reflink where the
	// file system can), never read into the chunk store. Otherwise they
	// go wherever there is room, through the chunk store.
	sp, err := specOf(sb)
	if err != nil {
		httpapi.WriteError(w, fmt.Errorf("fork: %w", err))
		return
	}
	local := hasRoom(ctx, wk, sp, req.Count, s.snapshotVMM(ctx, sb, wk))
	id := store.NewSnapshotID()
	ctx, release, err := s.claim(ctx, id)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer release() // until the snapshot is gone (deferred below)
	sn, err := s.takeSnapshot(ctx, sb, wk, snapshotOpts{id: id, local: local, fork: true})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	// The children own copies of everything: the snapshot goes when they
	// are made (or removed).
	defer func() {
		if err := s.deleteSnapshot(ctx, sn); err != nil {
			s.log.Warn("remove fork snapshot", "snapshot_id", sn.ID, "err", err)
		}
	}()
	var children []store.Sandbox
	for i := range req.Count {
		// The last child of a local fork takes the snapshot's files
		// rather than copies of them.
		child, err := s.createFrom(ctx, sb.TeamID, sn, sb.Labels, sp.Checkpoints, local && i == req.Count-1)
		if err != nil {
			httpapi.WriteError(w, s.unfork(ctx, children, i+1, req.Count, err))
			return
		}
		children = append(children, child)
		s.crash("api.fork.child-created")
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(children))}
	for _, child := range children {
		v, err := s.view(child)
		if err != nil {
			httpapi.WriteError(w, s.unfork(ctx, children, 0, req.Count, err))
			return
		}
		out.Sandboxes = append(out.Sandboxes, v)
	}
	// Deleting marks the fork complete: from here on Reconcile removes
	// only the snapshot, never the children it answers with.
	done, err := s.setSnapshotState(ctx, sn, store.SnapshotDeleting)
	if err != nil {
		httpapi.WriteError(w, s.unfork(ctx, children, 0, req.Count, err))
		return
	}
	sn = done
	for _, child := range children {
		s.event(ctx, sandbox.EventForked, sb, map[string]string{"child_id": child.ID})
	}
	s.log.Info("sandbox forked", "sandbox_id", sb.ID, "children", req.Count, "local", local,
		"snapshot_ms", sn.Updated.Sub(t0).Milliseconds(), "total_ms", s.now().Sub(t0).Milliseconds())
	httpapi.WriteJSON(w, http.StatusCreated, out)
	// The children run: answer before the snapshot goes (deferred above).
	http.NewResponseController(w).Flush()
}

// unfork removes the children a fork of n made before child k failed
// with cause (k 0: the fork failed after making them all), through the
// normal delete path, and returns cause saying so; if a removal fails
// too, the error names the children that remain.
func (s *Server) unfork(ctx context.Context, children []store.Sandbox, k, n int, cause error) error {
	what, made := fmt.Sprintf("fork %d of %d", k, n), "made before it"
	if k == 0 {
		what, made = fmt.Sprintf("fork of %d", n), "it made"
	}
	if len(children) == 0 {
		return fmt.Errorf("%s: %w", what, cause)
	}
	var (
		errs   []error
		remain []string
	)
	for _, child := range children {
		if err := s.delete(ctx, child); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", child.ID, err))
			remain = append(remain, child.ID)
		}
	}
	if len(remain) == 0 {
		return fmt.Errorf("%s (the %d sandboxes %s were removed): %w", what, len(children), made, cause)
	}
	return fmt.Errorf("%s (%d of the %d sandboxes %s remain: %s; %v): %w",
		what, len(remain), len(children), made, strings.Join(remain, ", "), errors.Join(errs...), cause)
}

// createFrom creates a sandbox of team from snapshot sn with the
// snapshot's resources and checkpoint policy ckpts, as a child of the fork that took it; take spends the snapshot on it (placement.take;
// the worker ignores it for a chunked snapshot, whose copy there is a
// cache).
func (s *Server) createFrom(ctx context.Context, team string, sn store.Snapshot, labels map[string]string, ckpts *api.CheckpointPolicy, take bool) (store.Sandbox, error) {
	m, err := metaOf(sn)
	if err != nil {
		return store.Sandbox{}, err
	}
	sp := spec{Spec: m.Spec, TimeoutSeconds: int64(s.cfg.Limits.DefaultTTL.Seconds()), OnTimeout: s.cfg.DefaultOnTimeout, Fork: sn.ID, Checkpoints: ckpts}
	pl, err := s.snapshotPlacement(sn)
	if err != nil {
		return store.Sandbox{}, err
	}
	pl.take = take
	return s.create(ctx, team, sp, labels, pl)
}

// snapshotPlacement says where a sandbox from sn may start: on the worker
// that took it, or, for a chunked snapshot, wherever there is room (the
// worker fetches it from the chunk store); either way on a worker whose
// VMM is the one that took it.
func (s *Server) snapshotPlacement(sn store.Snapshot) (placement, error) {
	m, err := metaOf(sn)
	if err != nil {
		return placement{}, err
	}
	if m.Chunked {
		return placement{snapshot: sn.ID, vmm: m.VMM}, nil
	}
	wk, err := s.worker(sn.WorkerID)
	if err != nil {
		return placement{}, err
	}
	return placement{worker: wk, snapshot: sn.ID, vmm: m.VMM}, nil
}

// hasRoom reports whether wk can take n more sandboxes of sp now, from a
// snapshot taken by vmm (which a worker upgraded since its VM started
// may not restore).
func hasRoom(ctx context.Context, wk Worker, sp spec, n int, vmm vmmID) bool {
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := wk.Status(sctx)
	match, _ := vmm.match(st.Capabilities)
	return err == nil && match && st.VCPUs-st.UsedVCPUs >= n*sp.VCPUs && st.MemoryMiB-st.UsedMemoryMiB >= int64(n)*sp.MemoryMiB &&
		(st.DiskMiB == 0 || st.FreeDiskMiB >= int64(n)*sp.DiskMiB)
}
