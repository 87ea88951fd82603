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
	"space/internal/errkind"
	"space/internal/sandbox"
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
	// +checklocks:mu
	sets []worker.SecretsRequest
	// +checklocks:mu
	fail error // what SetSecrets answers, or nil
}

func (w *grantWorker) SetSecrets(_ context.Context, id string, req worker.SecretsRequest) (worker.Info, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sets = append(w.sets, req)
	if w.fail != nil {
		return worker.Info{}, w.fail
	}
	return worker.Info{ID: id, State: sandbox.Running}, nil
}

// Snapshot takes chunked snapshots, which suspends need.
func (w *grantWorker) Snapshot(_ context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error) {
	return worker.SnapshotInfo{ID: req.SnapshotID, SandboxID: id, Chunked: true}, nil
}

// lastSet returns the last SetSecrets request and how many there were.
func (w *grantWorker) lastSet() (worker.SecretsRequest, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.sets) == 0 {
		return worker.SecretsRequest{}, 0
	}
	return w.sets[len(w.sets)-1], len(w.sets)
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

// storedGrants returns the grants and policy the store keeps for sandbox id.
func storedGrants(t *testing.T, st store.Store, id string) ([]worker.SecretGrant, []string) {
	t.Helper()
	sb, err := st.Sandbox(t.Context(), DefaultTeam, id)
	if err != nil {
		t.Fatalf("store Sandbox(%s) = %v", id, err)
	}
	sp, err := specOf(sb)
	if err != nil {
		t.Fatalf("specOf(%s) = %v", id, err)
	}
	if sp.Network == nil {
		return sp.Secrets, nil
	}
	return sp.Secrets, sp.Network.Allow
}

// TestSetSecrets checks PUT /v1/sandboxes/{id}/secrets: kept grants keep
// their placeholders, new ones bring their hosts into the policy as at
// create, the worker gets the grants with their values and the policy,
// and the store keeps them only once the worker took them.
func TestSetSecrets(t *testing.T) {
	wk := &grantWorker{}
	st, do := grantServer(t, wk)
	createSecret(t, do, "gh", "tok-gh", "api.github.com")
	createSecret(t, do, "pypi", "tok-pypi", "upload.pypi.org")
	code, body := do("POST", "/v1/sandboxes", `{"secrets":["gh"],"network":{"allow":["example.com"]}}`)
	var sb api.Sandbox
	if code != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("setup: POST /v1/sandboxes = %d %s", code, body)
	}
	created, _ := storedGrants(t, st, sb.ID)
	path := "/v1/sandboxes/" + sb.ID + "/secrets"

	code, body = do("PUT", path, `{"secrets":["gh","pypi"]}`)
	var got api.Sandbox
	if code != 200 || json.Unmarshal(body, &got) != nil {
		t.Fatalf("PUT %s = %d %s, want 200", path, code, body)
	}
	wantAllow := []string{"example.com", "api.github.com:443", "upload.pypi.org:443"}
	if !cmp.Equal(got.Secrets, []string{"gh", "pypi"}) || got.Network == nil || !cmp.Equal(got.Network.Allow, wantAllow) {
		t.Errorf("PUT %s = secrets %q, network %+v; want gh, pypi and allow %q", path, got.Secrets, got.Network, wantAllow)
	}
	req, n := wk.lastSet()
	if n != 1 || len(req.Secrets) != 2 || !cmp.Equal(req.Network.Allow, wantAllow) {
		t.Fatalf("the worker got %d requests, the last %+v; want one with both grants and allow %q", n, req, wantAllow)
	}
	if !cmp.Equal(req.Secrets[0], created[0]) {
		t.Errorf("the kept grant is %+v, was %+v: it must keep its placeholder", req.Secrets[0], created[0])
	}
	if g := req.Secrets[1]; g.Name != "pypi" || !placeholderLike(g.Placeholder) || g.Placeholder == created[0].Placeholder ||
		!cmp.Equal(g.Hosts, []string{"upload.pypi.org"}) {
		t.Errorf("the new grant is %+v, want pypi's with a fresh placeholder", g)
	}
	if string(req.SecretValues["gh"]) != "tok-gh" || string(req.SecretValues["pypi"]) != "tok-pypi" || len(req.SecretValues) != 2 {
		t.Errorf("the worker got values for %d secrets, want gh's and pypi's", len(req.SecretValues))
	}
	grants, allow := storedGrants(t, st, sb.ID)
	if diff := cmp.Diff(req.Secrets, grants); diff != "" || !cmp.Equal(allow, wantAllow) {
		t.Errorf("the store keeps grants (-sent +stored):\n%s and allow %q, want %q", diff, allow, wantAllow)
	}

	// A policy without gh's host stays so: keeping the grant adds
	// nothing back. Dropping pypi leaves its rule.
	if code, body := do("PUT", "/v1/sandboxes/"+sb.ID+"/network", `{"allow":["example.com","upload.pypi.org:443"]}`); code != 200 {
		t.Fatalf("PUT network = %d %s", code, body)
	}
	if code, body = do("PUT", path, `{"secrets":["gh"]}`); code != 200 {
		t.Fatalf("PUT %s gh = %d %s", path, code, body)
	}
	wantAllow = []string{"example.com", "upload.pypi.org:443"}
	grants, allow = storedGrants(t, st, sb.ID)
	if len(grants) != 1 || !cmp.Equal(grants[0], created[0]) || !cmp.Equal(allow, wantAllow) {
		t.Errorf("after PUT gh the store keeps %+v and allow %q, want gh's first grant and %q", grants, allow, wantAllow)
	}
	if code, body = do("PUT", path, `{"secrets":[]}`); code != 200 {
		t.Fatalf("PUT %s [] = %d %s", path, code, body)
	}
	if grants, _ = storedGrants(t, st, sb.ID); len(grants) != 0 {
		t.Errorf("after PUT [] the store keeps grants %+v, want none", grants)
	}
	if req, _ := wk.lastSet(); len(req.Secrets) != 0 || !cmp.Equal(req.Network.Allow, wantAllow) {
		t.Errorf("PUT [] sent the worker %+v, want no grants and allow %q", req, wantAllow)
	}
}

