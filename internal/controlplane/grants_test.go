package controlplane

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/secrets"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/worker"
)

// grantWorker is an instantWorker that keeps what it was asked to
// create with.
type grantWorker struct {
	instantWorker
	mu sync.Mutex
	// +checklocks:mu
	creates []worker.CreateRequest
}

func (w *grantWorker) Create(ctx context.Context, req worker.CreateRequest) (worker.Info, error) {
	w.mu.Lock()
	w.creates = append(w.creates, req)
	w.mu.Unlock()
	return w.instantWorker.Create(ctx, req)
}

// grantServer returns a server with a secrets key and wk as its one
// (healthy) worker, its store, and a func that sends a request with the
// admin's API key.
func grantServer(t *testing.T, wk Worker) (store.Store, func(method, path, body string) (int, []byte)) {
	t.Helper()
	box, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), "secrets.key"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Templates: []string{"default"}, Secrets: box})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	s.AddWorker(wk)
	s.mu.Lock()
	s.seen[wk.ID()] = time.Now().Add(time.Hour)
	s.mu.Unlock()
	admin, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	h := s.Handler()
	return st, func(method, path, body string) (int, []byte) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+admin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes()
	}
}

// createSecret stores secret name bound to hosts through the API.
func createSecret(t *testing.T, do func(method, path, body string) (int, []byte), name, value string, hosts ...string) {
	t.Helper()
	hj, _ := json.Marshal(hosts)
	body := fmt.Sprintf(`{"name":%q,"value":%q,"hosts":%s}`, name, base64.StdEncoding.EncodeToString([]byte(value)), hj)
	if code, b := do("POST", "/v1/secrets", body); code != 201 {
		t.Fatalf("setup: POST /v1/secrets %s = %d %s", name, code, b)
	}
}

func TestAllowGrantHosts(t *testing.T) {
	grant := func(hosts ...string) worker.SecretGrant { return worker.SecretGrant{Name: "s", Hosts: hosts} }
	tests := []struct {
		name   string
		allow  []string
		grants []worker.SecretGrant
		want   []string
	}{
		{"no policy", nil, []worker.SecretGrant{grant("api.test")}, []string{"api.test:443"}},
		{"other rules stay", []string{"other.test"}, []worker.SecretGrant{grant("api.test", "up.test")},
			[]string{"other.test", "api.test:443", "up.test:443"}},
		{"any port covers", []string{"api.test"}, []worker.SecretGrant{grant("api.test")}, []string{"api.test"}},
		{"443 covers", []string{"api.test:443"}, []worker.SecretGrant{grant("api.test")}, []string{"api.test:443"}},
		{"wildcard covers", []string{"*.test:443"}, []worker.SecretGrant{grant("api.test")}, []string{"*.test:443"}},
		{"wildcard is not the suffix itself", []string{"*.api.test"}, []worker.SecretGrant{grant("api.test")},
			[]string{"*.api.test", "api.test:443"}},
		{"another port does not cover", []string{"api.test:8443"}, []worker.SecretGrant{grant("api.test")},
			[]string{"api.test:8443", "api.test:443"}},
		{"an address does not cover", []string{"10.0.0.0/8"}, []worker.SecretGrant{grant("api.test")},
			[]string{"10.0.0.0/8", "api.test:443"}},
		{"a host two grants share once", nil, []worker.SecretGrant{grant("api.test"), grant("api.test")}, []string{"api.test:443"}},
		{"no grants", []string{"other.test"}, nil, []string{"other.test"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := worker.Network{Allow: append([]string(nil), tt.allow...), ICMP: true}
			got := allowGrantHosts(in, tt.grants)
			if diff := cmp.Diff(worker.Network{Allow: tt.want, ICMP: true}, got); diff != "" {
				t.Errorf("allowGrantHosts(%q, ...) (-want +got):\n%s", tt.allow, diff)
			}
			if diff := cmp.Diff(tt.allow, in.Allow); diff != "" {
				t.Errorf("allowGrantHosts changed its argument's rules (-before +after):\n%s", diff)
			}
		})
	}
}

// TestCreateAllowsGrantHosts checks a create that grants secrets has
// their hosts in its policy, visibly, and sends the worker that policy.
func TestCreateAllowsGrantHosts(t *testing.T) {
	wk := &grantWorker{}
	_, do := grantServer(t, wk)
	createSecret(t, do, "gh", "tok-1", "api.github.com", "uploads.github.com")
	createSecret(t, do, "pypi", "tok-2", "upload.pypi.org")
	code, body := do("POST", "/v1/sandboxes", `{"secrets":["gh","pypi"],"network":{"allow":["*.github.com","example.com"]}}`)
	var sb api.Sandbox
	if code != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("POST /v1/sandboxes = %d %s", code, body)
	}
	want := []string{"*.github.com", "example.com", "upload.pypi.org:443"}
	if sb.Network == nil || !cmp.Equal(sb.Network.Allow, want) {
		t.Errorf("created sandbox's network = %+v, want allow %q", sb.Network, want)
	}
	_, body = do("GET", "/v1/sandboxes/"+sb.ID, "")
	var got api.Sandbox
	if err := json.Unmarshal(body, &got); err != nil || got.Network == nil || !cmp.Equal(got.Network.Allow, want) {
		t.Errorf("GET /v1/sandboxes/%s network = %+v (%v), want allow %q", sb.ID, got.Network, err, want)
	}
	wk.mu.Lock()
	creates := wk.creates
	wk.mu.Unlock()
	if len(creates) != 1 || creates[0].Spec.Network == nil || !cmp.Equal(creates[0].Spec.Network.Allow, want) {
		t.Errorf("the worker was asked to create %+v, want one with allow %q", creates, want)
	}

	// Without a network of its own, the grants' hosts are all it allows.
	code, body = do("POST", "/v1/sandboxes", `{"secrets":["pypi"]}`)
	sb = api.Sandbox{}
	if code != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("POST /v1/sandboxes = %d %s", code, body)
	}
	if want := []string{"upload.pypi.org:443"}; sb.Network == nil || !cmp.Equal(sb.Network.Allow, want) {
		t.Errorf("created sandbox's network = %+v, want allow %q", sb.Network, want)
	}
}
