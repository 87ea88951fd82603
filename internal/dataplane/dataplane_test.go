package dataplane

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"space/internal/errkind"
	"space/internal/httpapi"
)

func TestToken(t *testing.T) {
	s, err := NewSealer("cluster secret")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	g := Grant{Sandbox: "sbx_aaaaaaaaaaaaaaaaaaaa", Team: "t", Worker: "worker.one", Address: "https://10.0.0.5:7071", Expires: now.Add(time.Minute)}
	tok, err := s.Seal(g)
	if err != nil || !strings.HasPrefix(tok, TokenPrefix) {
		t.Fatalf("Seal = %q, %v", tok, err)
	}
	// '.' is not in the token's alphabet: only the plain text could show it.
	if strings.Contains(tok, "10.0.0.5") || strings.Contains(tok, "worker.one") {
		t.Errorf("token %q shows what it holds", tok)
	}
	got, err := s.Open(tok, now)
	if err != nil || got != g {
		t.Errorf("Open = %+v, %v, want %+v", got, err, g)
	}
	if _, err := s.Open(tok, now.Add(time.Minute)); !errors.Is(err, ErrExpired) || !errors.Is(err, httpapi.ErrUnauthenticated) {
		t.Errorf("Open(at expiry) = %v, want ErrExpired", err)
	}
	other, _ := NewSealer("another cluster")
	if _, err := other.Open(tok, now); !errors.Is(err, ErrBadToken) {
		t.Errorf("Open(other cluster) = %v, want ErrBadToken", err)
	}
	// Every altered byte is refused.
	for i := len(TokenPrefix); i < len(tok); i++ {
		c := byte('A')
		if tok[i] == 'A' {
			c = 'B'
		}
		bad := tok[:i] + string(c) + tok[i+1:]
		if _, err := s.Open(bad, now); err == nil {
			t.Fatalf("Open(token altered at %d) = nil error", i)
		}
	}
	for _, bad := range []string{"", "sk_abc", TokenPrefix, TokenPrefix + "!!!", TokenPrefix + strings.Repeat("A", 4000)} {
		if _, err := s.Open(bad, now); !errors.Is(err, ErrBadToken) {
			t.Errorf("Open(%.20q) = %v, want ErrBadToken", bad, err)
		}
	}
	if _, err := s.Seal(Grant{Sandbox: "sbx_x"}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Seal(no worker, no expiry) = %v, want InvalidArgument", err)
	}
	if _, err := NewSealer(""); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("NewSealer(\"\") = %v, want InvalidArgument", err)
	}
}

// workersFunc adapts a function to Workers.
type workersFunc func(Grant) (http.Handler, error)

func (f workersFunc) Forward(g Grant) (http.Handler, error) { return f(g) }

func TestHandler(t *testing.T) {
	s, _ := NewSealer("cluster secret")
	now := time.Now()
	var forwarded []Grant
	worker := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s auth=%q", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"))
	})
	h, err := NewHandler(Config{Sealer: s, WorkerPrefix: "/worker/v1", Now: func() time.Time { return now },
		Workers: workersFunc(func(g Grant) (http.Handler, error) {
			forwarded = append(forwarded, g)
			if g.Worker == "gone" {
				return nil, fmt.Errorf("worker gone: %w", errkind.Unavailable)
			}
			return worker, nil
		})})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	id := "sbx_aaaaaaaaaaaaaaaaaaaa"
	tok := func(sbx, wk string, exp time.Time) string {
		v, err := s.Seal(Grant{Sandbox: sbx, Worker: wk, Expires: exp})
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		return v
	}
	good := tok(id, "w-1", now.Add(time.Minute))
	tests := []struct {
		name, method, path, token string
		code                      int
		body                      string
	}{
		{"Exec", "POST", "/v1/sandboxes/" + id + "/exec", good, 200, `POST /worker/v1/sandboxes/` + id + `/exec auth=""`},
		{"FileWithQuery", "GET", "/v1/sandboxes/" + id + "/files?path=/etc/hosts", good, 200, `GET /worker/v1/sandboxes/` + id + `/files?path=/etc/hosts auth=""`},
		{"ExposedPort", "PATCH", "/v1/sandboxes/" + id + "/ports/8080/http/a/b", good, 200, `PATCH /worker/v1/sandboxes/` + id + `/ports/8080/http/a/b`},
		{"NoToken", "POST", "/v1/sandboxes/" + id + "/exec", "", 401, "missing data-plane token"},
		{"APIKeyIsNoToken", "POST", "/v1/sandboxes/" + id + "/exec", "sk_abc", 401, "not a data-plane token"},
		{"Expired", "POST", "/v1/sandboxes/" + id + "/exec", tok(id, "w-1", now), 401, "expired"},
		{"OtherSandbox", "POST", "/v1/sandboxes/sbx_bbbbbbbbbbbbbbbbbbbb/exec", good, 404, "not_found"},
		{"ManagementRouteIsNotDataPlane", "DELETE", "/v1/sandboxes/" + id, good, 404, "no data-plane route"},
		{"SnapshotIsNotDataPlane", "POST", "/v1/sandboxes/" + id + "/snapshots", good, 404, "no data-plane route"},
		{"WorkerUnreachable", "POST", "/v1/sandboxes/" + id + "/exec", tok(id, "gone", now.Add(time.Minute)), 503, "worker gone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, tt.path, strings.NewReader("{}"))
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body, _ := io.ReadAll(rec.Body)
			if rec.Code != tt.code || !strings.Contains(string(body), tt.body) {
				t.Errorf("%s %s = %d %s, want %d containing %q", tt.method, tt.path, rec.Code, body, tt.code, tt.body)
			}
		})
	}
	if len(forwarded) != 4 {
		t.Errorf("forwarded %d requests, want 4 (3 served, 1 to an unreachable worker)", len(forwarded))
	}
}