func placeholderLike(s string) bool {
	return strings.HasPrefix(s, "SPACE_SECRET_") && len(s) == len("SPACE_SECRET_")+32
}

// TestSetSecretsRefused checks bad requests to PUT .../secrets answer
// with the right code, naming the field or the secret, and change
// nothing: neither the worker nor the store hears of them.
func TestSetSecretsRefused(t *testing.T) {
	wk := &grantWorker{}
	st, do := grantServer(t, wk)
	createSecret(t, do, "gh", "tok-gh", "api.github.com")
	code, body := do("POST", "/v1/sandboxes", `{"secrets":["gh"]}`)
	var sb api.Sandbox
	if code != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("setup: POST /v1/sandboxes = %d %s", code, body)
	}
	before, beforeAllow := storedGrants(t, st, sb.ID)
	path := "/v1/sandboxes/" + sb.ID + "/secrets"
	many := `["s0"` + strings.Repeat(`,"s"`, maxGrants) + `]`
	tests := []struct {
		name, path, body string
		code             int
		field, message   string // in the error
		worker           bool   // the worker is asked (and fails)
	}{
		{name: "no list", path: path, body: `{}`, code: 400, field: "secrets"},
		{name: "null list", path: path, body: `{"secrets":null}`, code: 400, field: "secrets"},
		{name: "not a list", path: path, body: `{"secrets":"gh"}`, code: 400, field: "secrets"},
		{name: "unknown field", path: path, body: `{"secrets":["gh"],"network":{}}`, code: 400, field: "network"},
		{name: "bad name", path: path, body: `{"secrets":["a/b"]}`, code: 400, field: "secrets"},
		{name: "named twice", path: path, body: `{"secrets":["gh","gh"]}`, code: 400, field: "secrets"},
		{name: "too many", path: path, body: `{"secrets":` + many + `}`, code: 400, field: "secrets"},
		{name: "unknown secret", path: path, body: `{"secrets":["gh","nosuch"]}`, code: 404, message: "nosuch"},
		{name: "unknown sandbox", path: "/v1/sandboxes/sbx_nosuchsandboxxxxxxxx/secrets", body: `{"secrets":["gh"]}`, code: 404},
		{name: "the worker refuses", path: path, body: `{"secrets":[]}`, code: 409, message: "not running", worker: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, sentBefore := wk.lastSet()
			wk.mu.Lock()
			wk.fail = fmt.Errorf("sandbox is not running: %w", errkind.FailedPrecondition)
			wk.mu.Unlock()
			code, body := do("PUT", tt.path, tt.body)
			var e api.Error
			if code != tt.code || json.Unmarshal(body, &e) != nil || e.Error.Field != tt.field || !strings.Contains(e.Error.Message, tt.message) {
				t.Errorf("PUT %s %s = %d %s, want %d naming field %q and %q", tt.path, tt.body, code, body, tt.code, tt.field, tt.message)
			}
			if _, sent := wk.lastSet(); (sent > sentBefore) != tt.worker {
				t.Errorf("PUT %s %s asked the worker: %v, want %v", tt.path, tt.body, sent > sentBefore, tt.worker)
			}
			grants, allow := storedGrants(t, st, sb.ID)
			if diff := cmp.Diff(before, grants); diff != "" || !cmp.Equal(allow, beforeAllow) {
				t.Errorf("PUT %s %s changed the stored grants (-before +after):\n%s or allow %q (was %q)", tt.path, tt.body, diff, allow, beforeAllow)
			}
		})
	}

	// A paused sandbox's guest cannot take placeholders.
	if code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/pause", ""); code != 200 {
		t.Fatalf("setup: pause = %d %s", code, body)
	}
	_, sentBefore := wk.lastSet()
	if code, body := do("PUT", path, `{"secrets":[]}`); code != 409 || !strings.Contains(string(body), "failed_precondition") {
		t.Errorf("PUT %s on a paused sandbox = %d %s, want 409 failed_precondition", path, code, body)
	}
	if _, sent := wk.lastSet(); sent != sentBefore {
		t.Errorf("PUT %s on a paused sandbox asked the worker", path)
	}
}

// TestResumeSuspendedSendsValues checks a suspended sandbox with grants
// resumes with their values: the worker seals them anew, and refuses a
// grant without its value.
func TestResumeSuspendedSendsValues(t *testing.T) {
	wk := &grantWorker{}
	_, do := grantServer(t, wk)
	createSecret(t, do, "gh", "tok-gh", "api.github.com")
	code, body := do("POST", "/v1/sandboxes", `{"secrets":["gh"]}`)
	var sb api.Sandbox
	if code != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("setup: POST /v1/sandboxes = %d %s", code, body)
	}
	if code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/suspend", ""); code != 200 {
		t.Fatalf("setup: suspend = %d %s", code, body)
	}
	if code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/resume", ""); code != 200 {
		t.Fatalf("resume = %d %s", code, body)
	}
	wk.mu.Lock()
	defer wk.mu.Unlock()
	last := wk.creates[len(wk.creates)-1]
	if len(wk.creates) != 2 || last.FromSnapshot == "" || string(last.SecretValues["gh"]) != "tok-gh" {
		t.Errorf("the resume asked the worker for %+v, want a create from the snapshot with gh's value", last)
	}
}
