package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"space/internal/store"
)

// TestSendE2B: an E2B webhook gets E2B's body and a signature its
// receivers verify as E2B documents it.
func TestSendE2B(t *testing.T) {
	got := make(chan received, 1)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- received{header: r.Header.Clone(), body: body}
	}))
	t.Cleanup(rc.Close)
	s, err := NewSender(SenderConfig{Guard: &Guard{AllowPrivate: true}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	hook := store.Webhook{ID: "whk_e", URL: rc.URL, Secret: "their-secret", Format: store.WebhookFormatE2B}
	at := time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)
	ev := Event{ID: "evt_9", Seq: 9, Type: "deleted", Time: at, SandboxID: "sbx_abc", Team: "t1"}
	if res := s.Send(t.Context(), hook, ev); !res.Delivered() {
		t.Fatalf("Send() = %+v, want delivered", res)
	}
	r := <-got
	header, body := r.header, r.body
	// E2B's documented check: base64 of SHA-256(secret + payload), "=" trimmed.
	sum := sha256.Sum256([]byte(hook.Secret + string(body)))
	want := strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if got := header.Get("e2b-signature"); got != want {
		t.Errorf("e2b-signature = %q, want %q", got, want)
	}
	if header.Get("e2b-webhook-id") != "whk_e" || header.Get("e2b-delivery-id") != "evt_9" || header.Get("e2b-signature-version") != "v1" {
		t.Errorf("headers %v, want E2B's", header)
	}
	var fields map[string]any
	if err := json.Unmarshal(body, &fields); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	for k, v := range map[string]any{"version": "v1", "id": "evt_9", "type": "sandbox.lifecycle.killed", "sandboxId": "abc",
		"sandboxTeamId": "t1", "timestamp": "2026-12-07T20:00:00Z", "eventData": nil} {
		if fields[k] != v {
			t.Errorf("body %s = %v, want %v", k, fields[k], v)
		}
	}
}
