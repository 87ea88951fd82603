package controlplane

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"space/api"
	"space/internal/secrets"
	"space/internal/store"
	"space/internal/store/sqlite"
)

// secretServer returns a server with no workers whose secrets box is box
// (or none), its store, and a func that sends a request with an API key.
func secretServer(t *testing.T, box *secrets.Box) (store.Store, func(key, method, path, body string) (int, []byte), string) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Templates: []string{"default"}, Secrets: box})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	admin, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	h := s.Handler()
	do := func(key, method, path, body string) (int, []byte) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes()
	}
	return st, do, admin
}

// TestSecrets checks the secret routes keep values sealed and out of
// every reply, and keep teams apart.
func TestSecrets(t *testing.T) {
	box, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), "secrets.key"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	st, do, admin := secretServer(t, box)
	code, body := do(admin, "POST", "/v1/apikeys", `{"team":"other","name":"o"}`)
	var other api.APIKey
	if code != 201 || json.Unmarshal(body, &other) != nil {
		t.Fatalf("setup: create key of team other = %d %s", code, body)
	}
	adminTeam := DefaultTeam // the bootstrap key's

	value := []byte("ghp_S3cr3tValue-0123456789")
	b64 := base64.StdEncoding.EncodeToString(value)
	leaks := func(b []byte) bool { return bytes.Contains(b, value) || bytes.Contains(b, []byte(b64)) }
	create := fmt.Sprintf(`{"name":"github","value":%q,"hosts":["api.github.com","uploads.github.com"],"header":"authorization","format":"Bearer {}"}`, b64)

	code, body = do(admin, "POST", "/v1/secrets", create)
	var got api.Secret
	if code != 201 || json.Unmarshal(body, &got) != nil {
		t.Fatalf("POST /v1/secrets = %d %s, want 201", code, body)
	}
	if leaks(body) {
		t.Errorf("POST /v1/secrets reply %s holds the value", body)
	}
	want := api.Secret{Name: "github", Hosts: []string{"api.github.com", "uploads.github.com"},
		Header: "Authorization", Format: "Bearer {}", CreatedAt: got.CreatedAt}
	if diff := cmp.Diff(want, got); diff != "" || got.CreatedAt.IsZero() {
		t.Errorf("POST /v1/secrets (-want +got):\n%s", diff)
	}
	// Without a header there is no format; the value may end in a newline.
	code, body = do(admin, "POST", "/v1/secrets", fmt.Sprintf(`{"name":"api-key","value":%q,"hosts":["api.example.com"]}`,
		base64.StdEncoding.EncodeToString(append(value, '\n'))))
	if code != 201 {
		t.Fatalf("POST /v1/secrets api-key = %d %s, want 201", code, body)
	}

	// The store holds the value sealed for its team and name, not in the
	// clear.
	rec, err := st.Secret(t.Context(), adminTeam, "github")
	if err != nil {
		t.Fatalf("store Secret(github) = %v", err)
	}
	if bytes.Contains(rec.Sealed, value) || bytes.Contains(rec.Sealed, []byte(b64)) {
		t.Errorf("stored Sealed %x holds the plaintext", rec.Sealed)
	}
	if plain, err := box.Open(adminTeam, "github", rec.Sealed); err != nil || !bytes.Equal(plain, value) {
		t.Errorf("Open(stored Sealed) = %q, %v; want the value", plain, err)
	}
	if _, err := box.Open("other", "github", rec.Sealed); err == nil {
		t.Errorf("Open(stored Sealed) as team other = nil error, want an error")
	}

	code, body = do(admin, "GET", "/v1/secrets", "")
	var list api.SecretList
	if code != 200 || json.Unmarshal(body, &list) != nil {
		t.Fatalf("GET /v1/secrets = %d %s", code, body)
	}
	if leaks(body) || bytes.Contains(body, []byte(`"value"`)) {
		t.Errorf("GET /v1/secrets reply %s holds a value", body)
	}
	wantList := api.SecretList{Secrets: []api.Secret{
		{Name: "api-key", Hosts: []string{"api.example.com"}},
		want,
	}}
	if diff := cmp.Diff(wantList, list, cmpopts.IgnoreFields(api.Secret{}, "CreatedAt")); diff != "" {
		t.Errorf("GET /v1/secrets (-want +got):\n%s", diff)
	}

	code, body = do(admin, "POST", "/v1/secrets", create)
	if code != 409 || !bytes.Contains(body, []byte(`"code":"conflict"`)) || !bytes.Contains(body, []byte(`"field":"name"`)) || leaks(body) {
		t.Errorf("POST /v1/secrets again = %d %s, want 409 conflict naming the name", code, body)
	}

	// Another team sees none of it, and may use the same name.
	if code, body := do(other.Secret, "GET", "/v1/secrets", ""); code != 200 || string(body) != "{\"secrets\":[]}\n" {
		t.Errorf("GET /v1/secrets as other = %d %s, want an empty list", code, body)
	}
	if code, body := do(other.Secret, "DELETE", "/v1/secrets/github", ""); code != 404 {
		t.Errorf("DELETE another team's secret = %d %s, want 404", code, body)
	}
	if code, body := do(other.Secret, "POST", "/v1/secrets", create); code != 201 {
		t.Errorf("POST /v1/secrets github as other = %d %s, want 201", code, body)
	}
	if _, err := st.Secret(t.Context(), adminTeam, "github"); err != nil {
		t.Errorf("store Secret(github) after the other team's calls = %v", err)
	}

	if code, body := do(admin, "DELETE", "/v1/secrets/github", ""); code != 204 {
		t.Errorf("DELETE /v1/secrets/github = %d %s, want 204", code, body)
	}
	if code, body := do(admin, "DELETE", "/v1/secrets/github", ""); code != 404 {
		t.Errorf("DELETE /v1/secrets/github again = %d %s, want 404", code, body)
	}
	if code, body := do(admin, "DELETE", "/v1/secrets/bad%20name", ""); code != 404 {
		t.Errorf("DELETE /v1/secrets/bad name = %d %s, want 404", code, body)
	}
	if _, err := st.Secret(t.Context(), "other", "github"); err != nil {
		t.Errorf("store Secret(other, github) after the admin's delete = %v", err)
	}
}

