package webhook

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func testNow() time.Time { return time.Now() }

// testStore is a real store (SQLite) holding teams t1 and t2, the
// dispatcher's event source and webhooks.
type testStore struct {
	t  *testing.T
	st store.Store
}

func newTestStore(t *testing.T) *testStore {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	for _, team := range []string{"t1", "t2"} {
		if _, err := st.CreateTeam(t.Context(), store.Team{ID: team}); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return &testStore{t: t, st: st}
}

// add appends an event of type typ about sandbox sbx of team and returns
// its ID.
func (ts *testStore) add(team, typ, sbx string) string {
	ts.t.Helper()
	e, err := ts.st.AppendEvent(ts.t.Context(), store.Event{Type: typ, TeamID: team, SandboxID: sbx})
	if err != nil {
		ts.t.Fatalf("setup: AppendEvent: %v", err)
	}
	return EventID(e.Seq)
}

// hook creates an enabled webhook of team t1 to url with types.
func (ts *testStore) hook(url string, types ...string) store.Webhook {
	ts.t.Helper()
	h, err := ts.st.CreateWebhook(ts.t.Context(), store.Webhook{ID: store.NewWebhookID(), TeamID: "t1", URL: url,
		Secret: NewSecret(), Types: types, Enabled: true})
	if err != nil {
		ts.t.Fatalf("setup: CreateWebhook: %v", err)
	}
	return h
}

// get returns webhook h as stored now.
func (ts *testStore) get(h store.Webhook) store.Webhook {
	ts.t.Helper()
	got, err := ts.st.Webhook(context.Background(), h.TeamID, h.ID)
	if err != nil {
		ts.t.Fatalf("Webhook(%s) = %v", h.ID, err)
	}
	return got
}

// deliveries returns h's delivery log, oldest first.
func (ts *testStore) deliveries(h store.Webhook) []store.WebhookDelivery {
	ts.t.Helper()
	log, err := ts.st.WebhookDeliveries(context.Background(), h.TeamID, h.ID, 0)
	if err != nil {
		ts.t.Fatalf("WebhookDeliveries(%s) = %v", h.ID, err)
	}
	slices.Reverse(log)
	return log
}

// received is one request a receiver got.
type received struct {
	header http.Header
	body   []byte
	ev     Event
}

// receiver is a webhook receiver on loopback that records what it gets;
// answer decides each reply (nil = 204).
type receiver struct {
	srv    *httptest.Server
	answer func(n int) int // n counts requests from 1

	mu sync.Mutex
	// +checklocks:mu
	got []received
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev Event
	_ = json.Unmarshal(body, &ev)
	rc.mu.Lock()
	rc.got = append(rc.got, received{header: r.Header.Clone(), body: body, ev: ev})
	n := len(rc.got)
	rc.mu.Unlock()
	code := http.StatusNoContent
	if rc.answer != nil {
		code = rc.answer(n)
	}
	w.WriteHeader(code)
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

// delivered returns the IDs of the events rc answered 2xx to, in order.
func (rc *receiver) delivered() []string {
	var out []string
	for i, r := range rc.requests() {
		if rc.answer == nil || rc.answer(i+1)/100 == 2 {
			out = append(out, r.ev.ID)
		}
	}
	return out
}

// startDispatcher runs a dispatcher with millisecond timings until the
// test ends.
func startDispatcher(t *testing.T, ts *testStore, mod func(*Config)) {
	t.Helper()
	s, err := NewSender(SenderConfig{Guard: &Guard{AllowPrivate: true}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cfg := Config{Source: StoreEvents{Store: ts.st}, Hooks: ts.st, Sender: s, Poll: 5 * time.Millisecond, FirstBackoff: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v, want nil", err)
		}
		s.Close()
	})
}

func TestDispatcherDeliversSignedInOrder(t *testing.T) {
	ts := newTestStore(t)
	rc := newReceiver(t, nil)
	h := ts.hook(rc.srv.URL, "created", "running")
	sbx := store.NewSandboxID()
	first := ts.add("t1", "created", sbx)
	ts.add("t2", "created", store.NewSandboxID()) // another team's
	ts.add("t1", "deleted", sbx)                  // a type not subscribed
	last := ts.add("t1", "running", sbx)
	startDispatcher(t, ts, nil)

	testenv.Eventually(t, 5*time.Second, func() bool { return EventID(ts.get(h).Cursor) == last })
	if got, want := rc.delivered(), []string{first, last}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	for _, r := range rc.requests() {
		if err := Verify(h.Secret, r.header, r.body, time.Now(), 0); err != nil {
			t.Errorf("Verify(delivery of %s) = %v, want nil", r.ev.ID, err)
		}
		if err := Verify(NewSecret(), r.header, r.body, time.Now(), 0); err == nil {
			t.Errorf("Verify(delivery of %s, another secret) = nil, want an error", r.ev.ID)
		}
		if err := Verify(h.Secret, r.header, r.body, time.Now().Add(10*time.Minute), 0); err == nil {
			t.Errorf("Verify(delivery of %s, 10 minutes later) = nil, want an error", r.ev.ID)
		}
		if got := r.header.Get(HeaderID); got != r.ev.ID {
			t.Errorf("%s = %q, want the event's ID %q", HeaderID, got, r.ev.ID)
		}
		if r.ev.Team != "t1" || r.ev.SandboxID != sbx || r.ev.Cursor == "" || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("delivery %s: team %q sandbox %q cursor %q content type %q", r.ev.ID, r.ev.Team, r.ev.SandboxID, r.ev.Cursor, r.header.Get("Content-Type"))
		}
	}
	for _, d := range ts.deliveries(h) {
		if !d.Delivered || d.Attempt != 1 || d.StatusCode != http.StatusNoContent {
			t.Errorf("delivery log entry %+v, want a first attempt delivered with 204", d)
		}
	}
}

// TestDispatcherRetriesUntilUp: a receiver that is down, then failing,
// gets the event once it is up, with the same ID on every attempt, and
// every attempt is logged.
func TestDispatcherRetriesUntilUp(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	addr := l.Addr().String()
	l.Close() // down: connections are refused

	ts := newTestStore(t)
	h := ts.hook("http://" + addr + "/hook")
	sbx := store.NewSandboxID()
	first := ts.add("t1", "created", sbx)
	second := ts.add("t1", "running", sbx)
	startDispatcher(t, ts, nil)
	testenv.Eventually(t, 5*time.Second, func() bool { return len(ts.deliveries(h)) >= 3 })

	// Up again, but failing twice more before it takes the event.
	rc := &receiver{answer: func(n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}}
	var l2 net.Listener
	testenv.Eventually(t, 5*time.Second, func() bool {
		l2, err = net.Listen("tcp", addr)
		return err == nil
	})
	srv := &http.Server{Handler: http.HandlerFunc(rc.serve)}
	go srv.Serve(l2)
	t.Cleanup(func() { srv.Close() })

	testenv.Eventually(t, 5*time.Second, func() bool { return EventID(ts.get(h).Cursor) == second })
	reqs := rc.requests()
	if len(reqs) != 4 {
		t.Fatalf("receiver got %d requests, want 4 (two refused, then both events)", len(reqs))
	}
	for i, want := range []string{first, first, first, second} {
		if got := reqs[i].header.Get(HeaderID); got != want {
			t.Errorf("request %d: %s = %q, want %q", i+1, HeaderID, got, want)
		}
	}
	log := ts.deliveries(h)
	var attempts []int
	for _, d := range log {
		if EventID(d.EventSeq) == first {
			attempts = append(attempts, d.Attempt)
		}
	}
	for i, a := range attempts {
		if a != i+1 {
			t.Fatalf("attempts logged for %s: %v, want 1, 2, 3, …", first, attempts)
		}
	}
	head, tail := log[0], log[len(log)-1]
	if head.Delivered || head.StatusCode != 0 || head.Error == "" {
		t.Errorf("first attempt logged as %+v, want a connection error", head)
	}
	if !tail.Delivered || EventID(tail.EventSeq) != second || tail.StatusCode != http.StatusOK {
		t.Errorf("last attempt logged as %+v, want %s delivered with 200", tail, second)
	}
	if got := ts.get(h); got.Failures != 0 || !got.Enabled {
		t.Errorf("hook after delivery: failures %d enabled %v, want 0 and true", got.Failures, got.Enabled)
	}
}

// TestDispatcherHungReceiver: a receiver that never answers delays
// neither another webhook's deliveries nor the events that reach it.
func TestDispatcherHungReceiver(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) })
	ts := newTestStore(t)
	rc := newReceiver(t, nil)
	stuck := ts.hook(hung.URL)
	ts.hook(rc.srv.URL)
	startDispatcher(t, ts, nil)
	start := time.Now()
	for range 5 {
		ts.add("t1", "created", store.NewSandboxID())
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rc.delivered()) == 5 })
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the fine receiver got 5 events in %v while the other hung, want well under 3s", d)
	}
	if got := ts.get(stuck); got.Cursor != 0 {
		t.Errorf("hung hook's cursor = %d, want 0", got.Cursor)
	}
}

