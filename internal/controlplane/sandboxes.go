package controlplane

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/worker"
)

// createBody mirrors api.CreateSandbox with pointers, so an explicit 0
// (invalid) differs from an omitted field (the default).
type createBody struct {
	Template       *string               `json:"template"`
	VCPUs          *int                  `json:"vcpus"`
	MemoryMiB      *int64                `json:"memory_mib"`
	DiskMiB        *int64                `json:"disk_mib"`
	TimeoutSeconds *int64                `json:"timeout_seconds"`
	Env            map[string]string     `json:"env"`
	Labels         map[string]string     `json:"labels"`
	FromSnapshot   *string               `json:"from_snapshot"`
	Network        *api.Network          `json:"network"`
	Secrets        []string              `json:"secrets"`
	ColdBoot       bool                  `json:"cold_boot"`
	OnTimeout      *string               `json:"on_timeout"`
	Checkpoints    *api.CheckpointPolicy `json:"checkpoints"`
	FromCheckpoint *string               `json:"from_checkpoint"`
}

// spec is what the store keeps as a sandbox's Spec.
type spec struct {
	worker.Spec
	TimeoutSeconds int64 `json:"timeout_seconds"`
	// OnTimeout is what its timeout does: onTimeoutDelete ("" too) or
	// onTimeoutSuspend.
	OnTimeout string `json:"on_timeout,omitempty"`
	// TemplateRef is the built template ("name:version") the sandbox
	// started from, or "" (Spec.Template is then a built-in template).
	TemplateRef string `json:"template_ref,omitempty"`
	// Fork is the snapshot of the fork that made the sandbox, or "". While
	// that snapshot is still creating the fork has not answered, and
	// Reconcile removes the sandbox with the snapshot.
	Fork string `json:"fork,omitempty"`
	// Checkpoints is the sandbox's checkpoint policy, as checkpoint.FromAPI
	// fills it in; nil = none.
	Checkpoints *api.CheckpointPolicy `json:"checkpoints,omitempty"`
}

// What a sandbox's timeout does (api.CreateSandbox.OnTimeout).
const (
	onTimeoutDelete  = "delete"  // the timeout is a lifetime: the sandbox is deleted
	onTimeoutSuspend = "suspend" // the timeout is an idle time: the sandbox is suspended
)

// updateSpec stores sb with its spec changed by edit, again on the
// latest version if another update came first.
func (s *Server) updateSpec(ctx context.Context, sb store.Sandbox, edit func(*spec)) (store.Sandbox, error) {
	return s.updateRecord(ctx, sb, func(_ *store.Sandbox, sp *spec) { edit(sp) })
}

// updateRecord is updateSpec for edits of the record's own fields too.
func (s *Server) updateRecord(ctx context.Context, sb store.Sandbox, edit func(*store.Sandbox, *spec)) (store.Sandbox, error) {
	for {
		sp, err := specOf(sb)
		if err != nil {
			return sb, err
		}
		edit(&sb, &sp)
		sb.Spec, _ = json.Marshal(sp)
		updated, err := s.writes(ctx).UpdateSandbox(ctx, sb)
		if errors.Is(err, store.ErrVersionConflict) {
			if sb, err = s.cfg.Store.Sandbox(ctx, sb.TeamID, sb.ID); err == nil {
				continue
			}
		}
		return updated, err
	}
}

// stored is what the store keeps as a sandbox's Handle: how its VM runs.
type stored struct {
	VM *api.VMInfo `json:"vm,omitempty"`
	// Suspended is the snapshot a suspended sandbox resumes from, set
	// from the moment a suspend has taken it until a resume completes.
	Suspended string `json:"suspended,omitempty"`
	// Recovery is the plan of a recovering sandbox (recovery.go).
	Recovery *recovery `json:"recovery,omitempty"`
	// Recovered says how a recovered sandbox came back.
	Recovered *api.Recovery `json:"recovered,omitempty"`
	// Reason says why the sandbox failed, when the control plane
	// decided it.
	Reason string `json:"reason,omitempty"`
	// LostWorker is the worker that was lost with the sandbox, while the
	// record still names it: nothing is asked of it (it removes the
	// sandbox itself if it comes back, see recovery.go).
	LostWorker string `json:"lost_worker,omitempty"`
}

