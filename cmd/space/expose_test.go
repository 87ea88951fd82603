package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestSandboxExpose checks the URL expose prints, and that --listen
// serves it locally with the API key added (against a fake API).
func TestSandboxExpose(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-test" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		io.WriteString(w, r.Method+" "+r.URL.Path)
	}))
	defer srv.Close()
	env := map[string]string{"SPACE_API_URL": srv.URL, "SPACE_API_KEY": "sk-test"}

	g, stdout, _ := newTestGlobals(t, env)
	if _, err := run(t.Context(), g, []string{"sandbox", "expose", "sb-1", "8080"}); err != nil {
		t.Fatal(err)
	}
	if want := srv.URL + "/v1/sandboxes/sb-1/ports/8080/http/\n"; stdout.String() != want {
		t.Errorf("expose printed %q, want %q", stdout.String(), want)
	}
	g, _, _ = newTestGlobals(t, env)
	if _, err := run(t.Context(), g, []string{"sandbox", "expose", "sb-1", "0"}); err == nil {
		t.Errorf("expose of port 0 succeeded")
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	g, _, _ = newTestGlobals(t, env)
	go func() {
		_, err := run(ctx, g, []string{"sandbox", "expose", "sb-1", "8080", "--listen", addr})
		done <- err
	}()
	var body string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Post("http://"+addr+"/a/b?x=1", "text/plain", strings.NewReader("hi"))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
	}
	if body != "POST /v1/sandboxes/sb-1/ports/8080/http/a/b" {
		t.Errorf("through --listen: %q", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("expose --listen ended with %v", err)
	}
}
