package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"space/internal/store"
	"space/internal/testenv"
)

func testNow() time.Time { return time.Now() }

// memSource is an in-memory event log.
type memSource struct {
	mu sync.Mutex
	// +checklocks:mu
	evs []Event
}

func (s *memSource) add(team, typ, sandboxID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, Event{Seq: int64(len(s.evs) + 1), Type: typ, Time: time.Now().UTC(), Team: team, SandboxID: sandboxID})
}

func (s *memSource) Events(_ context.Context, team string, types []string, after int64, limit int) ([]Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Event
	for _, e := range s.evs {
		if e.Seq > after && e.Team == team && (len(types) == 0 || slices.Contains(types, e.Type)) && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

// memHooks keeps webhooks as the store does (see store.Webhooks), in
// memory: the store's own conformance suite checks the real ones.
type memHooks struct {
	mu sync.Mutex
	// +checklocks:mu
	hooks []store.Webhook
	// +checklocks:mu
	log []store.WebhookDelivery
}

func (m *memHooks) add(h store.Webhook) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h.Enabled = true
	h.Updated = time.Now()
	m.hooks = append(m.hooks, h)
}

func (m *memHooks) hook(id string) store.Webhook {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range m.hooks {
		if h.ID == id {
			return h
		}
	}
	return store.Webhook{}
}

func (m *memHooks) deliveries(id string) []store.WebhookDelivery {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []store.WebhookDelivery
	for _, d := range m.log {
		if d.WebhookID == id {
			out = append(out, d)
		}
	}
	return out
}

func (m *memHooks) EnabledWebhooks(context.Context) ([]store.Webhook, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []store.Webhook
	for _, h := range m.hooks {
		if h.Enabled {
			out = append(out, h)
		}
	}
	return out, nil
}

func (m *memHooks) AddWebhookDelivery(_ context.Context, d store.WebhookDelivery, disableAfter int) (store.Webhook, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d.ID = int64(len(m.log) + 1)
	d.Time = time.Now()
	m.log = append(m.log, d)
	for i := range m.hooks {
		h := &m.hooks[i]
		if h.ID != d.WebhookID {
			continue
		}
		switch {
		case d.EventSeq == 0:
		case d.Delivered:
			h.Cursor = max(h.Cursor, d.EventSeq)
			h.Failures = 0
		default:
			h.Failures++
			if disableAfter > 0 && h.Failures >= disableAfter {
				h.Enabled = false
				h.DisabledReason = fmt.Sprintf("%d consecutive failed attempts", h.Failures)
			}
		}
		return *h, nil
	}
	return store.Webhook{}, store.ErrNotFound
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
func startDispatcher(t *testing.T, src Source, hooks Hooks, mod func(*Config)) {
	t.Helper()
	s, err := NewSender(SenderConfig{Guard: &Guard{AllowPrivate: true}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cfg := Config{Source: src, Hooks: hooks, Sender: s, Poll: 5 * time.Millisecond, FirstBackoff: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}
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
	src, hooks := &memSource{}, &memHooks{}
	rc := newReceiver(t, nil)
	secret := NewSecret()
	hooks.add(store.Webhook{ID: "whk_a", TeamID: "t1", URL: rc.srv.URL, Secret: secret, Types: []string{"sandbox.created", "sandbox.running"}})
	src.add("t1", "sandbox.created", "sbx_1")
	src.add("t2", "sandbox.created", "sbx_other") // another team's
	src.add("t1", "sandbox.deleted", "sbx_1")     // a type not subscribed
	src.add("t1", "sandbox.running", "sbx_1")
	startDispatcher(t, src, hooks, nil)

	testenv.Eventually(t, 5*time.Second, func() bool { return hooks.hook("whk_a").Cursor == 4 })
	if got, want := rc.delivered(), []string{"evt_1", "evt_4"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	for _, r := range rc.requests() {
		if err := Verify(secret, r.header, r.body, time.Now(), 0); err != nil {
			t.Errorf("Verify(delivery of %s) = %v, want nil", r.ev.ID, err)
		}
		if err := Verify(NewSecret(), r.header, r.body, time.Now(), 0); err == nil {
			t.Errorf("Verify(delivery of %s, another secret) = nil, want an error", r.ev.ID)
		}
		if err := Verify(secret, r.header, r.body, time.Now().Add(10*time.Minute), 0); err == nil {
			t.Errorf("Verify(delivery of %s, 10 minutes later) = nil, want an error", r.ev.ID)
		}
		if got := r.header.Get(HeaderID); got != r.ev.ID {
			t.Errorf("%s = %q, want the event's ID %q", HeaderID, got, r.ev.ID)
		}
		if r.ev.Team != "t1" || r.ev.SandboxID != "sbx_1" || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("delivery %s: team %q sandbox %q content type %q", r.ev.ID, r.ev.Team, r.ev.SandboxID, r.header.Get("Content-Type"))
		}
	}
	for _, d := range hooks.deliveries("whk_a") {
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

	src, hooks := &memSource{}, &memHooks{}
	hooks.add(store.Webhook{ID: "whk_down", TeamID: "t1", URL: "http://" + addr + "/hook", Secret: "whsec_s"})
	src.add("t1", "sandbox.created", "sbx_1")
	src.add("t1", "sandbox.running", "sbx_1")
	startDispatcher(t, src, hooks, nil)
	testenv.Eventually(t, 5*time.Second, func() bool { return len(hooks.deliveries("whk_down")) >= 3 })

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

	testenv.Eventually(t, 5*time.Second, func() bool { return hooks.hook("whk_down").Cursor == 2 })
	reqs := rc.requests()
	if len(reqs) != 4 {
		t.Fatalf("receiver got %d requests, want 4 (two refused, evt_1, evt_2)", len(reqs))
	}
	for i, want := range []string{"evt_1", "evt_1", "evt_1", "evt_2"} {
		if got := reqs[i].header.Get(HeaderID); got != want {
			t.Errorf("request %d: %s = %q, want %q", i+1, HeaderID, got, want)
		}
	}
	log := hooks.deliveries("whk_down")
	var attempts []int
	for _, d := range log {
		if d.EventSeq == 1 {
			attempts = append(attempts, d.Attempt)
		}
	}
	for i, a := range attempts {
		if a != i+1 {
			t.Fatalf("attempts logged for evt_1: %v, want 1, 2, 3, …", attempts)
		}
	}
	first, last := log[0], log[len(log)-1]
	if first.Delivered || first.StatusCode != 0 || first.Error == "" {
		t.Errorf("first attempt logged as %+v, want a connection error", first)
	}
	if !last.Delivered || last.EventSeq != 2 || last.StatusCode != http.StatusOK {
		t.Errorf("last attempt logged as %+v, want evt_2 delivered with 200", last)
	}
	if h := hooks.hook("whk_down"); h.Failures != 0 || !h.Enabled {
		t.Errorf("hook after delivery: failures %d enabled %v, want 0 and true", h.Failures, h.Enabled)
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
	src, hooks := &memSource{}, &memHooks{}
	rc := newReceiver(t, nil)
	hooks.add(store.Webhook{ID: "whk_hung", TeamID: "t1", URL: hung.URL, Secret: "whsec_s"})
	hooks.add(store.Webhook{ID: "whk_fine", TeamID: "t1", URL: rc.srv.URL, Secret: "whsec_s"})
	startDispatcher(t, src, hooks, nil)
	start := time.Now()
	for range 5 {
		src.add("t1", "sandbox.created", "sbx_1")
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return len(rc.delivered()) == 5 })
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the fine receiver got 5 events in %v while the other hung, want well under 3s", d)
	}
	if h := hooks.hook("whk_hung"); h.Cursor != 0 {
		t.Errorf("hung hook's cursor = %d, want 0", h.Cursor)
	}
}

func TestDispatcherDisablesAfterFailures(t *testing.T) {
	src, hooks := &memSource{}, &memHooks{}
	rc := newReceiver(t, func(int) int { return http.StatusInternalServerError })
	hooks.add(store.Webhook{ID: "whk_bad", TeamID: "t1", URL: rc.srv.URL, Secret: "whsec_s"})
	src.add("t1", "sandbox.created", "sbx_1")
	startDispatcher(t, src, hooks, func(c *Config) { c.DisableAfter = 3 })

	testenv.Eventually(t, 5*time.Second, func() bool { return !hooks.hook("whk_bad").Enabled })
	h := hooks.hook("whk_bad")
	if h.DisabledReason == "" || h.Cursor != 0 || h.Failures != 3 {
		t.Errorf("disabled hook: %+v, want a reason, cursor 0 and 3 failures", h)
	}
	log := hooks.deliveries("whk_bad")
	if len(log) != 3 {
		t.Fatalf("delivery log has %d attempts, want 3", len(log))
	}
	for i, d := range log {
		if d.Attempt != i+1 || d.StatusCode != http.StatusInternalServerError || d.Delivered || d.Error == "" || d.EventSeq != 1 {
			t.Errorf("attempt %d logged as %+v", i+1, d)
		}
	}
	// Disabled: no more attempts.
	n := len(rc.requests())
	time.Sleep(50 * time.Millisecond) // ten polls: nothing may happen, so there is nothing to wait for
	if got := len(rc.requests()); got != n {
		t.Errorf("a disabled hook's receiver got %d more requests", got-n)
	}
}