// lostWith reports whether sb's worker is one it was lost with.
func lostWith(sb store.Sandbox) bool {
	st, err := handleOf(sb)
	if err != nil {
		return false
	}
	if st.Recovery != nil && st.Recovery.LostWorker == sb.WorkerID {
		return true
	}
	return st.LostWorker != "" && st.LostWorker == sb.WorkerID
}

func setSuspended(sb *store.Sandbox, snapID string) {
	b, _ := json.Marshal(stored{Suspended: snapID})
	sb.Handle = b
}

const (
	maxEnv      = 256
	maxEnvBytes = 64 << 10
)

// validate applies defaults and bounds; errors name the field.
func (s *Server) validate(b createBody) (spec, error) {
	l := s.cfg.Limits
	sp := spec{Spec: worker.Spec{Template: s.cfg.Templates[0], VCPUs: l.DefaultVCPUs, MemoryMiB: l.DefaultMemoryMiB, DiskMiB: l.DefaultDiskMiB}}
	sp.TimeoutSeconds, sp.OnTimeout = int64(l.DefaultTTL/time.Second), s.cfg.DefaultOnTimeout
	if b.Template != nil {
		if !slices.Contains(s.cfg.Templates, *b.Template) {
			return sp, httpapi.Invalid("template", "unknown template %.64q (have %s)", *b.Template, strings.Join(s.cfg.Templates, ", "))
		}
		sp.Template = *b.Template
	}
	if b.VCPUs != nil {
		if *b.VCPUs < 1 || *b.VCPUs > l.MaxVCPUs {
			return sp, httpapi.Invalid("vcpus", "%d is outside 1..%d", *b.VCPUs, l.MaxVCPUs)
		}
		sp.VCPUs = *b.VCPUs
	}
	if b.MemoryMiB != nil {
		if *b.MemoryMiB < l.MinMemoryMiB || *b.MemoryMiB > l.MaxMemoryMiB {
			return sp, httpapi.Invalid("memory_mib", "%d is outside %d..%d", *b.MemoryMiB, l.MinMemoryMiB, l.MaxMemoryMiB)
		}
		sp.MemoryMiB = *b.MemoryMiB
	}
	if b.DiskMiB != nil {
		if *b.DiskMiB < l.MinDiskMiB || *b.DiskMiB > l.MaxDiskMiB {
			return sp, httpapi.Invalid("disk_mib", "%d is outside %d..%d", *b.DiskMiB, l.MinDiskMiB, l.MaxDiskMiB)
		}
		sp.DiskMiB = *b.DiskMiB
	}
	if b.TimeoutSeconds != nil {
		max := int64(l.MaxTTL / time.Second)
		if *b.TimeoutSeconds < 1 || *b.TimeoutSeconds > max {
			return sp, httpapi.Invalid("timeout_seconds", "%d is outside 1..%d", *b.TimeoutSeconds, max)
		}
		sp.TimeoutSeconds = *b.TimeoutSeconds
	}
	if len(b.Env) > maxEnv {
		return sp, httpapi.Invalid("env", "more than %d variables", maxEnv)
	}
	size := 0
	for k, v := range b.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return sp, httpapi.Invalid("env", "variable %.64q: names are non-empty without '=' and values have no NUL", k)
		}
		size += len(k) + len(v)
	}
	if size > maxEnvBytes {
		return sp, httpapi.Invalid("env", "larger than %d bytes", maxEnvBytes)
	}
	sp.Env = b.Env
	sp.ColdBoot = b.ColdBoot
	if b.Network != nil {
		n := workerNetwork(*b.Network)
		if _, err := n.Policy(); err != nil {
			return sp, &httpapi.FieldError{Field: "network", Err: err}
		}
		sp.Network = n
	} else {
		sp.Network = &worker.Network{} // a NIC whose gateway allows nothing
	}
	if b.OnTimeout != nil {
		if *b.OnTimeout != onTimeoutDelete && *b.OnTimeout != onTimeoutSuspend {
			return sp, httpapi.Invalid("on_timeout", "%.64q is neither %s nor %s", *b.OnTimeout, onTimeoutDelete, onTimeoutSuspend)
		}
		sp.OnTimeout = ""
		if *b.OnTimeout == onTimeoutSuspend {
			sp.OnTimeout = onTimeoutSuspend
		}
	}
	var err error
	if sp.Checkpoints, err = s.createPolicy(b.Checkpoints); err != nil {
		return sp, err
	}
	return sp, nil
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	var b createBody
	if err := httpapi.DecodeJSON(r, &b); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	// A built template is the team's, and its sandboxes restore its
	// snapshot; validate knows the built-in ones.
	built := b.Template != nil && !slices.Contains(s.cfg.Templates, *b.Template)
	vb := b
	if built {
		vb.Template = nil
	}
	sp, err := s.validate(vb)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	// A client that goes away mid-create must not leave it half done: the
	// create runs to its end either way.
	ctx := context.WithoutCancel(r.Context())
	from := "from_snapshot"
	if b.FromCheckpoint != nil {
		if b.FromSnapshot != nil {
			httpapi.WriteError(w, httpapi.Invalid("from_checkpoint", "give from_checkpoint or from_snapshot, not both"))
			return
		}
		if _, err := s.readyCheckpoint(ctx, c.team, *b.FromCheckpoint, "from_checkpoint"); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		b.FromSnapshot, from = b.FromCheckpoint, "from_checkpoint"
	}
	var pl placement
	if built && b.FromSnapshot == nil {
		tsp, tpl, err := s.fromTemplate(ctx, c.team, *b.Template, b)
		if err != nil {
			httpapi.WriteError(w, err)
			return
		}
		tsp.TimeoutSeconds, tsp.OnTimeout, tsp.Checkpoints = sp.TimeoutSeconds, sp.OnTimeout, sp.Checkpoints
		sp, pl = tsp, tpl
	}
	if b.FromSnapshot != nil {
		if b.Template != nil || b.VCPUs != nil || b.MemoryMiB != nil || b.DiskMiB != nil || b.Env != nil || b.ColdBoot || b.Network != nil || b.Secrets != nil {
			httpapi.WriteError(w, httpapi.Invalid(from, "a sandbox from a snapshot or checkpoint has its template, resources and environment"))
			return
		}
		sn, err := s.ready(ctx, c.team, *b.FromSnapshot)
		if err != nil {
			httpapi.WriteError(w, &httpapi.FieldError{Field: from, Err: err})
			return
		}
		m, err := metaOf(sn)
		if err != nil {
			httpapi.WriteError(w, fmt.Errorf("create from snapshot: %w", err))
			return
		}
		sp.Spec = m.Spec
		if pl, err = s.snapshotPlacement(sn); err != nil {
			httpapi.WriteError(w, err)
			return
		}
	}
	if len(b.Secrets) > 0 {
		if sp.Secrets, err = s.grants(ctx, c.team, b.Secrets); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		var n worker.Network // none given: one that allows only the grants' hosts
		if sp.Network != nil {
			n = *sp.Network
		}
		n = allowGrantHosts(n, sp.Secrets)
		if _, err := n.Policy(); err != nil {
			httpapi.WriteError(w, &httpapi.FieldError{Field: "secrets", Err: err})
			return
		}
		sp.Network = &n
	}
	sb, err := s.create(ctx, c.team, sp, b.Labels, pl)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	noteCreated(ctx, sb.ID)
	s.writeView(w, http.StatusCreated, sb)
}

