package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

// secretAPI plays the secret routes. Create answers a taken name
// ("taken") with a conflict and otherwise echoes the secret without its
// value; list answers secretList; delete records the name, and answers
// "nosuch" with not found.
type secretAPI struct {
	url string

	mu sync.Mutex
	// +checklocks:mu
	create *api.CreateSecret // the last create's body, or nil
	// +checklocks:mu
	deleted []string
	// +checklocks:mu
	grants *api.SecretGrants // the last PUT .../secrets body, or nil
}

var secretList = []api.Secret{
	{Name: "github", Hosts: []string{"api.github.com", "uploads.github.com"}, Header: "Authorization", Format: "Bearer {}", CreatedAt: t0},
	{Name: "pypi", Hosts: []string{"upload.pypi.org"}, CreatedAt: t0},
}

func newSecretAPI(t *testing.T) *secretAPI {
	t.Helper()
	f := &secretAPI{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/secrets", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSecret
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: api.ErrorBody{Code: api.CodeInvalidArgument, Message: err.Error()}})
			return
		}
		f.mu.Lock()
		f.create = &req
		f.mu.Unlock()
		if req.Name == "taken" {
			writeJSON(w, http.StatusConflict, api.Error{Error: api.ErrorBody{Code: api.CodeConflict,
				Message: "your team has a secret taken already (delete it first to replace it)", Field: "name"}})
			return
		}
		format := req.Format
		if req.Header != "" && format == "" {
			format = "{}"
		}
		writeJSON(w, http.StatusCreated, api.Secret{Name: req.Name, Hosts: req.Hosts, Header: req.Header, Format: format, CreatedAt: t0})
	})
	mux.HandleFunc("GET /v1/secrets", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.SecretList{Secrets: secretList})
	})
	mux.HandleFunc("DELETE /v1/secrets/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") == "nosuch" {
			writeJSON(w, http.StatusNotFound, api.Error{Error: api.ErrorBody{Code: api.CodeNotFound, Message: "secret nosuch: not found"}})
			return
		}
		f.mu.Lock()
		f.deleted = append(f.deleted, r.PathValue("name"))
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/secrets", func(w http.ResponseWriter, r *http.Request) {
		var req api.SecretGrants
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Secrets == nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: api.ErrorBody{Code: api.CodeInvalidArgument, Message: "secrets: required", Field: "secrets"}})
			return
		}
		f.mu.Lock()
		f.grants = &req
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, api.Sandbox{ID: r.PathValue("id"), Team: "t", State: "running", Template: "default",
			VCPUs: 1, MemoryMiB: 512, DiskMiB: 4096, CreatedAt: t0, UpdatedAt: t0,
			Network: &api.Network{Allow: []string{"upload.pypi.org:443"}}, Secrets: req.Secrets})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *secretAPI) env() map[string]string {
	return map[string]string{"SPACE_API_URL": f.url, "SPACE_API_KEY": "sk-test"}
}

// lastCreate returns the last create's body, or nil.
func (f *secretAPI) lastCreate() *api.CreateSecret {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.create
}

