package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/metricstest"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/testenv"
	"space/internal/worker"
	"space/internal/workerproto"

	"github.com/prometheus/client_golang/prometheus"
)

// fencingWorker is an in-memory worker that takes leases, reports a
// shared chunk store, and can be cut off (every call fails as a worker
// that does not answer would).
type fencingWorker struct {
	*instantWorker
	id     string
	chunks string
	memory int64

	fmu sync.Mutex
	// +checklocks:fmu
	cut bool
	// +checklocks:fmu
	leases []workerproto.LeaseRequest
	// +checklocks:fmu
	has map[string]bool
	// +checklocks:fmu
	hold chan struct{} // non-nil: Create waits for it to close
}

func newFencingWorker(id string, memory int64) *fencingWorker {
	return &fencingWorker{instantWorker: &instantWorker{}, id: id, chunks: "s3://bucket/space?endpoint=s3.test", memory: memory, has: map[string]bool{}}
}

var errCut = errors.New("connection refused (the test cut the worker off)")

func (w *fencingWorker) ID() string { return w.id }

func (w *fencingWorker) isCut() bool {
	w.fmu.Lock()
	defer w.fmu.Unlock()
	return w.cut
}

func (w *fencingWorker) setCut(cut bool) {
	w.fmu.Lock()
	w.cut = cut
	w.fmu.Unlock()
}

func (w *fencingWorker) Status(context.Context) (worker.Status, error) {
	w.fmu.Lock()
	cut, leased := w.cut, len(w.leases) > 0
	w.fmu.Unlock()
	if cut {
		return worker.Status{}, errCut
	}
	return worker.Status{ID: w.id, Protocol: workerproto.Version, VCPUs: 64, MemoryMiB: w.memory, Leased: leased,
		Capabilities: workerproto.Capabilities{VMM: "fake", Accel: "none", Snapshots: true, ChunkedSnapshots: true, Fencing: true, ChunkStore: w.chunks}}, nil
}

func (w *fencingWorker) Lease(_ context.Context, req workerproto.LeaseRequest) (workerproto.LeaseReply, error) {
	w.fmu.Lock()
	defer w.fmu.Unlock()
	if w.cut {
		return workerproto.LeaseReply{}, errCut
	}
	w.leases = append(w.leases, req)
	var removed []string
	for id := range w.has {
		if !slices.Contains(req.Keep, id) {
			delete(w.has, id)
			removed = append(removed, id)
		}
	}
	return workerproto.LeaseReply{Epoch: req.Epoch, Removed: removed}, nil
}

func (w *fencingWorker) Create(ctx context.Context, req worker.CreateRequest) (worker.Info, error) {
	w.fmu.Lock()
	hold, cut := w.hold, w.cut
	w.fmu.Unlock()
	if cut {
		return worker.Info{}, errCut
	}
	if hold != nil {
		<-hold
	}
	w.fmu.Lock()
	w.has[req.ID] = true
	w.fmu.Unlock()
	return w.instantWorker.Create(ctx, req)
}

func (w *fencingWorker) Sandbox(_ context.Context, id string) (worker.Info, error) {
	w.fmu.Lock()
	defer w.fmu.Unlock()
	if w.cut {
		return worker.Info{}, errCut
	}
	if !w.has[id] {
		return worker.Info{}, errkind.NotFound
	}
	return worker.Info{ID: id, State: sandbox.Running}, nil
}

func (w *fencingWorker) Snapshot(_ context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error) {
	if w.isCut() {
		return worker.SnapshotInfo{}, errCut
	}
	return worker.SnapshotInfo{ID: req.SnapshotID, SandboxID: id, Chunked: true, LogicalBytes: 1 << 20, NewBytes: 1 << 10,
		Spec: worker.Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 4096}}, nil
}

func (w *fencingWorker) leaseLog() []workerproto.LeaseRequest {
	w.fmu.Lock()
	defer w.fmu.Unlock()
	return slices.Clone(w.leases)
}

