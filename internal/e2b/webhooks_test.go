package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"space/internal/controlplane"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/testenv"
)

// TestWebhooks drives E2B's /events/webhooks against a real control
// plane: a webhook made there is SPACE's of format e2b, and it receives
// an event with E2B's body and a signature made as E2B documents it.
func TestWebhooks(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	cp, err := controlplane.New(controlplane.Config{Store: st, Templates: []string{"default"}, Webhooks: controlplane.WebhookConfig{
		AllowPrivate: true, Poll: 10 * time.Millisecond, FirstBackoff: 10 * time.Millisecond}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	key, err := cp.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	api := httptest.NewServer(cp.Handler())
	t.Cleanup(api.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, 10*time.Second, cp.Leading)

	var (
		mu   sync.Mutex
		got  []http.Header
		body [][]byte
	)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got, body = append(got, r.Header.Clone()), append(body, b)
	}))
	t.Cleanup(rc.Close)

	s, err := New(Config{API: api.URL, Sandboxes: noSandboxes{}, Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	call := func(method, path, reqBody string) (int, []byte) {
		r := httptest.NewRequest(method, path, strings.NewReader(reqBody))
		r.Header.Set("X-API-KEY", key)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Code, w.Body.Bytes()
	}

	if code, b := call("POST", "/events/webhooks", `{"name":"n","url":"`+rc.URL+`","enabled":true,"events":["sandbox.lifecycle.updated"],"signatureSecret":"0123456789abcdef"}`); code != 400 || !strings.Contains(string(b), "sandbox.lifecycle.updated") {
		t.Errorf("create with an event SPACE does not send = %d %s, want 400 naming it", code, b)
	}
	code, b := call("POST", "/events/webhooks", `{"name":"ci","url":"`+rc.URL+`","enabled":true,"events":["sandbox.lifecycle.created","sandbox.lifecycle.killed"],"signatureSecret":"their-secret-0123"}`)
	var hook e2bWebhook
	if code != 201 || json.Unmarshal(b, &hook) != nil || hook.Name != "ci" || !hook.Enabled || len(hook.Events) != 2 {
		t.Fatalf("POST /events/webhooks = %d %s", code, b)
	}
	if code, b := call("GET", "/events/webhooks", ""); code != 200 || !strings.Contains(string(b), hook.ID) {
		t.Errorf("GET /events/webhooks = %d %s, want it listed", code, b)
	}
	if code, b := call("PATCH", "/events/webhooks/"+hook.ID, `{"events":["sandbox.lifecycle.created"]}`); code != 200 || !strings.Contains(string(b), `"events":["sandbox.lifecycle.created"]`) {
		t.Errorf("PATCH = %d %s", code, b)
	}

	sbx := store.NewSandboxID()
	if _, err := st.AppendEvent(t.Context(), store.Event{Type: "created", TeamID: controlplane.DefaultTeam, SandboxID: sbx}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 })
	mu.Lock()
	header, payload := got[0], body[0]
	mu.Unlock()
	sum := sha256.Sum256([]byte("their-secret-0123" + string(payload)))
	if want := strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="); header.Get("e2b-signature") != want {
		t.Errorf("e2b-signature = %q, want %q", header.Get("e2b-signature"), want)
	}
	var ev map[string]any
	if err := json.Unmarshal(payload, &ev); err != nil || ev["type"] != "sandbox.lifecycle.created" || ev["sandboxId"] != strings.TrimPrefix(sbx, "sbx_") {
		t.Errorf("delivered %s, want E2B's created event of %s", payload, sbx)
	}

	if code, _ := call("DELETE", "/events/webhooks/"+hook.ID, ""); code != 200 {
		t.Errorf("DELETE = %d, want 200", code)
	}
	if code, _ := call("GET", "/events/webhooks/"+hook.ID, ""); code != 404 {
		t.Errorf("GET after DELETE = %d, want 404", code)
	}
}
