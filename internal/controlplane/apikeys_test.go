package controlplane

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"space/internal/errkind"
	"space/internal/store"
	"space/internal/store/sqlite"
)

// TestBootstrapKey checks that a provisioned admin key authenticates as an
// admin of the default team, is stored once however many replicas (or
// restarts) provision it, and that a bad or non-admin secret is refused
// without storing anything.
func TestBootstrapKey(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer st.Close()
	replica := func() *Server {
		s, err := New(Config{Store: st, Templates: []string{"default"}})
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		return s
	}
	a, b := replica(), replica()
	secret := "sk_provisioned_" + strings.Repeat("x", 32)

	for _, bad := range []string{"", "short", strings.Repeat("y", 31), strings.Repeat("z", 40) + " space"} {
		if err := a.BootstrapKey(t.Context(), bad); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("BootstrapKey(%q) = %v, want invalid argument", bad, err)
		}
	}
	if err := a.BootstrapKey(t.Context(), secret); err != nil {
		t.Fatalf("BootstrapKey = %v", err)
	}
	if err := b.BootstrapKey(t.Context(), secret); err != nil {
		t.Fatalf("BootstrapKey on a second replica = %v", err)
	}
	if err := a.BootstrapKey(t.Context(), secret); err != nil {
		t.Fatalf("BootstrapKey again (a restart) = %v", err)
	}
	keys, err := st.ListAPIKeys(t.Context(), DefaultTeam)
	if err != nil || len(keys) != 1 || !keys[0].Admin {
		t.Fatalf("keys after three bootstraps = %+v, %v; want one admin key", keys, err)
	}

	// The key is an admin key on every replica: it lists workers.
	for _, s := range []*Server{a, b} {
		req := httptest.NewRequest(http.MethodGet, "/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("GET /v1/workers with the provisioned key = %d %s, want 200", rec.Code, rec.Body)
		}
	}

	// The secret of a key that is not an admin's is refused.
	plain := "sk_plain_" + strings.Repeat("p", 32)
	if _, err := st.CreateAPIKey(t.Context(), store.APIKey{
		ID: store.NewID("key_"), TeamID: DefaultTeam, Name: "plain", Hash: store.HashSecret(plain),
	}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := a.BootstrapKey(t.Context(), plain); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("BootstrapKey(a non-admin key's secret) = %v, want failed precondition", err)
	}
	if keys, _ := st.ListAPIKeys(t.Context(), DefaultTeam); len(keys) != 2 {
		t.Errorf("keys = %d, want 2 (nothing stored by refused bootstraps)", len(keys))
	}
}
