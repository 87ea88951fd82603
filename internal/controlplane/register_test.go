package controlplane

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/worker"
	"space/internal/workerproto"
	"space/internal/workertls"
)

const testWorkerToken = "test-worker-token-0123456789abcdef"

// registerServer returns a control plane that takes standalone workers,
// its store, and its admin key.
func registerServer(t *testing.T) (*Server, store.Store, string) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Templates: []string{"default"}, WorkerToken: testWorkerToken})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	key, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return s, st, key
}

// speaking is a worker that states protocol version protocol.
type speaking struct {
	instantWorker
	protocol int
}

func (w *speaking) Status(ctx context.Context) (worker.Status, error) {
	st, err := w.instantWorker.Status(ctx)
	st.Protocol = w.protocol
	st.Capabilities = workerproto.Capabilities{VMM: "qemu", Accel: "tcg", Snapshots: true, NICs: []string{"socket"}}
	return st, err
}

// serveWorker serves svc's worker API with the test token's TLS and
// returns its URL.
func serveWorker(t *testing.T, svc workerproto.Service) string {
	t.Helper()
	mux := http.NewServeMux()
	workerproto.Mount(mux, svc, nil)
	cfg, err := workertls.Server(testWorkerToken)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = cfg
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

func register(t *testing.T, s *Server, req api.RegisterWorker) *httptest.ResponseRecorder {
	t.Helper()
	b, _ := json.Marshal(req)
	r := httptest.NewRequest("POST", "/v1/workers", strings.NewReader(string(b)))
	r.Header.Set("Authorization", "Bearer "+testWorkerToken)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, r)
	return rec
}

func listWorkers(t *testing.T, s *Server, key string) []api.Worker {
	t.Helper()
	r := httptest.NewRequest("GET", "/v1/workers", nil)
	r.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, r)
	var out api.WorkerList
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
		t.Fatalf("GET /v1/workers = %d %s", rec.Code, rec.Body)
	}
	return out.Workers
}

// TestRegisterRefusesOtherProtocol checks a worker that speaks another
// worker protocol version is refused with a message saying what to
// upgrade, and leaves no trace; one connected before is disconnected.
func TestRegisterRefusesOtherProtocol(t *testing.T) {
	tests := []struct {
		name     string
		protocol int
		want     string
	}{
		{"newer", workerproto.Version + 1, "worker w1 speaks worker protocol 2, this control plane speaks 1: upgrade the control plane"},
		{"older than versions", 0, "upgrade the worker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, st, key := registerServer(t)
			addr := serveWorker(t, &speaking{protocol: tt.protocol})
			rec := register(t, s, api.RegisterWorker{ID: "w1", Address: addr, VCPUs: 2, MemoryMiB: 1024, Protocol: tt.protocol})
			var e api.Error
			json.Unmarshal(rec.Body.Bytes(), &e)
			if rec.Code != http.StatusConflict || e.Error.Code != api.CodeFailedPrecondition || !strings.Contains(e.Error.Message, tt.want) {
				t.Errorf("register speaking protocol %d = %d %s, want 409 failed_precondition saying %q", tt.protocol, rec.Code, rec.Body, tt.want)
			}
			if ws, err := st.ListWorkers(t.Context()); err != nil || len(ws) != 0 {
				t.Errorf("stored workers after a refused registration = %v, %v; want none", ws, err)
			}
			if ws := listWorkers(t, s, key); len(ws) != 0 {
				t.Errorf("GET /v1/workers after a refused registration = %+v, want none", ws)
			}
		})
	}

	t.Run("after a compatible one", func(t *testing.T) {
		s, _, key := registerServer(t)
		addr := serveWorker(t, &speaking{protocol: workerproto.Version})
		if rec := register(t, s, api.RegisterWorker{ID: "w1", Address: addr, Protocol: workerproto.Version}); rec.Code != http.StatusOK {
			t.Fatalf("register = %d %s", rec.Code, rec.Body)
		}
		if rec := register(t, s, api.RegisterWorker{ID: "w1", Address: addr, Protocol: workerproto.Version + 1}); rec.Code != http.StatusConflict {
			t.Errorf("register again speaking a newer protocol = %d %s, want 409", rec.Code, rec.Body)
		}
		if ws := listWorkers(t, s, key); len(ws) != 0 {
			t.Errorf("GET /v1/workers after an upgraded worker was refused = %+v, want none", ws)
		}
	})
}