func TestDispatcherDisablesAfterFailures(t *testing.T) {
	ts := newTestStore(t)
	rc := newReceiver(t, func(int) int { return http.StatusInternalServerError })
	h := ts.hook(rc.srv.URL)
	first := ts.add("t1", "created", store.NewSandboxID())
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	startDispatcher(t, ts, func(c *Config) { c.DisableAfter, c.Metrics = 3, m })

	testenv.Eventually(t, 5*time.Second, func() bool { return !ts.get(h).Enabled })
	if f, d := testutil.ToFloat64(m.attempts.WithLabelValues("failed")), testutil.ToFloat64(m.disabled); f != 3 || d != 1 {
		t.Errorf("metrics: %v failed attempts, %v disabled; want 3 and 1", f, d)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	got := ts.get(h)
	if !strings.Contains(got.DisabledReason, "3 consecutive failed") || got.Cursor != 0 || got.Failures != 3 {
		t.Errorf("disabled hook: %+v, want a reason, cursor 0 and 3 failures", got)
	}
	log := ts.deliveries(h)
	if len(log) != 3 {
		t.Fatalf("delivery log has %d attempts, want 3", len(log))
	}
	for i, d := range log {
		if d.Attempt != i+1 || d.StatusCode != http.StatusInternalServerError || d.Delivered || d.Error == "" || EventID(d.EventSeq) != first {
			t.Errorf("attempt %d logged as %+v", i+1, d)
		}
	}
	// Disabled: no more attempts.
	n := len(rc.requests())
	time.Sleep(50 * time.Millisecond) // ten polls: nothing may happen, so there is nothing to wait for
	if got := len(rc.requests()); got != n {
		t.Errorf("a disabled hook's receiver got %d more requests", got-n)
	}

	// Enabled again, it resumes with the same event.
	got.Enabled, got.DisabledReason = true, ""
	if _, err := ts.st.UpdateWebhook(t.Context(), got); err != nil {
		t.Fatalf("UpdateWebhook(enable) = %v", err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rc.requests()) > n })
	if id := rc.requests()[n].header.Get(HeaderID); id != first {
		t.Errorf("after re-enabling, the first delivery is %s, want %s", id, first)
	}
}
