package controlplane

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/testenv/pgtest"
)

// TestReplicasKeepTheQuota runs two control planes on one PostgreSQL
// database, each with its own connection pool, and sends 60 concurrent
// creates over both against a team quota of 10: exactly 10 succeed, the
// rest are refused with 429, and the quota route of either tells the
// same usage.
func TestReplicasKeepTheQuota(t *testing.T) {
	dsn := pgtest.Start(t)
	var servers []*Server
	var key string
	for i := range 2 {
		st, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		s, err := New(Config{Store: st, Templates: []string{"default"}})
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		addInstantWorker(s)
		k, err := s.Bootstrap(context.Background(), i > 0)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		if i == 0 {
			key = k
		}
		servers = append(servers, s)
	}
	do := func(s *Server, method, path, body string) (int, string) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	if code, body := do(servers[0], "PUT", "/v1/quota", `{"sandboxes":10}`); code != 200 {
		t.Fatalf("set quota = %d %s", code, body)
	}
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			code, _ := do(servers[i%2], "POST", "/v1/sandboxes", `{}`)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[201] != 10 || codes[429] != 50 {
		t.Errorf("60 creates over two replicas against a quota of 10: %v, want 10 × 201 and 50 × 429", codes)
	}
	for i, s := range servers {
		if code, body := do(s, "GET", "/v1/quota", ""); code != 200 || !strings.Contains(body, `"used":{"sandboxes":10`) {
			t.Errorf("replica %d quota = %d %s, want 10 sandboxes used", i, code, body)
		}
	}
}

// TestEventsAcrossReplicas runs two control planes on one PostgreSQL
// database and follows the events on one while both create sandboxes
// at once: the follower gets every event of either replica, each once,
// in cursor order (the other replica's within its poll), and nothing the
// store does not hold.
func TestEventsAcrossReplicas(t *testing.T) {
	dsn := pgtest.Start(t)
	var servers []*Server
	var key string
	for i := range 2 {
		st, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		s, err := New(Config{Store: st, Templates: []string{"default"}})
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		addInstantWorker(s)
		k, err := s.Bootstrap(context.Background(), i > 0)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		if i == 0 {
			key = k
		}
		servers = append(servers, s)
	}
	follower := httptest.NewServer(servers[1].Handler())
	t.Cleanup(follower.Close)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", follower.URL+"/v1/events?follow=true", nil)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow = %v, %v", resp, err)
	}
	defer resp.Body.Close()
	evs := readSSE(resp.Body)

	const creates = 12
	var wg sync.WaitGroup
	for i := range creates {
		wg.Go(func() {
			r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{}`))
			r.Header.Set("Authorization", "Bearer "+key)
			rec := httptest.NewRecorder()
			servers[i%2].Handler().ServeHTTP(rec, r)
			if rec.Code != 201 {
				t.Errorf("create on replica %d = %d %s", i%2, rec.Code, rec.Body)
			}
		})
	}
	wg.Wait()
	got := next(t, evs, 2*creates) // created and running of each
	var prev int64
	for _, e := range got {
		n, err := strconv.ParseInt(e.id, 10, 64)
		if err != nil || n <= prev {
			t.Fatalf("event id %q after %d: want increasing", e.id, prev)
		}
		prev = n
	}
	stored, err := servers[0].cfg.Store.ListEvents(t.Context(), store.EventQuery{})
	if err != nil || len(stored) != len(got) {
		t.Fatalf("stored events = %d (%v), follower got %d", len(stored), err, len(got))
	}
	for i, e := range stored {
		if strconv.FormatInt(e.Seq, 10) != got[i].id || e.Type != got[i].event {
			t.Errorf("event %d: stored %d %s, followed %s %s", i, e.Seq, e.Type, got[i].id, got[i].event)
		}
	}
}