// placement says where a sandbox starts from: the zero value boots it on
// the worker with the most room; otherwise it restores snapshot on
// worker, or, with no worker, on the worker with the most room among
// those whose VMM matches vmm, the one that took the snapshot.
type placement struct {
	worker   Worker
	snapshot string
	vmm      vmmID // the zero value: any worker's
	// take spends the snapshot on this sandbox (worker.CreateRequest.TakeSnapshot).
	take bool
}

// create records, places and boots (or restores) a sandbox.
func (s *Server) create(ctx context.Context, team string, sp spec, labels map[string]string, pl placement) (_ store.Sandbox, err error) {
	defer s.metrics.observeOp(opCreate, time.Now(), &err)
	// The store checks the quota and records the sandbox in one
	// transaction, serialized per team across every replica.
	q, err := s.quota(ctx, team)
	if err != nil {
		return store.Sandbox{}, err
	}
	wk := pl.worker
	if wk == nil {
		if wk, err = s.place(ctx, s.healthyWorkers(), sp.Spec, pl); err != nil {
			return store.Sandbox{}, err
		}
	} else if err := s.checkWorkerVMM(ctx, wk, pl.snapshot, pl.vmm); err != nil {
		return store.Sandbox{}, err
	}
	specJSON, err := json.Marshal(sp)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("encode spec: %w", err)
	}
	id := store.NewSandboxID()
	ctx, release, err := s.claim(ctx, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	rec, err := s.writes(ctx).CreateSandboxWithinQuota(ctx, store.Sandbox{
		ID: id, TeamID: team, Template: cmp.Or(sp.TemplateRef, sp.Template), State: sandbox.Creating,
		WorkerID: wk.ID(), Spec: specJSON, Labels: labels, VCPUs: sp.VCPUs, MemoryMiB: sp.MemoryMiB,
		Expires: s.now().Add(time.Duration(sp.TimeoutSeconds) * time.Second),
	}, storeQuota(q))
	if err != nil {
		s.metrics.quotaRefused(err)
		if errors.Is(err, store.ErrInvalid) {
			return store.Sandbox{}, &httpapi.FieldError{Field: "labels", Err: err}
		}
		return store.Sandbox{}, err
	}
	s.expiries.note(rec.Expires)
	s.crash("api.create.recorded")
	values, err := s.secretValues(ctx, team, sp.Secrets)
	if err != nil {
		return store.Sandbox{}, errors.Join(err, s.rollback(store.WithReason(ctx, "create failed: "+err.Error()), wk, rec))
	}
	inf, err := wk.Create(ctx, worker.CreateRequest{ID: rec.ID, Team: team, Spec: sp.Spec, FromSnapshot: pl.snapshot, TakeSnapshot: pl.take, SecretValues: values})
	if err != nil {
		s.log.Warn("create failed", "sandbox_id", rec.ID, "worker_id", wk.ID(), "err", err)
		return store.Sandbox{}, errors.Join(err, s.rollback(store.WithReason(ctx, "create failed: "+err.Error()), wk, rec))
	}
	s.crash("api.create.worker-done")
	running, err := s.transition(ctx, rec, sandbox.Running, func(sb *store.Sandbox) { setVM(sb, inf.VM) })
	if errors.Is(err, store.ErrLeaseLost) {
		// This replica stalled past its claim: the record is a
		// reconcile's to settle now (the VM runs; it may complete it),
		// and nothing here may undo what that decides.
		return store.Sandbox{}, fmt.Errorf("create %s: interrupted; the control plane settles it: %w", rec.ID, err)
	}
	if err != nil {
		return store.Sandbox{}, errors.Join(err, s.rollback(store.WithReason(ctx, "create failed: "+err.Error()), wk, rec))
	}
	s.log.Info("sandbox created", "sandbox_id", running.ID, "team", team, "worker_id", wk.ID())
	return running, nil
}

