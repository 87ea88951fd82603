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