func writeValueFile(t *testing.T, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(p, []byte(value), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return p
}

func TestSecretCreate(t *testing.T) {
	f := newSecretAPI(t)
	file := writeValueFile(t, "ghp_token\x00bytes")
	tests := []struct {
		name  string
		args  []string
		stdin string
		want  api.CreateSecret
		out   string
	}{
		{
			name: "file, header and format",
			args: []string{"secret", "create", "github", "--value-file", file, "--host", "api.github.com",
				"--host", "uploads.github.com", "--header", "Authorization", "--format", "Bearer {}"},
			want: api.CreateSecret{Name: "github", Value: []byte("ghp_token\x00bytes"), Hosts: []string{"api.github.com", "uploads.github.com"},
				Header: "Authorization", Format: "Bearer {}"},
			out: "name     github\nhosts    api.github.com, uploads.github.com\nheader   Authorization: Bearer {}\ncreated  1h ago\n",
		},
		{
			name:  "stdin",
			args:  []string{"secret", "create", "pypi", "--value-file", "-", "--host", "upload.pypi.org"},
			stdin: "pypi-token\n", // sent byte for byte
			want:  api.CreateSecret{Name: "pypi", Value: []byte("pypi-token\n"), Hosts: []string{"upload.pypi.org"}},
			out:   "name     pypi\nhosts    upload.pypi.org\ncreated  1h ago\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, stdout, stderr := newTestGlobals(t, f.env())
			g.stdin = strings.NewReader(tt.stdin)
			g.now = func() time.Time { return t0.Add(time.Hour) }
			if code := execute(t.Context(), g, tt.args); code != 0 {
				t.Fatalf("space %v exited %d, stderr %q", tt.args, code, stderr)
			}
			got := f.lastCreate()
			if got == nil {
				t.Fatalf("space %v sent no create", tt.args)
			}
			if diff := cmp.Diff(tt.want, *got); diff != "" {
				t.Errorf("space %v sent (-want +got):\n%s", tt.args, diff)
			}
			if diff := cmp.Diff(tt.out, stdout.String()); diff != "" {
				t.Errorf("space %v stdout (-want +got):\n%s", tt.args, diff)
			}
			if strings.Contains(stdout.String()+stderr.String(), string(tt.want.Value)) {
				t.Errorf("space %v printed the value", tt.args)
			}
		})
	}

	// -o json prints the server's description.
	g, stdout, stderr := newTestGlobals(t, f.env())
	args := []string{"secret", "create", "k", "--value-file", file, "--host", "a.example", "--header", "X-Api-Key", "-o", "json"}
	if code := execute(t.Context(), g, args); code != 0 {
		t.Fatalf("space %v exited %d, stderr %q", args, code, stderr)
	}
	var sc api.Secret
	if err := json.Unmarshal(stdout.Bytes(), &sc); err != nil {
		t.Fatalf("space %v stdout %q: %v", args, stdout, err)
	}
	want := api.Secret{Name: "k", Hosts: []string{"a.example"}, Header: "X-Api-Key", Format: "{}", CreatedAt: t0}
	if diff := cmp.Diff(want, sc); diff != "" {
		t.Errorf("space %v (-want +got):\n%s", args, diff)
	}
}

func TestSecretCreateFails(t *testing.T) {
	f := newSecretAPI(t)
	file := writeValueFile(t, "token")
	empty := writeValueFile(t, "")
	big := writeValueFile(t, strings.Repeat("x", 64<<10+1))
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr string
	}{
		{"no value file", []string{"secret", "create", "s", "--host", "a.example"}, exitUsage, `"value-file" not set`},
		{"value flag", []string{"secret", "create", "s", "--value", "token", "--host", "a.example"}, exitUsage, "unknown flag: --value"},
		{"no host", []string{"secret", "create", "s", "--value-file", file}, exitUsage, "--host is required"},
		{"format without header", []string{"secret", "create", "s", "--value-file", file, "--host", "a.example", "--format", "Bearer {}"},
			exitUsage, "--format needs --header"},
		{"no name", []string{"secret", "create", "--value-file", file, "--host", "a.example"}, exitUsage, "accepts 1 arg"},
		{"missing file", []string{"secret", "create", "s", "--value-file", file + ".nosuch", "--host", "a.example"},
			exitFailure, "no such file"},
		{"empty file", []string{"secret", "create", "s", "--value-file", empty, "--host", "a.example"}, exitFailure, "is empty"},
		{"file over 64 KiB", []string{"secret", "create", "s", "--value-file", big, "--host", "a.example"}, exitFailure, "larger than 64 KiB"},
		{"empty stdin", []string{"secret", "create", "s", "--value-file", "-", "--host", "a.example"}, exitFailure, "the value from stdin is empty"},
		{"taken name", []string{"secret", "create", "taken", "--value-file", file, "--host", "a.example"},
			exitFailure, "name: your team has a secret taken already"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, stdout, stderr := newTestGlobals(t, f.env())
			if code := execute(t.Context(), g, tt.args); code != tt.code || !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("space %v = exit %d, stderr %q; want exit %d and %q", tt.args, code, stderr, tt.code, tt.wantErr)
			}
			if stdout.Len() != 0 {
				t.Errorf("space %v stdout = %q, want nothing", tt.args, stdout)
			}
		})
	}
}