func setVM(sb *store.Sandbox, vm *api.VMInfo) {
	b, _ := json.Marshal(stored{VM: vm})
	sb.Handle = b
}

// rollback undoes a create the worker did not (or may not) complete.
func (s *Server) rollback(ctx context.Context, wk Worker, rec store.Sandbox) error {
	var errs []error
	if err := wk.Delete(ctx, rec.ID); err != nil && !errors.Is(err, errkind.NotFound) {
		errs = append(errs, fmt.Errorf("roll back on worker: %w", err))
	}
	if err := s.writes(ctx).DeleteSandbox(ctx, rec.TeamID, rec.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		errs = append(errs, fmt.Errorf("roll back record: %w", err))
	}
	return errors.Join(errs...)
}

// transition moves a record to state (checked against the one table),
// applying edit, with compare-and-set on its version.
func (s *Server) transition(ctx context.Context, rec store.Sandbox, to sandbox.State, edit func(*store.Sandbox)) (store.Sandbox, error) {
	if err := sandbox.Check(rec.State, to); err != nil {
		return rec, fmt.Errorf("sandbox %s: %w", rec.ID, err)
	}
	rec.State = to
	if edit != nil {
		edit(&rec)
	}
	if to == sandbox.Failed && store.ReasonFrom(ctx) == "" {
		// The failure's event says what the record says.
		if st, err := handleOf(rec); err == nil && st.Reason != "" {
			ctx = store.WithReason(ctx, st.Reason)
		}
	}
	return s.writes(ctx).UpdateSandbox(ctx, rec)
}

