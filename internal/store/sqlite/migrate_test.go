package sqlite

import (
	"path/filepath"
	"testing"
)

func schemaVersions(t *testing.T, s *Store) []int64 {
	t.Helper()
	rows, err := s.r.QueryContext(t.Context(), `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatalf("query schema_migrations: %v", err)
	}
	defer rows.Close()
	var vs []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatalf("scan: %v", err)
		}
		vs = append(vs, v)
	}
	return vs
}

func TestMigrations(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open() = %v", err)
	}
	if got := schemaVersions(t, s); len(got) != 1 || got[0] != 1 {
		t.Errorf("schema versions after first Open = %v, want [1]", got)
	}
	var mode string
	if err := s.r.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var sync, fk int
	if err := s.w.QueryRowContext(ctx, `SELECT * FROM pragma_synchronous, pragma_foreign_keys`).Scan(&sync, &fk); err != nil || sync != 2 || fk != 1 {
		t.Errorf("synchronous, foreign_keys = %d, %d, %v; want 2 (FULL), 1", sync, fk, err)
	}
	// A newer binary's schema is refused.
	if _, err := s.w.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_us) VALUES (99, 'future', 0)`); err != nil {
		t.Fatalf("setup: %v", err)
	}
	s.Close()
	if s, err := Open(ctx, path); err == nil {
		s.Close()
		t.Errorf("Open() with schema version 99 = nil error, want error")
	}
	if _, err := Open(ctx, "file:x.db?mode=memory"); err == nil {
		t.Errorf("Open(URI) = nil error, want error")
	}
}

func TestReopenAppliesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	for range 2 {
		s, err := Open(t.Context(), path)
		if err != nil {
			t.Fatalf("Open() = %v", err)
		}
		if got := schemaVersions(t, s); len(got) != 1 {
			t.Errorf("schema versions = %v, want [1]", got)
		}
		s.Close()
	}
}
