package controlplane

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/internal/store/sqlite"
	"space/internal/testenv"
	"space/internal/worker"
)

// hangsStatus is a worker that never answers (a stopped process): every
// call blocks until its context ends.
type hangsStatus struct{ instantWorker }

func (*hangsStatus) ID() string { return "hung" }
func (*hangsStatus) Status(ctx context.Context) (worker.Status, error) {
	<-ctx.Done()
	return worker.Status{}, ctx.Err()
}
func (*hangsStatus) Create(ctx context.Context, _ worker.CreateRequest) (worker.Info, error) {
	<-ctx.Done()
	return worker.Info{}, ctx.Err()
}

// TestHungWorkerSlowsNothing checks a worker that never answers is
// marked unhealthy by its probe and, once it is, costs a create on
// another worker nothing: creates go to the worker that answers, and the
// worker list shows the hung one unhealthy without waiting for it.
func TestHungWorkerSlowsNothing(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer st.Close()
	s, err := New(Config{Store: st, Templates: []string{"default"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	good, hung := &instantWorker{}, &hangsStatus{}
	s.AddWorker(good)
	s.AddWorker(hung)
	s.mu.Lock()
	s.seen["instant"] = time.Now().Add(time.Hour)
	s.seen["hung"] = time.Now().Add(time.Hour)
	s.mu.Unlock()
	key, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.runProbes(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// The hung worker's first probe fails within probeTimeout.
	t0 := time.Now()
	testenv.Eventually(t, 2*probeTimeout, func() bool { return !s.answering(hung) })
	t.Logf("hung worker marked not answering after %s", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	h := s.Handler()
	do := func(method, path, body string) (int, string) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	// Ten creates: with the hung worker in the placement's path, each
	// would wait for it (for ever: its calls have no deadline here).
	for i := range 10 {
		code, body := do("POST", "/v1/sandboxes", `{}`)
		var sb api.Sandbox
		if code != 201 || json.Unmarshal([]byte(body), &sb) != nil || sb.Worker != "instant" {
			t.Fatalf("create %d = %d %s, want 201 on worker instant", i, code, body)
		}
	}
	t.Logf("10 creates took %s", time.Since(t0).Round(time.Millisecond))
	code, body := do("GET", "/v1/workers", "")
	var l api.WorkerList
	if code != 200 || json.Unmarshal([]byte(body), &l) != nil || len(l.Workers) != 2 {
		t.Fatalf("list workers = %d %s", code, body)
	}
	for _, w := range l.Workers {
		if want := w.ID == "instant"; w.Healthy != want {
			t.Errorf("worker %s healthy = %v, want %v", w.ID, w.Healthy, want)
		}
	}
}