// quota returns the team's quota: its own if an admin set one, else the
// server's default.
func (s *Server) quota(ctx context.Context, team string) (api.Quota, error) {
	t, err := s.cfg.Store.Team(ctx, team)
	if err != nil {
		return api.Quota{}, err
	}
	if t.Quota == nil {
		return s.cfg.Quota, nil
	}
	var q api.Quota
	if err := json.Unmarshal(t.Quota, &q); err != nil {
		return api.Quota{}, fmt.Errorf("team %s: stored quota: %v: %w", team, err, errkind.Internal)
	}
	return q, nil
}

// live reports whether a sandbox counts against quota.
func live(st sandbox.State) bool {
	return st != sandbox.Deleted && st != sandbox.Failed && st != sandbox.Stopped && st != sandbox.Suspended
}

// storeQuota is q as the store checks it.
func storeQuota(q api.Quota) store.Quota {
	return store.Quota{Sandboxes: q.Sandboxes, VCPUs: q.VCPUs, MemoryMiB: q.MemoryMiB}
}

// quotaUsage is what the quota routes answer for a team.
func (s *Server) quotaUsage(ctx context.Context, team string) (api.QuotaUsage, error) {
	q, err := s.quota(ctx, team)
	if err != nil {
		return api.QuotaUsage{}, err
	}
	// From the store: every replica's sandboxes.
	u, err := s.cfg.Store.TeamUsage(ctx, team)
	return api.QuotaUsage{Limits: q, Used: api.Quota{Sandboxes: u.Sandboxes, VCPUs: u.VCPUs, MemoryMiB: u.MemoryMiB}}, err
}

func (s *Server) handleQuota(w http.ResponseWriter, r *http.Request) {
	team, err := teamParam(callerOf(r), r.URL.Query().Get("team"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	qu, err := s.quotaUsage(r.Context(), team)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, qu)
}

// handleSetQuota sets a team's quota (admin keys only).
func (s *Server) handleSetQuota(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	if !c.admin {
		httpapi.WriteError(w, fmt.Errorf("setting a quota needs an admin key: %w", errkind.PermissionDenied))
		return
	}
	team, err := teamParam(c, r.URL.Query().Get("team"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var q api.Quota
	if err := httpapi.DecodeJSON(r, &q); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"sandboxes", int64(q.Sandboxes)}, {"vcpus", int64(q.VCPUs)}, {"memory_mib", q.MemoryMiB}, {"snapshot_mib", q.SnapshotMiB}} {
		if f.v < 0 {
			httpapi.WriteError(w, httpapi.Invalid(f.name, "negative (0 means unlimited)"))
			return
		}
	}
	b, _ := json.Marshal(q)
	if _, err := s.cfg.Store.SetTeamQuota(r.Context(), team, b); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.log.Info("team quota set", "team", team, "by_key", c.keyID)
	qu, err := s.quotaUsage(r.Context(), team)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, qu)
}

