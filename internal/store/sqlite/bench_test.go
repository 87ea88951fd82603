package sqlite_test

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"space/internal/store"
	"space/internal/store/sqlite"
)

// BenchmarkCreateSandbox measures one durable (fsynced) write.
func BenchmarkCreateSandbox(b *testing.B) {
	s, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "state.db"))
	if err != nil {
		b.Fatalf("setup: %v", err)
	}
	defer s.Close()
	if _, err := s.CreateTeam(b.Context(), store.Team{ID: "t1"}); err != nil {
		b.Fatalf("setup: %v", err)
	}
	for b.Loop() {
		if _, err := s.CreateSandbox(b.Context(), store.Sandbox{ID: store.NewSandboxID(), TeamID: "t1",
			Template: "base", State: store.StateCreating, Spec: json.RawMessage(`{}`)}); err != nil {
			b.Fatal(err)
		}
	}
}