func TestSecretList(t *testing.T) {
	f := newSecretAPI(t)
	g, stdout, stderr := newTestGlobals(t, f.env())
	g.now = func() time.Time { return t0.Add(2 * time.Hour) }
	if code := execute(t.Context(), g, []string{"secret", "ls"}); code != 0 {
		t.Fatalf("secret ls exited %d, stderr %q", code, stderr)
	}
	want := "NAME    HOSTS                              HEADER                    CREATED\n" +
		"github  api.github.com,uploads.github.com  Authorization: Bearer {}  2h ago\n" +
		"pypi    upload.pypi.org                                              2h ago\n"
	if diff := cmp.Diff(want, stdout.String()); diff != "" {
		t.Errorf("secret ls (-want +got):\n%s", diff)
	}

	g, stdout, stderr = newTestGlobals(t, f.env())
	if code := execute(t.Context(), g, []string{"secret", "ls", "-o", "json"}); code != 0 {
		t.Fatalf("secret ls -o json exited %d, stderr %q", code, stderr)
	}
	var l api.SecretList
	if err := json.Unmarshal(stdout.Bytes(), &l); err != nil {
		t.Fatalf("secret ls -o json = %q: %v", stdout, err)
	}
	if diff := cmp.Diff(api.SecretList{Secrets: secretList}, l); diff != "" {
		t.Errorf("secret ls -o json (-want +got):\n%s", diff)
	}
}

func TestSecretRemove(t *testing.T) {
	f := newSecretAPI(t)
	g, _, stderr := newTestGlobals(t, f.env())
	if code := execute(t.Context(), g, []string{"secret", "rm", "github", "pypi"}); code != 0 {
		t.Fatalf("secret rm exited %d, stderr %q", code, stderr)
	}
	f.mu.Lock()
	deleted := f.deleted
	f.mu.Unlock()
	if diff := cmp.Diff([]string{"github", "pypi"}, deleted); diff != "" {
		t.Errorf("secret rm deleted (-want +got):\n%s", diff)
	}
	g, _, stderr = newTestGlobals(t, f.env())
	if code := execute(t.Context(), g, []string{"secret", "rm", "nosuch"}); code != exitFailure || !strings.Contains(stderr.String(), "rm nosuch: ") ||
		!strings.Contains(stderr.String(), "not found") {
		t.Errorf("secret rm nosuch = exit %d, stderr %q; want %d and not found", code, stderr, exitFailure)
	}
}

func TestSandboxSecrets(t *testing.T) {
	f := newSecretAPI(t)
	tests := []struct {
		args []string
		want []string
		out  string // a line the output holds
	}{
		{[]string{"sandbox", "secrets", "sb-1", "github", "pypi"}, []string{"github", "pypi"}, "secrets   github, pypi\n"},
		{[]string{"sandbox", "secrets", "sb-1", "--none"}, []string{}, "network   allow upload.pypi.org:443\n"},
	}
	for _, tt := range tests {
		g, stdout, stderr := newTestGlobals(t, f.env())
		if code := execute(t.Context(), g, tt.args); code != 0 {
			t.Fatalf("execute(%q) = %d, stderr %q", tt.args, code, stderr)
		}
		f.mu.Lock()
		got := f.grants
		f.grants = nil
		f.mu.Unlock()
		if got == nil {
			t.Fatalf("execute(%q) sent no PUT .../secrets", tt.args)
		}
		if diff := cmp.Diff(tt.want, got.Secrets); diff != "" {
			t.Errorf("execute(%q) sent grants differing (-want +got):\n%s", tt.args, diff)
		}
		if !strings.Contains(stdout.String(), tt.out) {
			t.Errorf("execute(%q) printed %q, want a line %q", tt.args, stdout, tt.out)
		}
	}
	for _, args := range [][]string{
		{"sandbox", "secrets"},
		{"sandbox", "secrets", "sb-1"},
		{"sandbox", "secrets", "sb-1", "github", "--none"},
	} {
		g, _, stderr := newTestGlobals(t, f.env())
		if code := execute(t.Context(), g, args); code != exitUsage {
			t.Errorf("execute(%q) = %d (stderr %q), want usage error %d", args, code, stderr, exitUsage)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.grants != nil {
		t.Errorf("a usage error sent %+v", f.grants)
	}
}
