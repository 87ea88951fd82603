package controlplane

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/store/sqlite"
)

// TestTeamQuota checks an admin-set quota is enforced with clear errors,
// with a worker that boots nothing (quota checks come before any VM).
func TestTeamQuota(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer st.Close()
	s, err := New(Config{Store: st, Templates: []string{"default"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	addInstantWorker(s)
	admin, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	h := s.Handler()
	do := func(key, method, path, body string) (int, string) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	code, body := do(admin, "POST", "/v1/apikeys", `{"team":"small","name":"s"}`)
	var k api.APIKey
	if code != 201 || json.Unmarshal([]byte(body), &k) != nil {
		t.Fatalf("create key = %d %s", code, body)
	}
	if code, body := do(k.Secret, "PUT", "/v1/quota", `{"sandboxes":5}`); code != 403 {
		t.Errorf("non-admin PUT quota = %d %s, want 403", code, body)
	}
	if code, body := do(admin, "PUT", "/v1/quota?team=small", `{"vcpus":-1}`); code != 400 || !strings.Contains(body, `"field":"vcpus"`) {
		t.Errorf("negative quota = %d %s, want 400 naming vcpus", code, body)
	}
	if code, body := do(admin, "PUT", "/v1/quota?team=nosuch", `{"vcpus":1}`); code != 404 {
		t.Errorf("quota of unknown team = %d %s, want 404", code, body)
	}
	if code, body := do(admin, "PUT", "/v1/quota?team=small", `{"sandboxes":2,"vcpus":3}`); code != 200 {
		t.Fatalf("PUT quota = %d %s", code, body)
	}
	steps := []struct {
		body   string
		status int
		msg    string
	}{
		{`{"vcpus":2}`, 201, ""},
		{`{"vcpus":2}`, 429, "2 of 3 vcpus in use, 2 more requested"},
		{`{"vcpus":1}`, 201, ""},
		{`{"vcpus":1}`, 429, "2 of 2 sandboxes in use"},
	}
	for _, st := range steps {
		code, body := do(k.Secret, "POST", "/v1/sandboxes", st.body)
		if code != st.status || !strings.Contains(body, st.msg) {
			t.Errorf("create %s = %d %s, want %d %q", st.body, code, body, st.status, st.msg)
		}
	}
	code, body = do(k.Secret, "GET", "/v1/quota", "")
	var qu api.QuotaUsage
	if code != 200 || json.Unmarshal([]byte(body), &qu) != nil {
		t.Fatalf("GET quota = %d %s", code, body)
	}
	want := api.QuotaUsage{Limits: api.Quota{Sandboxes: 2, VCPUs: 3}, Used: api.Quota{Sandboxes: 2, VCPUs: 3, MemoryMiB: 1024}}
	if diff := cmp.Diff(want, qu); diff != "" {
		t.Errorf("GET quota (-want +got):\n%s", diff)
	}
	// The admin's own team keeps the default quota.
	if code, body := do(admin, "GET", "/v1/quota", ""); code != 200 || !strings.Contains(body, `"sandboxes":50`) {
		t.Errorf("admin's quota = %d %s, want the default", code, body)
	}
}
