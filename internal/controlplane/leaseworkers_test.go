package controlplane

// These tests find workers through their Leases on client-go's fake
// clientset (kubetest's fake API server); a real API server runs them in
// the k8s tier later.

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"space/api"
	"space/internal/kube/kubefake"
	"space/internal/kube/workerlease"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/testenv"
	"space/internal/workerproto"
)

const leaseNS = "space"

// reconcileCounter is a store that counts the reconciles of each worker
// (each lists the worker's sandboxes).
type reconcileCounter struct {
	store.Store
	mu sync.Mutex
	// +checklocks:mu
	n map[string]int
}

func (c *reconcileCounter) SandboxesByWorker(ctx context.Context, id string) ([]store.Sandbox, error) {
	c.mu.Lock()
	c.n[id]++
	c.mu.Unlock()
	return c.Store.SandboxesByWorker(ctx, id)
}

func (c *reconcileCounter) reconciles(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// leaseServer returns a control plane on clk that watches the workers'
// Leases on a fake API server, that API server, the store's reconcile
// counter and an admin key.
func leaseServer(t *testing.T, clk *kubefake.Clock) (*Server, *fake.Clientset, *reconcileCounter, string) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	rc := &reconcileCounter{Store: st, n: map[string]int{}}
	s, err := New(Config{Store: rc, Templates: []string{"default"}, WorkerToken: testWorkerToken, Now: clk.Now})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	key, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cs := kubefake.NewAPIServer(t)
	w, err := workerlease.NewWatcher(workerlease.WatcherConfig{Namespace: leaseNS, Resync: 50 * time.Millisecond, Log: testLog()}, cs, s)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, cs, rc, key
}

// publisher returns the Lease publisher of worker id serving at addr, on
// clk.
func publisher(t *testing.T, cs *fake.Clientset, clk *kubefake.Clock, id, addr string) *workerlease.Publisher {
	t.Helper()
	caps := api.WorkerCapabilities{VMM: "qemu", Accel: "tcg", Snapshots: true, NICs: []string{"socket"}}
	p, err := workerlease.NewPublisher(workerlease.Config{
		Namespace: leaseNS, ID: id, Now: clk.Now,
		State: func(context.Context) (api.RegisterWorker, error) {
			return api.RegisterWorker{Address: addr, VCPUs: 8, MemoryMiB: 8192, Protocol: workerproto.Version, Capabilities: caps}, nil
		},
	}, cs)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return p
}

// workerState returns whether the control plane lists worker id, and
// whether healthy and its last heartbeat.
func workerState(t *testing.T, s *Server, key, id string) (listed, healthy bool, seen time.Time) {
	t.Helper()
	for _, w := range listWorkers(t, s, key) {
		if w.ID == id {
			return true, w.Healthy, w.LastHeartbeat
		}
	}
	return false, false, time.Time{}
}

func createSandbox(t *testing.T, s *Server, key string) (int, api.Sandbox) {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+key)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	var sb api.Sandbox
	if rec.Code == http.StatusCreated {
		if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil {
			t.Fatalf("create: %v", err)
		}
	}
	return rec.Code, sb
}

// TestLeaseWorkerLifecycleWithFakeAPIServer checks a worker found only
// through its Lease appears, takes sandboxes, is reconciled once when
// first seen (not at every renewal), goes unhealthy when its Lease
// expires or is deleted, and comes back (reconciled again) when the
// Lease is renewed or published anew.
func TestLeaseWorkerLifecycleWithFakeAPIServer(t *testing.T) {
	clk := kubefake.NewClock(time.Now())
	s, cs, rc, key := leaseServer(t, clk)
	addr := serveWorker(t, &speaking{protocol: workerproto.Version})
	p := publisher(t, cs, clk, "w1", addr)

	if err := p.Publish(t.Context()); err != nil {
		t.Fatalf("Publish = %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, healthy, _ := workerState(t, s, key, "w1")
		return healthy
	})
	if code, sb := createSandbox(t, s, key); code != http.StatusCreated || sb.Worker != "w1" {
		t.Fatalf("create = %d %+v, want 201 on w1", code, sb)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return rc.reconciles("w1") >= 1 })
	if n := rc.reconciles("w1"); n != 1 {
		t.Errorf("reconciles of w1 after it appeared = %d, want 1", n)
	}

	// A renewal moves its heartbeat and reconciles nothing.
	clk.Advance(10 * time.Second)
	renewed := clk.Now()
	if err := p.Publish(t.Context()); err != nil {
		t.Fatalf("Publish = %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, healthy, seen := workerState(t, s, key, "w1")
		return healthy && seen.Equal(renewed)
	})
	if n := rc.reconciles("w1"); n != 1 {
		t.Errorf("reconciles of w1 after a renewal = %d, want still 1", n)
	}

	// Expired: no event needed, it is unhealthy once the clock passes.
	clk.Advance(workerlease.DefaultDuration)
	if listed, healthy, _ := workerState(t, s, key, "w1"); !listed || healthy {
		t.Errorf("w1 after its Lease expired: listed %v, healthy %v; want listed, unhealthy", listed, healthy)
	}
	if code, _ := createSandbox(t, s, key); code != http.StatusServiceUnavailable {
		t.Errorf("create with w1's Lease expired = %d, want 503", code)
	}
	// Renewed again: back, and reconciled.
	if err := p.Publish(t.Context()); err != nil {
		t.Fatalf("Publish = %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, healthy, _ := workerState(t, s, key, "w1")
		return healthy
	})
	// The reconcile follows the worker's being marked seen.
	testenv.Eventually(t, 10*time.Second, func() bool { return rc.reconciles("w1") >= 2 })
	if n := rc.reconciles("w1"); n != 2 {
		t.Errorf("reconciles of w1 after it came back = %d, want 2", n)
	}

	// Deleted (the worker stopped): unhealthy at once.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatalf("Run (stopping at once) = %v", err)
	}
	if _, err := cs.CoordinationV1().Leases(leaseNS).Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{}); err == nil {
		t.Fatalf("w1's Lease is left after its publisher stopped")
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		listed, healthy, _ := workerState(t, s, key, "w1")
		return listed && !healthy
	})
	// Published anew (the worker restarted): back, and reconciled.
	if err := publisher(t, cs, clk, "w1", addr).Publish(t.Context()); err != nil {
		t.Fatalf("Publish = %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, healthy, _ := workerState(t, s, key, "w1")
		return healthy
	})
	// The reconcile follows the worker's being marked seen.
	testenv.Eventually(t, 10*time.Second, func() bool { return rc.reconciles("w1") >= 3 })
	if n := rc.reconciles("w1"); n != 3 {
		t.Errorf("reconciles of w1 after it restarted = %d, want 3", n)
	}
}

