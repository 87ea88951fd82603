package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"space/api"
	"space/internal/controlplane"
	"space/internal/store/sqlite"
)

// TestWebhookVerbs drives the webhook verbs against a real control
// plane (no worker: the verbs need none) whose webhooks may reach a
// receiver on loopback.
func TestWebhookVerbs(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := controlplane.New(controlplane.Config{Store: st, Templates: []string{"default"},
		Webhooks: controlplane.WebhookConfig{AllowPrivate: true}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	key, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	var pings atomic.Int32
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { pings.Add(1) }))
	t.Cleanup(rc.Close)
	env := map[string]string{"SPACE_API_URL": srv.URL, "SPACE_API_KEY": key}
	space := func(args ...string) string {
		t.Helper()
		g, stdout, stderr := newTestGlobals(t, env)
		if code := execute(t.Context(), g, args); code != 0 {
			t.Fatalf("space %v exited %d, stderr %q", args, code, stderr)
		}
		return stdout.String()
	}

	var h api.Webhook
	out := space("webhook", "create", rc.URL+"/hook", "--type", "created", "--type", "deleted", "-o", "json")
	if err := json.Unmarshal([]byte(out), &h); err != nil || !strings.HasPrefix(h.Secret, "whsec_") || len(h.Types) != 2 {
		t.Fatalf("space webhook create -o json = %q (%v), want the webhook with its secret and 2 types", out, err)
	}
	if out := space("webhook", "ls"); !strings.Contains(out, h.ID) || !strings.Contains(out, "created,deleted") || strings.Contains(out, h.Secret) {
		t.Errorf("space webhook ls = %q, want %s with its types and no secret", out, h.ID)
	}
	if out := space("webhook", "test", h.ID); !strings.Contains(out, "delivered") || pings.Load() != 1 {
		t.Errorf("space webhook test = %q (receiver got %d), want delivered once", out, pings.Load())
	}
	if out := space("webhook", "deliveries", h.ID); !strings.Contains(out, "ping") || !strings.Contains(out, "delivered") {
		t.Errorf("space webhook deliveries = %q, want the ping, delivered", out)
	}
	if out := space("webhook", "disable", h.ID); !strings.Contains(out, "false") {
		t.Errorf("space webhook disable = %q, want enabled false", out)
	}
	if out := space("webhook", "enable", h.ID); !strings.Contains(out, "true") {
		t.Errorf("space webhook enable = %q, want enabled true", out)
	}
	space("webhook", "rm", h.ID)
	if out := space("webhook", "ls"); strings.Contains(out, h.ID) {
		t.Errorf("space webhook ls after rm = %q", out)
	}

	g, _, stderr := newTestGlobals(t, env)
	if code := execute(t.Context(), g, []string{"webhook", "create", rc.URL, "--type", "exploded"}); code == 0 || !strings.Contains(stderr.String(), "exploded") {
		t.Errorf("space webhook create --type exploded = %d, stderr %q; want a failure naming the type", code, stderr)
	}
}
