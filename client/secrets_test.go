package client

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

// secretServer plays the secret routes: it keeps created secrets by name
// (a taken name is a conflict, a host "bad" is refused with field hosts)
// and records the last create's body.
type secretServer struct {
	mu sync.Mutex
	// +checklocks:mu
	secrets map[string]api.Secret
	// +checklocks:mu
	last api.CreateSecret // the last create's body
}

func newSecretServer(t *testing.T) (*Client, *secretServer) {
	t.Helper()
	f := &secretServer{secrets: map[string]api.Secret{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/secrets", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey || r.Header.Get("Content-Type") != "application/json" {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "want the key and a JSON body", "")
			return
		}
		var req api.CreateSecret
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, err.Error(), "")
			return
		}
		for _, h := range req.Hosts {
			if h == "bad" {
				writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, `"bad": want an exact lower-case host name`, "hosts")
				return
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.last = req
		if _, ok := f.secrets[req.Name]; ok {
			writeError(w, http.StatusConflict, api.CodeConflict, "your team has a secret "+req.Name+" already", "name")
			return
		}
		sc := api.Secret{Name: req.Name, Hosts: req.Hosts, Header: req.Header, Format: req.Format, CreatedAt: t0}
		f.secrets[req.Name] = sc
		writeJSON(w, http.StatusCreated, sc)
	})
	mux.HandleFunc("GET /v1/secrets", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		l := api.SecretList{Secrets: []api.Secret{}}
		for _, name := range []string{"a", "b", "github"} { // by name
			if sc, ok := f.secrets[name]; ok {
				l.Secrets = append(l.Secrets, sc)
			}
		}
		writeJSON(w, http.StatusOK, l)
	})
	mux.HandleFunc("DELETE /v1/secrets/{name}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		name := r.PathValue("name")
		if _, ok := f.secrets[name]; !ok {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "secret "+name+": not found", "")
			return
		}
		delete(f.secrets, name)
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, testKey)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return c, f
}

func TestSecrets(t *testing.T) {
	c, f := newSecretServer(t)
	ctx := t.Context()
	req := api.CreateSecret{Name: "github", Value: []byte{0, 'v', 0xff}, Hosts: []string{"api.github.com"},
		Header: "Authorization", Format: "Bearer {}"}
	got, err := c.CreateSecret(ctx, req)
	if err != nil {
		t.Fatalf("CreateSecret() = %v", err)
	}
	want := api.Secret{Name: "github", Hosts: []string{"api.github.com"}, Header: "Authorization", Format: "Bearer {}", CreatedAt: t0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CreateSecret() (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	sent := f.last
	f.mu.Unlock()
	if diff := cmp.Diff(req, sent); diff != "" {
		t.Errorf("CreateSecret() sent (-want +got):\n%s", diff)
	}
	if _, err := c.CreateSecret(ctx, api.CreateSecret{Name: "a", Value: []byte("v"), Hosts: []string{"a.example"}}); err != nil {
		t.Fatalf("CreateSecret(a) = %v", err)
	}

	_, err = c.CreateSecret(ctx, req)
	var e *Error
	if !IsConflict(err) || !errors.As(err, &e) || e.Field != "name" {
		t.Errorf("CreateSecret(taken name) = %v, want a conflict naming field name", err)
	}
	_, err = c.CreateSecret(ctx, api.CreateSecret{Name: "b", Value: []byte("v"), Hosts: []string{"bad"}})
	if !IsInvalid(err) || !errors.As(err, &e) || e.Field != "hosts" {
		t.Errorf("CreateSecret(bad host) = %v, want invalid naming field hosts", err)
	}

	list, err := c.Secrets(ctx)
	if err != nil {
		t.Fatalf("Secrets() = %v", err)
	}
	if diff := cmp.Diff([]string{"a", "github"}, secretNames(list)); diff != "" {
		t.Errorf("Secrets() (-want +got):\n%s", diff)
	}

	if err := c.DeleteSecret(ctx, "github"); err != nil {
		t.Fatalf("DeleteSecret(github) = %v", err)
	}
	if err := c.DeleteSecret(ctx, "github"); !IsNotFound(err) {
		t.Errorf("DeleteSecret(github) again = %v, want IsNotFound", err)
	}
	if list, err := c.Secrets(ctx); err != nil || len(list) != 1 {
		t.Errorf("Secrets() after delete = %v, %v; want a", secretNames(list), err)
	}
}

func secretNames(scs []api.Secret) []string {
	var names []string
	for _, sc := range scs {
		names = append(names, sc.Name)
	}
	return names
}

// newGrantServer plays PUT /v1/sandboxes/{id}/secrets: it refuses a body
// without the list, answers a secret "missing" with not_found and a
// sandbox "stopped" with failed_precondition, and otherwise echoes the
// names in the sandbox.
func newGrantServer(t *testing.T) *Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/sandboxes/{id}/secrets", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey || r.Header.Get("Content-Type") != "application/json" {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "want the key and a JSON body", "")
			return
		}
		var body map[string][]string
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["secrets"] == nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "secrets: required", "secrets")
			return
		}
		if r.PathValue("id") == "stopped" {
			writeError(w, http.StatusConflict, api.CodeFailedPrecondition, "sandbox stopped is stopped", "")
			return
		}
		names := body["secrets"]
		for _, n := range names {
			if n == "missing" {
				writeError(w, http.StatusNotFound, api.CodeNotFound, "no secret missing in your team", "")
				return
			}
		}
		if len(names) == 0 {
			names = nil
		}
		writeJSON(w, http.StatusOK, api.Sandbox{ID: r.PathValue("id"), State: "running", Secrets: names, CreatedAt: t0, UpdatedAt: t0})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, testKey)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return c
}

func TestSetSecrets(t *testing.T) {
	c := newGrantServer(t)
	tests := []struct {
		name    string
		id      string
		names   []string
		want    api.Sandbox
		wantErr *Error
	}{
		{name: "grants", id: "sb-1", names: []string{"gh", "pypi"},
			want: api.Sandbox{ID: "sb-1", State: "running", Secrets: []string{"gh", "pypi"}, CreatedAt: t0, UpdatedAt: t0}},
		{name: "none sends an empty list", id: "sb-1", names: nil,
			want: api.Sandbox{ID: "sb-1", State: "running", CreatedAt: t0, UpdatedAt: t0}},
		{name: "unknown secret", id: "sb-1", names: []string{"gh", "missing"},
			wantErr: &Error{Status: 404, Code: api.CodeNotFound, Message: "no secret missing in your team"}},
		{name: "not running", id: "stopped", names: []string{"gh"},
			wantErr: &Error{Status: 409, Code: api.CodeFailedPrecondition, Message: "sandbox stopped is stopped"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.SetSecrets(t.Context(), tt.id, tt.names)
			if tt.wantErr != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("SetSecrets(%q, %q) = %v, want an *Error", tt.id, tt.names, err)
				}
				if diff := cmp.Diff(tt.wantErr, e); diff != "" {
					t.Errorf("SetSecrets(%q, %q) error differs (-want +got):\n%s", tt.id, tt.names, diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("SetSecrets(%q, %q) = %v", tt.id, tt.names, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("SetSecrets(%q, %q) differs (-want +got):\n%s", tt.id, tt.names, diff)
			}
		})
	}
	if _, err := c.SetSecrets(t.Context(), "sb-1", []string{"missing"}); !IsNotFound(err) {
		t.Errorf("SetSecrets(sb-1, missing) = %v, want IsNotFound", err)
	}
}
