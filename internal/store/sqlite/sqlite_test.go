package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"space/internal/errkind"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) string { return filepath.Join(t.TempDir(), "state.db") },
		Open: func(ctx context.Context, path string) (store.Store, error) {
			return sqlite.Open(ctx, path)
		},
		Exec: func(ctx context.Context, path, query string) error {
			// Not through Open: its lock keeps a second store off the file,
			// not a second connection.
			db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
			if err != nil {
				return err
			}
			defer db.Close()
			_, err = db.ExecContext(ctx, query)
			return err
		},
	})
}

func TestSecondOpenRefused(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("Open() = %v", err)
	}
	// Another Open, even in this process, is another control plane.
	s2, err := sqlite.Open(ctx, path)
	if err == nil {
		s2.Close()
		t.Fatalf("second Open() = nil error, want the store in use")
	}
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "in use by another control plane") {
		t.Errorf("second Open() = %v, want failed precondition: in use by another control plane", err)
	}
	if _, err := s.CreateTeam(ctx, store.Team{ID: "t1"}); err != nil {
		t.Errorf("CreateTeam() after refused second Open = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	// Closed, the file is free again.
	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("Open() after Close = %v", err)
	}
	defer s.Close()
	if _, err := s.Team(ctx, "t1"); err != nil {
		t.Errorf("Team(t1) after reopen = %v", err)
	}
}
