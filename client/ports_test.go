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

	"space/api"
)

// TestPortHandler checks that a port's requests go to the sandbox's data
// plane with its token, under the port's path, with the caller's own
// credentials dropped, and that a refused token is replaced once.
func TestPortHandler(t *testing.T) {
	var mu sync.Mutex
	issued, valid := 0, ""
	plane := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := r.Header.Get("Authorization") == "Bearer "+valid
		mu.Unlock()
		if !ok {
			writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "token expired", "")
			return
		}
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.RequestURI())
	}))
	defer plane.Close()
	mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		issued++
		tok := fmt.Sprintf("sdp1_token%d", issued)
		if valid == "" {
			valid = tok
		}
		mu.Unlock()
		writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1", State: "running",
			DataPlane: &api.DataPlane{URL: plane.URL, Token: tok, ExpiresAt: time.Now().Add(time.Hour)}})
	}))
	defer mgmt.Close()
	c, err := New(mgmt.URL, testKey)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(c.PortHandler("sb-1", 8080))
	defer front.Close()
	get := func() (int, string) {
		req, _ := http.NewRequest("GET", front.URL+"/a/b?x=1", nil)
		req.Header.Set("Authorization", "Bearer someone-elses")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET = %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	want := "GET /v1/sandboxes/sb-1/ports/8080/http/a/b?x=1"
	if code, body := get(); code != 200 || body != want {
		t.Errorf("GET through the port handler = %d %q, want 200 %q", code, body, want)
	}
	mu.Lock()
	valid = "sdp1_token2" // the first one expired
	mu.Unlock()
	if code, body := get(); code != 200 || body != want {
		t.Errorf("GET after the token expired = %d %q, want 200 %q with a new token", code, body, want)
	}
	mu.Lock()
	valid = "none"
	mu.Unlock()
	if code, body := get(); code != http.StatusUnauthorized || !strings.Contains(body, "token expired") {
		t.Errorf("GET with every token refused = %d %q, want the data plane's 401", code, body)
	}
}