// TestRecoverLostWorker runs the leader's leasing and recovery with two
// in-memory workers (no VMs: this tests the control plane's decisions;
// internal/server's tests do it with real VMs): worker a is cut off; after
// RecoverAfter its epoch is raised; its sandbox with a checkpoint is
// recovering (data plane 503 with Retry-After) and then runs on b with
// recovered_from, with its labels and policy; the one without a
// checkpoint fails saying so; when a answers again its lease carries the
// new epoch and keeps neither sandbox.
func TestRecoverLostWorker(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	reg := prometheus.NewRegistry()
	s, err := New(Config{Store: st, Templates: []string{"default"}, WorkerToken: "token", RecoverAfter: 6 * time.Second,
		ReconcileInterval: time.Hour, Metrics: reg})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	a, b := newFencingWorker("wa", 1<<20), newFencingWorker("wb", 1<<10)
	for _, w := range []*fencingWorker{a, b} {
		s.AddWorker(w)
		if err := st.UpsertWorker(ctx, storeWorker(w.id)); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	s.mu.Lock()
	for _, id := range []string{"wa", "wb"} {
		s.seen[id] = time.Now().Add(time.Hour)
	}
	s.mu.Unlock()
	key, err := s.Bootstrap(ctx, false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h := s.Handler()
	do := func(method, path, body string) (int, http.Header, string) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Header(), rec.Body.String()
	}
	get := func(id string) api.Sandbox {
		t.Helper()
		code, _, body := do("GET", "/v1/sandboxes/"+id, "")
		var v api.Sandbox
		if code != 200 || json.Unmarshal([]byte(body), &v) != nil {
			t.Fatalf("GET %s = %d %s", id, code, body)
		}
		return v
	}
	create := func(body string) api.Sandbox {
		t.Helper()
		code, _, out := do("POST", "/v1/sandboxes", body)
		var v api.Sandbox
		if code != 201 || json.Unmarshal([]byte(out), &v) != nil {
			t.Fatalf("POST /v1/sandboxes %s = %d %s", body, code, out)
		}
		return v
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(a.leaseLog()) > 0 && len(b.leaseLog()) > 0 })
	testenv.Eventually(t, 10*time.Second, func() bool { return len(s.healthyWorkers()) == 2 }) // probed since
	kept := create(`{"memory_mib":256,"labels":{"app":"kept"},"checkpoints":{"every":"1s"}}`)
	gone := create(`{"memory_mib":256}`)
	if kept.Worker != "wa" || gone.Worker != "wa" {
		t.Fatalf("setup: sandboxes on %s and %s, want both on wa (the roomier)", kept.Worker, gone.Worker)
	}
	var cps api.CheckpointList
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, _, body := do("GET", "/v1/sandboxes/"+kept.ID+"/checkpoints", "")
		return json.Unmarshal([]byte(body), &cps) == nil && len(cps.Checkpoints) > 0
	})

	b.fmu.Lock()
	hold := make(chan struct{})
	b.hold = hold
	b.fmu.Unlock()
	cutAt := time.Now()
	a.setCut(true)
	testenv.Eventually(t, 30*time.Second, func() bool { return get(kept.ID).State == "recovering" })
	lostAfter := time.Since(cutAt)
	// Its last lease was at most a lease interval (400 ms here) before
	// the cut: never lost sooner than RecoverAfter after that.
	if lostAfter < 5*time.Second {
		t.Errorf("worker declared lost %v after it was cut off, well before RecoverAfter (6s)", lostAfter)
	}
	code, hdr, body := do("POST", "/v1/sandboxes/"+kept.ID+"/exec", `{"command":["true"]}`)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || !strings.Contains(body, "recovering") {
		t.Errorf("exec while recovering = %d (Retry-After %q) %s; want 503 with Retry-After", code, hdr.Get("Retry-After"), body)
	}
	if v := get(kept.ID); !strings.Contains(v.Reason, "wa was lost") {
		t.Errorf("recovering sandbox's reason = %q", v.Reason)
	}
	fams := metricstest.Scrape(t, scrapeURL(t, reg))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"space_workers", map[string]string{"health": "unhealthy"}, 1},
		{"space_workers", map[string]string{"health": "healthy"}, 1},
		{"space_workers_lost_total", nil, 1},
		{"space_leader", nil, 1},
		{"space_leader_changes_total", nil, 1},
	} {
		if got, _ := fams.Value(c.name, c.labels); got != c.want {
			t.Errorf("while recovering: %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got, _ := fams.Value("space_reconcile_runs_total", map[string]string{"outcome": "ok"}); got < 1 {
		t.Errorf("space_reconcile_runs_total{outcome=ok} = %v, want at least 1 (the new term's)", got)
	}
	if got, _ := fams.Value("space_sandbox_operation_seconds", map[string]string{"op": "checkpoint", "outcome": "ok"}); got < 1 {
		t.Errorf("space_sandbox_operation_seconds{op=checkpoint,outcome=ok} = %v, want at least 1 (the automatic checkpoints)", got)
	}
	close(hold)
	testenv.Eventually(t, 30*time.Second, func() bool { return get(kept.ID).State == "running" })
	v := get(kept.ID)
	if v.Worker != "wb" || v.RecoveredFrom == nil || v.RecoveredFrom.LostWorker != "wa" || v.Labels["app"] != "kept" || v.Checkpoints == nil {
		t.Errorf("recovered sandbox = %+v, want it on wb with recovered_from, its labels and policy", v)
	} else if rf := v.RecoveredFrom; rf.LostWorkSeconds < 0 || rf.LostWorkSeconds > 5 || rf.CheckpointAt.After(rf.LostAt) {
		t.Errorf("recovered_from = %+v: want the latest checkpoint, at most a few seconds before the loss", rf)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return get(gone.ID).State == "failed" })
	if r := get(gone.ID).Reason; !strings.Contains(r, "no checkpoint") {
		t.Errorf("failed sandbox's reason = %q, want it to say it had no checkpoint", r)
	}
	// The events tell it, with who did what and why.
	leader := "leader:" + s.cfg.ReplicaID
	byType := map[string]store.Event{}
	evs, err := st.ListEvents(ctx, store.EventQuery{SandboxID: kept.ID})
	if err != nil {
		t.Fatalf("ListEvents() = %v", err)
	}
	for _, e := range evs {
		if _, ok := byType[e.Type]; !ok {
			byType[e.Type] = e
		}
	}
	if e := byType["checkpointed"]; e.Actor != "policy:checkpoints" || !strings.Contains(string(e.Data), `"snapshot_id":"snp_`) || !strings.Contains(string(e.Data), `"trigger":"schedule"`) {
		t.Errorf("checkpointed event = %+v, want policy:checkpoints with the snapshot and trigger schedule", e)
	}
	if e := byType["recovering"]; e.Actor != leader || e.Prev != "running" || !strings.Contains(e.Reason, "wa was lost") {
		t.Errorf("recovering event = %+v, want %s from running saying wa was lost", e, leader)
	}
	if e := byType["recovered"]; e.Actor != leader || e.Prev != "recovering" || e.State != "running" {
		t.Errorf("recovered event = %+v, want %s from recovering to running", e, leader)
	}
	evs, err = st.ListEvents(ctx, store.EventQuery{SandboxID: gone.ID, Types: []string{"failed"}})
	if err != nil || len(evs) != 1 || evs[0].Actor != leader || !strings.Contains(evs[0].Reason, "no checkpoint") {
		t.Errorf("failed events of the sandbox without checkpoint = %+v, %v; want one by %s saying it had no checkpoint", evs, err, leader)
	}
	fams = metricstest.Scrape(t, scrapeURL(t, reg))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"space_recoveries_total", map[string]string{"outcome": "recovered"}, 1},
		{"space_recoveries_total", map[string]string{"outcome": "no_checkpoint"}, 1},
		{"space_recoveries_total", map[string]string{"outcome": "failed"}, 0},
		{"space_recovery_lost_work_seconds", nil, 1},
	} {
		if got, _ := fams.Value(c.name, c.labels); got != c.want {
			t.Errorf("after the recovery: %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	ws, err := st.ListWorkers(ctx)
	if err != nil || len(ws) != 2 || ws[0].ID != "wa" || ws[0].Epoch != 1 || ws[1].Epoch != 0 {
		t.Errorf("workers after the fence = %+v, %v; want wa at epoch 1", ws, err)
	}

	// a answers again: its next lease has the new epoch and keeps none of
	// its old sandboxes.
	n := len(a.leaseLog())
	a.setCut(false)
	testenv.Eventually(t, 20*time.Second, func() bool { return len(a.leaseLog()) > n })
	last := a.leaseLog()[len(a.leaseLog())-1]
	if last.Epoch != 1 || slices.Contains(last.Keep, kept.ID) || slices.Contains(last.Keep, gone.ID) {
		t.Errorf("lease to the returning worker = %+v, want epoch 1 keeping neither sandbox", last)
	}
	// The failed one is deleted without asking a for anything.
	if code, _, body := do("DELETE", "/v1/sandboxes/"+gone.ID, ""); code != http.StatusNoContent {
		t.Errorf("DELETE failed sandbox = %d %s", code, body)
	}
}

// storeWorker is a worker's store record, for a test that adds it.
func storeWorker(id string) store.Worker {
	return store.Worker{ID: id, Address: "https://" + id + ".test:7443", VCPUs: 64, MemoryMiB: 1 << 20, LastHeartbeat: time.Now()}
}
