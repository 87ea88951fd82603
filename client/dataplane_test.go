package client

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"space/api"
)

// TestDataPlane checks data-plane requests go to the URL a sandbox names
// with its token (never the API key), management requests to the server,
// and a refused token is replaced once, body and all.
func TestDataPlane(t *testing.T) {
	var mu sync.Mutex
	issued := 0 // tokens the server gave
	valid := "" // the one token the data plane takes
	var seen []string
	plane := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := r.Header.Get("Authorization") == "Bearer "+valid
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		if !ok {
			writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "token expired", "")
			return
		}
		if r.URL.Path == "/v1/sandboxes/sb-1/processes/7/attach" {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
		body, _ := io.ReadAll(r.Body)
		writeJSON(w, http.StatusOK, api.FileWritten{Path: r.URL.Query().Get("path"), Size: int64(len(body))})
	}))
	defer plane.Close()
	mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "bad key", "")
			return
		}
		mu.Lock()
		issued++
		tok := fmt.Sprintf("sdp1_token%d", issued)
		seen = append(seen, r.Method+" "+r.URL.Path+" (management)")
		mu.Unlock()
		writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1", State: "running",
			DataPlane: &api.DataPlane{URL: plane.URL, Token: tok, ExpiresAt: time.Now().Add(time.Hour)}})
	}))
	defer mgmt.Close()
	c, err := New(mgmt.URL, testKey)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	mu.Lock()
	valid = "sdp1_token1"
	mu.Unlock()
	// The first data-plane call learns the data plane from the sandbox.
	if _, err := c.WriteFile(t.Context(), "sb-1", "/a", strings.NewReader("hello"), WriteOptions{}); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	// The token is refused (expired early): a new one is fetched and the
	// same body sent again.
	mu.Lock()
	valid = "sdp1_token2"
	mu.Unlock()
	fw, err := c.WriteFile(t.Context(), "sb-1", "/b", strings.NewReader("world!"), WriteOptions{})
	if err != nil || fw.Size != 6 {
		t.Fatalf("WriteFile after a refused token = %+v, %v, want 6 bytes written", fw, err)
	}
	// A WebSocket dial is routed and retried the same way.
	mu.Lock()
	valid = "sdp1_token3"
	mu.Unlock()
	if _, err := c.Attach(t.Context(), "sb-1", 7, StreamIO{}); err == nil || strings.Contains(err.Error(), "401") {
		// The fake closes at once without an exit event: a cut
		// stream, not an authentication failure.
		t.Logf("Attach = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"GET /v1/sandboxes/sb-1 (management)",
		"PUT /v1/sandboxes/sb-1/files Bearer sdp1_token1",
		"PUT /v1/sandboxes/sb-1/files Bearer sdp1_token1",
		"GET /v1/sandboxes/sb-1 (management)",
		"PUT /v1/sandboxes/sb-1/files Bearer sdp1_token2",
		"GET /v1/sandboxes/sb-1/processes/7/attach Bearer sdp1_token2",
		"GET /v1/sandboxes/sb-1 (management)",
		"GET /v1/sandboxes/sb-1/processes/7/attach Bearer sdp1_token3",
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
	for _, s := range seen {
		if strings.Contains(s, testKey) {
			t.Errorf("the API key went to the data plane: %s", s)
		}
	}
}