func TestCreateSecretBadInput(t *testing.T) {
	box, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), "secrets.key"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	st, do, admin := secretServer(t, box)
	v := base64.StdEncoding.EncodeToString([]byte("tok"))
	tooBig := base64.StdEncoding.EncodeToString(make([]byte, 64<<10+1))
	hosts17 := `["h1.example"` + strings.Repeat(`,"h.example"`, 16) + `]`
	tests := []struct {
		name, body, field string
	}{
		{"no name", `{"value":"` + v + `","hosts":["a.example"]}`, "name"},
		{"name with slash", `{"name":"a/b","value":"` + v + `","hosts":["a.example"]}`, "name"},
		{"name too long", `{"name":"` + strings.Repeat("n", 65) + `","value":"` + v + `","hosts":["a.example"]}`, "name"},
		{"no value", `{"name":"s","hosts":["a.example"]}`, "value"},
		{"value not base64", `{"name":"s","value":"not base64!","hosts":["a.example"]}`, ""},
		{"value over 64 KiB", `{"name":"s","value":"` + tooBig + `","hosts":["a.example"]}`, "value"},
		{"no hosts", `{"name":"s","value":"` + v + `"}`, "hosts"},
		{"17 hosts", `{"name":"s","value":"` + v + `","hosts":` + hosts17 + `}`, "hosts"},
		{"wildcard host", `{"name":"s","value":"` + v + `","hosts":["*.example.com"]}`, "hosts"},
		{"upper case host", `{"name":"s","value":"` + v + `","hosts":["API.example.com"]}`, "hosts"},
		{"host with port", `{"name":"s","value":"` + v + `","hosts":["api.example.com:443"]}`, "hosts"},
		{"host with trailing dot", `{"name":"s","value":"` + v + `","hosts":["api.example.com."]}`, "hosts"},
		{"address", `{"name":"s","value":"` + v + `","hosts":["10.0.0.1"]}`, "hosts"},
		{"url", `{"name":"s","value":"` + v + `","hosts":["https://api.example.com"]}`, "hosts"},
		{"host twice", `{"name":"s","value":"` + v + `","hosts":["a.example","a.example"]}`, "hosts"},
		{"header with space", `{"name":"s","value":"` + v + `","hosts":["a.example"],"header":"X Key"}`, "header"},
		{"header with colon", `{"name":"s","value":"` + v + `","hosts":["a.example"],"header":"X-Key:"}`, "header"},
		{"host header", `{"name":"s","value":"` + v + `","hosts":["a.example"],"header":"host"}`, "header"},
		{"content-length header", `{"name":"s","value":"` + v + `","hosts":["a.example"],"header":"Content-Length"}`, "header"},
		{"format without header", `{"name":"s","value":"` + v + `","hosts":["a.example"],"format":"Bearer {}"}`, "format"},
		{"format without braces", `{"name":"s","value":"` + v + `","hosts":["a.example"],"header":"Authorization","format":"Bearer"}`, "format"},
		{"format with braces twice", `{"name":"s","value":"` + v + `","hosts":["a.example"],"header":"Authorization","format":"{}:{}"}`, "format"},
		{"format with newline", `{"name":"s","value":"` + v + `","hosts":["a.example"],"header":"Authorization","format":"{}\r\nX-Evil: 1"}`, "format"},
		{"header value with newline", `{"name":"s","value":"` + base64.StdEncoding.EncodeToString([]byte("tok\n")) + `","hosts":["a.example"],"header":"Authorization"}`, "value"},
		{"unknown field", `{"name":"s","value":"` + v + `","hosts":["a.example"],"placeholder":"x"}`, "placeholder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(admin, "POST", "/v1/secrets", tt.body)
			var e api.Error
			if code != 400 || json.Unmarshal(body, &e) != nil || e.Error.Code != api.CodeInvalidArgument || e.Error.Field != tt.field {
				t.Errorf("POST /v1/secrets %s = %d %s, want 400 invalid_argument with field %q", tt.name, code, body, tt.field)
			}
		})
	}
	if list, err := st.ListSecrets(t.Context(), DefaultTeam); err != nil || len(list) != 0 {
		t.Errorf("store ListSecrets() after bad input = %v, %v; want none", list, err)
	}
}

// TestSecretsWithoutKey checks a server without a box refuses the secret
// routes with failed_precondition.
func TestSecretsWithoutKey(t *testing.T) {
	_, do, admin := secretServer(t, nil)
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/secrets", `{"name":"s","value":"dG9r","hosts":["a.example"]}`},
		{"GET", "/v1/secrets", ""},
		{"DELETE", "/v1/secrets/s", ""},
	} {
		code, body := do(admin, r.method, r.path, r.body)
		if code != 409 || !bytes.Contains(body, []byte(`"code":"failed_precondition"`)) || !bytes.Contains(body, []byte("keeps no secrets")) {
			t.Errorf("%s %s without a key = %d %s, want 409 failed_precondition", r.method, r.path, code, body)
		}
	}
}
