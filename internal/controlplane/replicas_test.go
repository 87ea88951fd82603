package controlplane

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

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
