package controlplane

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"space/api"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/worker"
	"space/internal/workerproto"
)

// instantWorker is a worker that creates and deletes sandboxes without
// VMs, so benchmarks measure the control plane alone (store writes at
// full durability, validation, placement, JSON).
type instantWorker struct {
	mu sync.Mutex
	// +checklocks:mu
	used int64
}

func (w *instantWorker) ID() string { return "instant" }
func (w *instantWorker) Create(_ context.Context, req worker.CreateRequest) (worker.Info, error) {
	w.mu.Lock()
	w.used += req.Spec.MemoryMiB
	w.mu.Unlock()
	return worker.Info{ID: req.ID, Team: req.Team, State: sandbox.Running, Spec: req.Spec,
		VM: &api.VMInfo{VMM: "none", StartedBy: "boot"}}, nil
}
func (w *instantWorker) Delete(context.Context, string) error { return nil }
func (w *instantWorker) EgressLog(context.Context, string) (string, io.ReadCloser, error) {
	return "instant", io.NopCloser(strings.NewReader("")), nil
}
func (w *instantWorker) SetNetwork(_ context.Context, id string, _ worker.Network) (worker.Info, error) {
	return worker.Info{ID: id, State: sandbox.Running}, nil
}
func (w *instantWorker) SetSecrets(_ context.Context, id string, req worker.SecretsRequest) (worker.Info, error) {
	return worker.Info{ID: id, State: sandbox.Running}, nil
}
func (w *instantWorker) Snapshot(_ context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error) {
	return worker.SnapshotInfo{ID: req.SnapshotID, SandboxID: id}, nil
}
func (w *instantWorker) Restore(_ context.Context, id, _ string) (worker.Info, error) {
	return worker.Info{ID: id, State: sandbox.Running}, nil
}
func (w *instantWorker) DeleteSnapshot(context.Context, string) error { return nil }
func (w *instantWorker) Pause(_ context.Context, id string) (worker.Info, error) {
	return worker.Info{ID: id, State: sandbox.Paused}, nil
}
func (w *instantWorker) Resume(_ context.Context, id string) (worker.Info, error) {
	return worker.Info{ID: id, State: sandbox.Running}, nil
}
func (w *instantWorker) Sandbox(_ context.Context, id string) (worker.Info, error) {
	return worker.Info{ID: id, State: sandbox.Running}, nil
}
func (w *instantWorker) List(context.Context) ([]worker.Info, error) { return nil, nil }
func (w *instantWorker) SnapshotInfo(_ context.Context, id string) (worker.SnapshotInfo, error) {
	return worker.SnapshotInfo{ID: id}, nil
}
func (w *instantWorker) Usage(_ context.Context, id string, _ workerproto.UsageRequest) (api.SandboxMetrics, error) {
	return api.SandboxMetrics{SandboxID: id}, nil
}
func (w *instantWorker) Status(context.Context) (worker.Status, error) {
	return worker.Status{ID: "instant", VCPUs: 1 << 20, MemoryMiB: 1 << 40}, nil
}
func (w *instantWorker) Lease(_ context.Context, req worker.LeaseRequest) (worker.LeaseReply, error) {
	return worker.LeaseReply{Epoch: req.Epoch}, nil
}
func (w *instantWorker) ServeHTTP(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(204) }

// addInstantWorker adds an instant worker to s. It counts as standalone,
// so it gets a heartbeat that stays fresh.
func addInstantWorker(s *Server) {
	s.AddWorker(&instantWorker{})
	s.mu.Lock()
	s.seen["instant"] = time.Now().Add(time.Hour)
	s.mu.Unlock()
}

func benchServer(b *testing.B) (*Server, http.Handler, string) {
	b.Helper()
	st, err := sqlite.Open(b.Context(), b.TempDir()+"/space.db")
	if err != nil {
		b.Fatalf("setup: %v", err)
	}
	b.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Templates: []string{"default"}, Quota: Quota{Sandboxes: 1 << 30}})
	if err != nil {
		b.Fatalf("setup: %v", err)
	}
	addInstantWorker(s)
	secret, err := s.Bootstrap(b.Context(), false)
	if err != nil {
		b.Fatalf("setup: %v", err)
	}
	return s, s.Handler(), secret
}

func call(b *testing.B, h http.Handler, key, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code/100 != 2 {
		b.Fatalf("%s %s = %d %s", method, path, rec.Code, rec.Body)
	}
	return rec
}

// BenchmarkCreateOverhead measures POST /v1/sandboxes through the whole
// control plane (auth, validation, quota, placement, two durable store
// writes) with a worker that takes no time, and reports the p50 and p99.
func BenchmarkCreateOverhead(b *testing.B) {
	_, h, key := benchServer(b)
	var times []time.Duration
	for b.Loop() {
		t0 := time.Now()
		call(b, h, key, "POST", "/v1/sandboxes", `{"memory_mib":256,"labels":{"bench":"yes"}}`)
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkListGet1000 measures list and get with 1000 sandboxes in the
// store.
func BenchmarkListGet1000(b *testing.B) {
	s, h, key := benchServer(b)
	ctx := b.Context()
	var ids []string
	for i := range 1000 {
		sb, err := s.cfg.Store.CreateSandbox(ctx, store.Sandbox{
			ID: store.NewSandboxID(), TeamID: DefaultTeam, Template: "default", State: sandbox.Running,
			WorkerID: "instant", Spec: []byte(`{"template":"default","vcpus":1,"memory_mib":256,"disk_mib":4096}`),
			Labels: map[string]string{"n": fmt.Sprint(i)},
		})
		if err != nil {
			b.Fatalf("setup: %v", err)
		}
		ids = append(ids, sb.ID)
	}
	b.Run("list", func(b *testing.B) {
		for b.Loop() {
			call(b, h, key, "GET", "/v1/sandboxes", "")
		}
	})
	b.Run("get", func(b *testing.B) {
		i := 0
		for b.Loop() {
			call(b, h, key, "GET", "/v1/sandboxes/"+ids[i%len(ids)], "")
			i++
		}
	})
}
