package worker

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"space/internal/errkind"
	"space/internal/sandbox"
	"space/internal/secrets"
)

// TestSetSecretsRefused checks what SetSecrets refuses before it touches
// a sandbox, and that a refusal leaves the record as it was.
func TestSetSecretsRefused(t *testing.T) {
	box, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), "key"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	w, err := New(Config{ID: "unit", DataDir: t.TempDir(), RunRoot: t.TempDir(), Driver: neverBoots{}, Templates: noTemplates{}, Secrets: box})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	add := func(id string, rec record) {
		s := &sbx{dir: t.TempDir()}
		rec.ID = id
		s.mu.Lock()
		s.rec = rec
		s.mu.Unlock()
		w.mu.Lock()
		w.sandboxes[id] = s
		w.mu.Unlock()
	}
	nonic, paused := sandboxID(0), sandboxID(1)
	add(nonic, record{State: sandbox.Running})
	add(paused, record{State: sandbox.Paused, Spec: Spec{Network: &Network{}}, Net: &netAddrs{Block: 1}})
	grant := SecretGrant{Name: "gh", Placeholder: "SPACE_SECRET_0123456789ABCDEF0123", Hosts: []string{"api.github.com"}}
	values := map[string][]byte{"gh": []byte("tok")}
	tests := []struct {
		name string
		id   string
		req  SecretsRequest
		want error
		msg  string // in the error
	}{
		{"bad rule", paused, SecretsRequest{Network: Network{Allow: []string{"http://x"}}}, errkind.InvalidArgument, ""},
		{"bad placeholder", paused, SecretsRequest{Secrets: []SecretGrant{{Name: "gh", Placeholder: "x", Hosts: grant.Hosts}}, SecretValues: values}, errkind.InvalidArgument, ""},
		{"granted twice", paused, SecretsRequest{Secrets: []SecretGrant{grant, grant}, SecretValues: values}, errkind.InvalidArgument, ""},
		{"no value", paused, SecretsRequest{Secrets: []SecretGrant{grant}}, errkind.InvalidArgument, ""},
		{"no such sandbox", sandboxID(2), SecretsRequest{}, errkind.NotFound, ""},
		{"no network", nonic, SecretsRequest{Secrets: []SecretGrant{grant}, SecretValues: values}, errkind.FailedPrecondition, "no network interface"},
		{"not running", paused, SecretsRequest{Secrets: []SecretGrant{grant}, SecretValues: values}, ErrNotRunning, "is paused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := w.SetSecrets(t.Context(), tt.id, tt.req); !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("SetSecrets(%s, %+v) = %v, want %v saying %q", tt.name, tt.req, err, tt.want, tt.msg)
			}
			if inf, err := w.Sandbox(t.Context(), tt.id); err == nil && len(inf.Spec.Secrets) != 0 {
				t.Errorf("SetSecrets(%s) left grants %+v", tt.name, inf.Spec.Secrets)
			}
		})
	}
}
