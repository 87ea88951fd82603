package postgres

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"space/internal/store"
	"space/internal/store/migrate"
	"space/internal/testenv/pgtest"
)

// TestUpgradeAddsTeamQuota opens a database written at schema version 1
// (before teams had a quota) and expects Open to upgrade it in place.
func TestUpgradeAddsTeamQuota(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Start(t)
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, dsn, ms[:1])
	if err != nil {
		t.Fatalf("setup: open at version 1: %v", err)
	}
	created := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := old.pool.Exec(ctx, `INSERT INTO teams (id, name, created) VALUES ('t1', 'old', $1)`, created); err != nil {
		t.Fatalf("setup: insert team: %v", err)
	}
	old.Close()

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open() of a version 1 database = %v", err)
	}
	defer s.Close()
	rows, err := s.pool.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatalf("query schema_migrations: %v", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("query schema_migrations: %v", err)
	}
	if diff := cmp.Diff([]int64{1, 2}, versions); diff != "" {
		t.Errorf("schema versions after upgrade (-want +got):\n%s", diff)
	}
	want := store.Team{ID: "t1", Name: "old", Created: created}
	got, err := s.Team(ctx, "t1")
	if err != nil {
		t.Fatalf("Team(t1) after upgrade = %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Team(t1) after upgrade (-want +got):\n%s", diff)
	}
	want.Quota = json.RawMessage(`{"vcpus":2}`)
	if got, err := s.SetTeamQuota(ctx, "t1", want.Quota); err != nil {
		t.Errorf("SetTeamQuota(t1) after upgrade = %v", err)
	} else if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SetTeamQuota(t1) after upgrade (-want +got):\n%s", diff)
	}
}