// view is the API's picture of a record; a record whose spec or handle
// does not decode is an Internal error naming it.
func (s *Server) view(sb store.Sandbox) (api.Sandbox, error) {
	sb = loaded(sb)
	sp, err := specOf(sb)
	if err != nil {
		return api.Sandbox{}, err
	}
	st, err := handleOf(sb)
	if err != nil {
		return api.Sandbox{}, err
	}
	v := api.Sandbox{
		ID: sb.ID, Team: sb.TeamID, Template: sb.Template, State: sb.State.String(), Worker: sb.WorkerID,
		VCPUs: sp.VCPUs, MemoryMiB: sp.MemoryMiB, DiskMiB: sp.DiskMiB, Env: sp.Env, Labels: sb.Labels,
		CreatedAt: sb.Created, UpdatedAt: sb.Updated, OnTimeout: cmp.Or(sp.OnTimeout, onTimeoutDelete),
	}
	if sp.Network != nil {
		v.Network = &api.Network{Allow: sp.Network.Allow, Off: sp.Network.Off, ICMP: sp.Network.ICMP,
			MaxConnections: sp.Network.MaxConnections, BytesPerSecond: sp.Network.BytesPerSecond}
	}
	for _, g := range sp.Secrets {
		v.Secrets = append(v.Secrets, g.Name)
	}
	if !sb.Expires.IsZero() {
		e := sb.Expires
		v.ExpiresAt = &e
	}
	v.VM = st.VM
	v.SuspendedSnapshot = st.Suspended
	v.RecoveredFrom, v.Reason = st.Recovered, st.Reason
	if st.Recovery != nil && v.Reason == "" {
		v.Reason = st.Recovery.reason()
	}
	v.Checkpoints = sp.Checkpoints
	v.DataPlane = s.dataPlaneOf(sb)
	return v, nil
}

// writeView answers with the API's picture of sb.
func (s *Server) writeView(w http.ResponseWriter, code int, sb store.Sandbox) {
	v, err := s.view(sb)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, code, v)
}

// load returns the caller's sandbox named in the path, or 404.
func (s *Server) load(r *http.Request) (store.Sandbox, error) {
	id := r.PathValue("id")
	if !store.ValidSandboxID(id) {
		return store.Sandbox{}, fmt.Errorf("sandbox %.64q: %w", id, store.ErrNotFound)
	}
	sb, err := s.cfg.Store.Sandbox(r.Context(), callerOf(r).team, id)
	return loaded(sb), err
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	v, err := s.view(sb)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	v.Agent = s.agentState(r.Context(), sb)
	httpapi.WriteJSON(w, http.StatusOK, v)
}

// agentStateWait bounds the question to a worker behind a sandbox get.
const agentStateWait = 2 * time.Second