// TestLeaseWorkerRefusedWithFakeAPIServer checks Leases that do not say
// a usable registration (bad annotations, another worker protocol, an
// address that is not https) connect no worker, and a good Lease next to
// them still does.
func TestLeaseWorkerRefusedWithFakeAPIServer(t *testing.T) {
	clk := kubefake.NewClock(time.Now())
	s, cs, _, key := leaseServer(t, clk)
	addr := serveWorker(t, &speaking{protocol: workerproto.Version})
	good := func(id string) map[string]string {
		return map[string]string{
			workerlease.AnnotationID: id, workerlease.AnnotationAddress: addr,
			workerlease.AnnotationProtocol: "1", workerlease.AnnotationCapabilities: `{"vmm":"qemu","accel":"tcg"}`,
			workerlease.AnnotationVCPUs: "2", workerlease.AnnotationMemoryMiB: "1024",
		}
	}
	tests := []struct {
		id     string
		change func(a map[string]string)
	}{
		{"protocol-nan", func(a map[string]string) { a[workerlease.AnnotationProtocol] = "one" }},
		{"caps-bad-json", func(a map[string]string) { a[workerlease.AnnotationCapabilities] = "{" }},
		{"no-vcpus", func(a map[string]string) { delete(a, workerlease.AnnotationVCPUs) }},
		{"other-id", func(a map[string]string) { a[workerlease.AnnotationID] = "w-else" }},
		{"newer-protocol", func(a map[string]string) { a[workerlease.AnnotationProtocol] = "99" }},
		{"plain-http", func(a map[string]string) { a[workerlease.AnnotationAddress] = "http://127.0.0.1:1" }},
		{"bad-accel", func(a map[string]string) { a[workerlease.AnnotationCapabilities] = `{"vmm":"qemu","accel":"hvf"}` }},
	}
	for _, tt := range tests {
		a := good(tt.id)
		tt.change(a)
		createLease(t, cs, tt.id, clk.Now(), a)
	}
	createLease(t, cs, "w-good", clk.Now(), good("w-good"))
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, healthy, _ := workerState(t, s, key, "w-good")
		return healthy
	})
	if ws := listWorkers(t, s, key); len(ws) != 1 {
		t.Errorf("workers = %+v, want w-good alone", ws)
	}
}

// createLease writes worker id's Lease by hand, renewed at renewed,
// carrying annotations a.
func createLease(t *testing.T, cs *fake.Clientset, id string, renewed time.Time, a map[string]string) {
	t.Helper()
	now := metav1.NewMicroTime(renewed)
	holder := id + "/life"
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: workerlease.Name(id), Labels: map[string]string{workerlease.LabelLease: "true"}, Annotations: a},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: new(int32(30)), RenewTime: &now},
	}
	if _, err := cs.CoordinationV1().Leases(leaseNS).Create(t.Context(), l, metav1.CreateOptions{}); err != nil {
		t.Fatalf("setup: create lease %s: %v", id, err)
	}
}

// testLog is a logger to stderr if SPACE_TEST_LOG is set, else nil.
func testLog() *slog.Logger {
	if os.Getenv("SPACE_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}
