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

func schemaVersions(t *testing.T, s *Store) []int64 {
	t.Helper()
	rows, err := s.pool.Query(t.Context(), `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatalf("query schema_migrations: %v", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("query schema_migrations: %v", err)
	}
	return versions
}

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
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
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

// TestUpgradeAddsSnapshots opens a database written at schema version 2
// (before snapshots) and expects Open to upgrade it in place.
func TestUpgradeAddsSnapshots(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Start(t)
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, dsn, ms[:2])
	if err != nil {
		t.Fatalf("setup: open at version 2: %v", err)
	}
	team, err := old.CreateTeam(ctx, store.Team{ID: "t1", Name: "old", Quota: json.RawMessage(`{"vcpus":2}`)})
	if err != nil {
		t.Fatalf("setup: CreateTeam: %v", err)
	}
	// The sandbox goes in by hand: CreateSandbox writes the newest schema.
	sb := store.Sandbox{ID: store.NewSandboxID(), TeamID: "t1", Template: "base", State: store.StateRunning,
		Spec: json.RawMessage(`{"vcpus":2,"memory_mib":512}`), Created: time.UnixMicro(2000000).UTC(), Updated: time.UnixMicro(2000000).UTC(),
		Version: 1, VCPUs: 2, MemoryMiB: 512} // the quota columns, backfilled from the spec
	if _, err := old.pool.Exec(ctx, `INSERT INTO sandboxes (id, team_id, template, state, worker_id, spec, labels, created, updated, version)
		VALUES ($1, 't1', 'base', 'running', '', $2, '{}', $3, $3, 1)`, sb.ID, []byte(sb.Spec), sb.Created); err != nil {
		t.Fatalf("setup: insert sandbox: %v", err)
	}
	old.Close()

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open() of a version 2 database = %v", err)
	}
	defer s.Close()
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
		t.Errorf("schema versions after upgrade (-want +got):\n%s", diff)
	}
	if got, err := s.Team(ctx, "t1"); err != nil {
		t.Errorf("Team(t1) after upgrade = %v", err)
	} else if diff := cmp.Diff(team, got); diff != "" {
		t.Errorf("Team(t1) after upgrade (-want +got):\n%s", diff)
	}
	if got, err := s.Sandbox(ctx, "t1", sb.ID); err != nil {
		t.Errorf("Sandbox(%s) after upgrade = %v", sb.ID, err)
	} else if diff := cmp.Diff(sb, got); diff != "" {
		t.Errorf("Sandbox(%s) after upgrade (-want +got):\n%s", sb.ID, diff)
	}
	sn, err := s.CreateSnapshot(ctx, store.Snapshot{ID: store.NewSnapshotID(), TeamID: "t1", SandboxID: sb.ID,
		Name: "first", State: store.SnapshotCreating})
	if err != nil {
		t.Fatalf("CreateSnapshot() after upgrade = %v", err)
	}
	if got, err := s.ListSnapshots(ctx, "t1", sb.ID); err != nil {
		t.Errorf("ListSnapshots(t1, %s) after upgrade = %v", sb.ID, err)
	} else if diff := cmp.Diff([]store.Snapshot{sn}, got); diff != "" {
		t.Errorf("ListSnapshots(t1, %s) after upgrade (-want +got):\n%s", sb.ID, diff)
	}
}

// TestUpgradeAddsTemplates opens a database written at schema version 3
// (before templates) and expects Open to upgrade it in place.
func TestUpgradeAddsTemplates(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Start(t)
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, dsn, ms[:3])
	if err != nil {
		t.Fatalf("setup: open at version 3: %v", err)
	}
	if _, err := old.CreateTeam(ctx, store.Team{ID: "t1", Name: "old"}); err != nil {
		t.Fatalf("setup: CreateTeam: %v", err)
	}
	sn, err := old.CreateSnapshot(ctx, store.Snapshot{ID: store.NewSnapshotID(), TeamID: "t1", SandboxID: store.NewSandboxID(),
		Name: "warm", State: store.SnapshotReady, Manifest: "m1"})
	if err != nil {
		t.Fatalf("setup: CreateSnapshot: %v", err)
	}
	old.Close()

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open() of a version 3 database = %v", err)
	}
	defer s.Close()
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
		t.Errorf("schema versions after upgrade (-want +got):\n%s", diff)
	}
	if got, err := s.Snapshot(ctx, "t1", sn.ID); err != nil {
		t.Errorf("Snapshot(%s) after upgrade = %v", sn.ID, err)
	} else if diff := cmp.Diff(sn, got); diff != "" {
		t.Errorf("Snapshot(%s) after upgrade (-want +got):\n%s", sn.ID, diff)
	}
	tm, err := s.CreateTemplate(ctx, store.Template{TeamID: "t1", Name: "base", State: store.TemplateReady, SnapshotID: sn.ID})
	if err != nil {
		t.Fatalf("CreateTemplate() after upgrade = %v", err)
	}
	if got, err := s.Template(ctx, "t1", "base", 0); err != nil {
		t.Errorf("Template(base, 0) after upgrade = %v", err)
	} else if diff := cmp.Diff(tm, got); diff != "" {
		t.Errorf("Template(base, 0) after upgrade (-want +got):\n%s", diff)
	}
	if used, err := s.SnapshotInUse(ctx, "t1", sn.ID); err != nil || !used {
		t.Errorf("SnapshotInUse(t1, %s) after upgrade = %t, %v; want true", sn.ID, used, err)
	}
}

// TestUpgradeAddsSecrets opens a database written at schema version 4
// (before secrets) and expects Open to upgrade it in place.
func TestUpgradeAddsSecrets(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Start(t)
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, dsn, ms[:4])
	if err != nil {
		t.Fatalf("setup: open at version 4: %v", err)
	}
	if _, err := old.CreateTeam(ctx, store.Team{ID: "t1", Name: "old"}); err != nil {
		t.Fatalf("setup: CreateTeam: %v", err)
	}
	tm, err := old.CreateTemplate(ctx, store.Template{TeamID: "t1", Name: "base", State: store.TemplateBuilding})
	if err != nil {
		t.Fatalf("setup: CreateTemplate: %v", err)
	}
	old.Close()

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open() of a version 4 database = %v", err)
	}
	defer s.Close()
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
		t.Errorf("schema versions after upgrade (-want +got):\n%s", diff)
	}
	if got, err := s.Template(ctx, "t1", "base", 1); err != nil {
		t.Errorf("Template(base, 1) after upgrade = %v", err)
	} else if diff := cmp.Diff(tm, got); diff != "" {
		t.Errorf("Template(base, 1) after upgrade (-want +got):\n%s", diff)
	}
	sc, err := s.CreateSecret(ctx, store.Secret{TeamID: "t1", Name: "token", Sealed: []byte("sealed"), Hosts: []string{"api.example.com"}})
	if err != nil {
		t.Fatalf("CreateSecret() after upgrade = %v", err)
	}
	if got, err := s.Secret(ctx, "t1", "token"); err != nil {
		t.Errorf("Secret(token) after upgrade = %v", err)
	} else if diff := cmp.Diff(sc, got); diff != "" {
		t.Errorf("Secret(token) after upgrade (-want +got):\n%s", diff)
	}
}

// TestUpgradeAddsEgressLogs opens a database written at schema version 5
// (before egress logs) and expects Open to upgrade it in place.
func TestUpgradeAddsEgressLogs(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Start(t)
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, dsn, ms[:5])
	if err != nil {
		t.Fatalf("setup: open at version 5: %v", err)
	}
	if _, err := old.CreateTeam(ctx, store.Team{ID: "t1", Name: "old"}); err != nil {
		t.Fatalf("setup: CreateTeam: %v", err)
	}
	sc, err := old.CreateSecret(ctx, store.Secret{TeamID: "t1", Name: "token", Sealed: []byte("sealed"), Hosts: []string{"api.example.com"}})
	if err != nil {
		t.Fatalf("setup: CreateSecret: %v", err)
	}
	old.Close()

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open() of a version 5 database = %v", err)
	}
	defer s.Close()
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
		t.Errorf("schema versions after upgrade (-want +got):\n%s", diff)
	}
	if got, err := s.Secret(ctx, "t1", "token"); err != nil {
		t.Errorf("Secret(token) after upgrade = %v", err)
	} else if diff := cmp.Diff(sc, got); diff != "" {
		t.Errorf("Secret(token) after upgrade (-want +got):\n%s", diff)
	}
	sb := store.NewSandboxID()
	seg, err := s.PutEgressLog(ctx, store.EgressLog{TeamID: "t1", SandboxID: sb, LogID: "w1/slot-1/run-1", Data: []byte("log")})
	if err != nil {
		t.Fatalf("PutEgressLog() after upgrade = %v", err)
	}
	if got, err := s.EgressLogs(ctx, "t1", sb); err != nil {
		t.Errorf("EgressLogs(t1, %s) after upgrade = %v", sb, err)
	} else if diff := cmp.Diff([]store.EgressLog{seg}, got); diff != "" {
		t.Errorf("EgressLogs(t1, %s) after upgrade (-want +got):\n%s", sb, diff)
	}
}

// TestUpgradeBackfillsQuotaColumns opens a database written at schema
// version 6 and expects Open to fill the sandboxes' vcpus and memory_mib
// from their specs, whatever those hold.
func TestUpgradeBackfillsQuotaColumns(t *testing.T) {
	ctx := t.Context()
	dsn := pgtest.Start(t)
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, dsn, ms[:6])
	if err != nil {
		t.Fatalf("setup: open at version 6: %v", err)
	}
	if _, err := old.CreateTeam(ctx, store.Team{ID: "t1"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	cases := []struct {
		spec      string
		vcpus     int
		memoryMiB int64
	}{
		{`{"vcpus":2,"memory_mib":512}`, 2, 512},
		{`{}`, 0, 0},
		{`[1,2]`, 0, 0},
		{`"x"`, 0, 0},
		{`{"vcpus":"two","memory_mib":null}`, 0, 0},
		{`{"vcpus":-3,"memory_mib":{"a":1}}`, 0, 0},
		{`{"vcpus":64,"memory_mib":1048576,"other":true}`, 64, 1048576},
	}
	ids := make([]string, len(cases))
	for i, c := range cases {
		ids[i] = store.NewSandboxID()
		if _, err := old.pool.Exec(ctx, `INSERT INTO sandboxes (id, team_id, template, state, worker_id, spec, labels, created, updated, version)
			VALUES ($1, 't1', 'base', 'running', '', $2, '{}', now(), now(), 1)`, ids[i], []byte(c.spec)); err != nil {
			t.Fatalf("setup: insert sandbox: %v", err)
		}
	}
	old.Close()
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open() of a version 6 database = %v", err)
	}
	defer s.Close()
	for i, c := range cases {
		sb, err := s.Sandbox(ctx, "t1", ids[i])
		if err != nil {
			t.Fatalf("Sandbox() after upgrade = %v", err)
		}
		if sb.VCPUs != c.vcpus || sb.MemoryMiB != c.memoryMiB || string(sb.Spec) != c.spec {
			t.Errorf("spec %s after upgrade: vcpus %d, memory %d, spec %s; want %d, %d, unchanged",
				c.spec, sb.VCPUs, sb.MemoryMiB, sb.Spec, c.vcpus, c.memoryMiB)
		}
	}
}