// TestRegisterCapabilities checks a worker's protocol version and
// capabilities are kept and shown, and bad capabilities are refused.
func TestRegisterCapabilities(t *testing.T) {
	s, _, key := registerServer(t)
	addr := serveWorker(t, &speaking{protocol: workerproto.Version})
	caps := api.WorkerCapabilities{VMM: "qemu", Accel: "tcg", Snapshots: true, NICs: []string{"socket"}}
	bad := caps
	bad.Accel = "hvf"
	if rec := register(t, s, api.RegisterWorker{ID: "w1", Address: addr, Protocol: workerproto.Version, Capabilities: bad}); rec.Code != http.StatusBadRequest {
		t.Errorf("register with accel hvf = %d %s, want 400", rec.Code, rec.Body)
	}
	rec := register(t, s, api.RegisterWorker{ID: "w1", Address: addr, Protocol: workerproto.Version, Capabilities: caps})
	if rec.Code != http.StatusOK {
		t.Fatalf("register = %d %s", rec.Code, rec.Body)
	}
	ws := listWorkers(t, s, key)
	if len(ws) != 1 {
		t.Fatalf("GET /v1/workers = %+v, want w1", ws)
	}
	got := ws[0]
	if got.ID != "w1" || !got.Healthy || got.Protocol != workerproto.Version {
		t.Errorf("GET /v1/workers = %+v, want w1 healthy speaking %d", got, workerproto.Version)
	}
	if diff := cmp.Diff(&caps, got.Capabilities); diff != "" {
		t.Errorf("GET /v1/workers capabilities (-want +got):\n%s", diff)
	}
}

// TestLoadWorkersChecksProtocol checks a stored worker that answers
// speaking another protocol is not connected, while a compatible one
// and one that does not answer are.
func TestLoadWorkersChecksProtocol(t *testing.T) {
	s, st, _ := registerServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	down := "https://" + ln.Addr().String()
	ln.Close()
	stored := map[string]string{
		"ok":    serveWorker(t, &speaking{protocol: workerproto.Version}),
		"newer": serveWorker(t, &speaking{protocol: workerproto.Version + 1}),
		"down":  down,
	}
	for id, addr := range stored {
		if err := st.UpsertWorker(t.Context(), store.Worker{ID: id, Address: addr, LastHeartbeat: time.Now()}); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	if err := s.LoadWorkers(t.Context()); err != nil {
		t.Fatalf("LoadWorkers = %v", err)
	}
	var got []string
	for _, w := range s.workerList() {
		got = append(got, w.ID())
	}
	if diff := cmp.Diff([]string{"down", "ok"}, got); diff != "" {
		t.Errorf("workers after LoadWorkers (-want +got):\n%s", diff)
	}
	wk, err := s.worker("ok")
	if err != nil {
		t.Fatalf("worker(ok) = %v", err)
	}
	if p, caps := wk.(*Remote).statement(); p != workerproto.Version || caps == nil || caps.VMM != "qemu" {
		t.Errorf("stored worker ok states %d, %+v; want %d and its capabilities", p, caps, workerproto.Version)
	}
}

// TestReplicasShareWorkers checks a worker that registered with one
// replica is served by another on the same store, with the heartbeat the
// first one recorded, and its sandboxes' data plane works there.
func TestReplicasShareWorkers(t *testing.T) {
	s1, st, key := registerServer(t)
	s2, err := New(Config{Store: st, Templates: []string{"default"}, WorkerToken: testWorkerToken})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	addr := serveWorker(t, &speaking{protocol: workerproto.Version})
	caps := api.WorkerCapabilities{VMM: "qemu", Accel: "tcg", Snapshots: true, NICs: []string{"socket"}}
	if rec := register(t, s1, api.RegisterWorker{ID: "w1", Address: addr, VCPUs: 8, MemoryMiB: 8192, Protocol: workerproto.Version, Capabilities: caps}); rec.Code != http.StatusOK {
		t.Fatalf("register = %d %s", rec.Code, rec.Body)
	}
	if ws := listWorkers(t, s2, key); len(ws) != 0 {
		t.Fatalf("replica 2 knows %+v before it loads the store", ws)
	}
	if err := s2.loadWorkers(t.Context(), true); err != nil {
		t.Fatalf("loadWorkers = %v", err)
	}
	ws := listWorkers(t, s2, key)
	if len(ws) != 1 || ws[0].ID != "w1" || !ws[0].Healthy {
		t.Fatalf("replica 2's workers = %+v, want w1, healthy", ws)
	}
	// A sandbox created through replica 2 lands on the worker that
	// registered with replica 1.
	req := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	s2.Handler().ServeHTTP(rec, req)
	var sb api.Sandbox
	if rec.Code != http.StatusCreated || json.Unmarshal(rec.Body.Bytes(), &sb) != nil || sb.Worker != "w1" {
		t.Fatalf("create through replica 2 = %d %s, want on w1", rec.Code, rec.Body)
	}
}