// agentState asks the worker of a running sandbox how its agent is
// (api.Sandbox.Agent), or "" if that is not known soon: a worker that
// does not answer its probes is not asked.
func (s *Server) agentState(ctx context.Context, sb store.Sandbox) string {
	if sb.State != sandbox.Running || sb.WorkerID == "" {
		return ""
	}
	wk, err := s.worker(sb.WorkerID)
	if err != nil || !s.answering(wk) {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, agentStateWait)
	defer cancel()
	inf, err := wk.Sandbox(ctx, sb.ID)
	if err != nil {
		return ""
	}
	return inf.Agent
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var f store.Filter
	for _, st := range q["state"] {
		if !sandbox.State(st).Valid() {
			httpapi.WriteError(w, httpapi.Invalid("state", "unknown state %.32q", st))
			return
		}
		f.States = append(f.States, sandbox.State(st))
	}
	want := slices.Clone(f.States)
	if slices.Contains(want, sandbox.Suspended) && !slices.Contains(want, sandbox.Stopped) {
		// Suspended records written before the state was are stopped in
		// the store (see loaded); which are suspended is told below.
		f.States = append(f.States, sandbox.Stopped)
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			httpapi.WriteError(w, httpapi.Invalid("label", "want key=value, got %.64q", l))
			return
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	all, err := s.cfg.Store.ListSandboxes(r.Context(), callerOf(r).team, f)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(all))}
	for _, sb := range all {
		if len(want) > 0 && !slices.Contains(want, loaded(sb).State) {
			continue
		}
		v, err := s.view(sb)
		if err != nil {
			// The others are listed; this one is reported.
			s.log.Error("list sandboxes: record does not decode", "sandbox_id", sb.ID, "err", err)
			v = api.Sandbox{ID: sb.ID, Team: sb.TeamID, Template: sb.Template, State: loaded(sb).State.String(),
				Worker: sb.WorkerID, Labels: sb.Labels, CreatedAt: sb.Created, UpdatedAt: sb.Updated}
		}
		out.Sandboxes = append(out.Sandboxes, v)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if err := s.delete(context.WithoutCancel(r.Context()), sb); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// delete records stopping, has the worker destroy the VM, then removes
// the record.
func (s *Server) delete(ctx context.Context, sb store.Sandbox) (err error) {
	defer s.metrics.observeOp(opDelete, time.Now(), &err)
	ctx, release, err := s.claim(ctx, sb.ID)
	if err != nil {
		return err
	}
	defer release()
	// Whoever held the claim before (a replica settling what a dead one
	// left, say) may have moved the record on.
	if sb, err = s.cfg.Store.Sandbox(ctx, sb.TeamID, sb.ID); err != nil {
		return err
	}
	if sb.State == sandbox.Creating {
		return fmt.Errorf("sandbox %s is still being created: %w", sb.ID, errkind.FailedPrecondition)
	}
	sb = loaded(sb)
	snap, err := suspendedFrom(sb)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if sb.State == sandbox.Stopped || sb.State == sandbox.Suspended {
		if err := sandbox.Check(sb.State, sandbox.Deleted); err != nil {
			return fmt.Errorf("sandbox %s: %w", sb.ID, err)
		}
		// No VM; a suspended one's snapshot goes with it.
		if snap != "" {
			sn, err := s.cfg.Store.Snapshot(ctx, sb.TeamID, snap)
			if err == nil {
				err = s.deleteSnapshot(ctx, sn)
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		if err := s.dropCheckpoints(ctx, sb); err != nil {
			return err
		}
		if err := s.writes(ctx).DeleteSandbox(ctx, sb.TeamID, sb.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		s.log.Info("sandbox deleted", "sandbox_id", sb.ID)
		return nil
	}
	if sb.State != sandbox.Stopping {
		if sb, err = s.transition(ctx, sb, sandbox.Stopping, nil); err != nil {
			return err
		}
	}
	s.crash("api.delete.stopping-saved")
	if sb.WorkerID != "" && !lostWith(sb) {
		wk, err := s.worker(sb.WorkerID)
		if err != nil {
			return err
		}
		if err := s.archiveEgress(ctx, wk, sb); err != nil {
			return err
		}
		if err := wk.Delete(ctx, sb.ID); err != nil && !errors.Is(err, errkind.NotFound) {
			return err
		}
	}
	if err := s.dropCheckpoints(ctx, sb); err != nil {
		return err
	}
	if err := s.writes(ctx).DeleteSandbox(ctx, sb.TeamID, sb.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if snap != "" { // deleted mid-suspend
		s.dropSuspendSnapshot(ctx, sb.TeamID, snap)
	}
	s.log.Info("sandbox deleted", "sandbox_id", sb.ID)
	return nil
}

// forward sends a data-plane request to the sandbox's worker.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if sb.State == sandbox.Recovering {
		w.Header().Set("Retry-After", "2")
		httpapi.WriteError(w, fmt.Errorf("sandbox %s is recovering: its worker was lost, and it is being restored from its latest checkpoint on another: %w", sb.ID, errkind.Unavailable))
		return
	}
	if sb.State != sandbox.Running {
		httpapi.WriteError(w, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errkind.FailedPrecondition))
		return
	}
	wk, err := s.worker(sb.WorkerID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"+sb.ID)
	r2 := r.Clone(r.Context())
	r2.URL.Path = worker.PathPrefix + "/sandboxes/" + sb.ID + rest
	r2.URL.RawPath = ""
	r2.Header.Del("Authorization")
	if r.Method == http.MethodPut {
		r2.Body = http.MaxBytesReader(w, r.Body, maxUpload)
	}
	wk.ServeHTTP(w, r2)
}

// maxUpload bounds one file upload.
const maxUpload = 1 << 30

func (s *Server) handlePause(w http.ResponseWriter, r *http.Request) { s.setRunning(w, r, false) }
func (s *Server) handleResume(w http.ResponseWriter, r *http.Request) {
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if sb.State == sandbox.Suspended {
		s.resumeSuspended(w, r, sb)
		return
	}
	s.setRunning(w, r, true)
}

// setRunning pauses or resumes a sandbox on its worker, then records the
// state the worker reports.
func (s *Server) setRunning(w http.ResponseWriter, r *http.Request, run bool) {
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	to := sandbox.Paused
	if run {
		to = sandbox.Running
	}
	if sb.State != to {
		if err := sandbox.Check(sb.State, to); err != nil {
			httpapi.WriteError(w, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, err))
			return
		}
	}
	ctx, release, err := s.claim(context.WithoutCancel(r.Context()), sb.ID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer release()
	wk, err := s.worker(sb.WorkerID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if run {
		_, err = wk.Resume(ctx, sb.ID)
	} else {
		_, err = wk.Pause(ctx, sb.ID)
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if sb.State != to {
		if sb, err = s.transition(ctx, sb, to, nil); err != nil {
			httpapi.WriteError(w, err)
			return
		}
	}
	s.writeView(w, http.StatusOK, sb)
}

// workerNetwork is the worker's form of an API network policy.
func workerNetwork(n api.Network) *worker.Network {
	return &worker.Network{Allow: n.Allow, Off: n.Off, ICMP: n.ICMP, MaxConnections: n.MaxConnections, BytesPerSecond: n.BytesPerSecond}
}

// handleSetNetwork replaces a running sandbox's egress policy: its worker
// applies it to new connections, then the record keeps it (so forks and
// resumes start with it).
func (s *Server) handleSetNetwork(w http.ResponseWriter, r *http.Request) {
	var n api.Network
	if err := httpapi.DecodeJSON(r, &n); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	wn := *workerNetwork(n)
	if _, err := wn.Policy(); err != nil {
		httpapi.WriteError(w, &httpapi.FieldError{Field: "allow", Err: err})
		return
	}
	sb, wk, err := s.running(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	if _, err := wk.SetNetwork(ctx, sb.ID, wn); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	updated, err := s.updateSpec(ctx, sb, func(sp *spec) { sp.Network = &wn })
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.writeView(w, http.StatusOK, updated)
}

// SandboxByID returns the API's picture of sandbox id whatever its team,
// with a fresh data plane while its VM runs: for the E2B facade, which
// authorizes a caller by a token bound to the sandbox's ID rather than by
// a team's key. A deleted sandbox is errkind.NotFound.
func (s *Server) SandboxByID(ctx context.Context, id string) (api.Sandbox, error) {
	if !store.ValidSandboxID(id) {
		return api.Sandbox{}, fmt.Errorf("sandbox %.64q: %w", id, store.ErrNotFound)
	}
	sb, err := s.cfg.Store.SandboxByID(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	if sb = loaded(sb); sb.State == sandbox.Deleted {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
	}
	return s.view(sb)
}
