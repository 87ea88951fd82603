package sqlite

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/store"
	"space/internal/store/migrate"
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
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
		t.Errorf("schema versions after first Open (-want +got):\n%s", diff)
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
		if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
			t.Errorf("schema versions (-want +got):\n%s", diff)
		}
		s.Close()
	}
}

// TestUpgradeAddsTeamQuota opens a database written at schema version 1
// (before teams had a quota) and expects Open to upgrade it in place.
func TestUpgradeAddsTeamQuota(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, path, ms[:1])
	if err != nil {
		t.Fatalf("setup: open at version 1: %v", err)
	}
	if _, err := old.w.ExecContext(ctx, `INSERT INTO teams (id, name, created_us) VALUES ('t1', 'old', 1000000)`); err != nil {
		t.Fatalf("setup: insert team: %v", err)
	}
	if err := old.Close(); err != nil {
		t.Fatalf("setup: close: %v", err)
	}

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open() of a version 1 database = %v", err)
	}
	defer s.Close()
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, schemaVersions(t, s)); diff != "" {
		t.Errorf("schema versions after upgrade (-want +got):\n%s", diff)
	}
	want := store.Team{ID: "t1", Name: "old", Created: fromMicros(1000000)}
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
	path := filepath.Join(t.TempDir(), "state.db")
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, path, ms[:2])
	if err != nil {
		t.Fatalf("setup: open at version 2: %v", err)
	}
	team, err := old.CreateTeam(ctx, store.Team{ID: "t1", Name: "old", Quota: json.RawMessage(`{"vcpus":2}`)})
	if err != nil {
		t.Fatalf("setup: CreateTeam: %v", err)
	}
	// The sandbox goes in by hand: CreateSandbox writes the newest schema.
	sb := store.Sandbox{ID: store.NewSandboxID(), TeamID: "t1", Template: "base", State: store.StateRunning,
		Spec: json.RawMessage(`{"vcpus":2,"memory_mib":512}`), Created: fromMicros(2000000), Updated: fromMicros(2000000),
		Version: 1, VCPUs: 2, MemoryMiB: 512} // the quota columns, backfilled from the spec
	if _, err := old.w.ExecContext(ctx, `INSERT INTO sandboxes (id, team_id, template, state, worker_id, spec, labels, created_us, updated_us, version)
		VALUES (?, 't1', 'base', 'running', '', ?, '{}', 2000000, 2000000, 1)`, sb.ID, []byte(sb.Spec)); err != nil {
		t.Fatalf("setup: insert sandbox: %v", err)
	}
	if err := old.Close(); err != nil {
		t.Fatalf("setup: close: %v", err)
	}

	s, err := Open(ctx, path)
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
	path := filepath.Join(t.TempDir(), "state.db")
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, path, ms[:3])
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
	if err := old.Close(); err != nil {
		t.Fatalf("setup: close: %v", err)
	}

	s, err := Open(ctx, path)
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
	path := filepath.Join(t.TempDir(), "state.db")
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, path, ms[:4])
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
	if err := old.Close(); err != nil {
		t.Fatalf("setup: close: %v", err)
	}

	s, err := Open(ctx, path)
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
	path := filepath.Join(t.TempDir(), "state.db")
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, path, ms[:5])
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
	if err := old.Close(); err != nil {
		t.Fatalf("setup: close: %v", err)
	}

	s, err := Open(ctx, path)
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

// backfillCases are sandbox specs written before version 7 and what
// version 7 reads from them into the quota columns.
var backfillCases = []struct {
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

// TestUpgradeBackfillsQuotaColumns opens a database written at schema
// version 6 and expects Open to fill the sandboxes' vcpus and memory_mib
// from their specs, whatever those hold.
func TestUpgradeBackfillsQuotaColumns(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state.db")
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	old, err := open(ctx, path, ms[:6])
	if err != nil {
		t.Fatalf("setup: open at version 6: %v", err)
	}
	if _, err := old.CreateTeam(ctx, store.Team{ID: "t1"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	ids := make([]string, len(backfillCases))
	for i, c := range backfillCases {
		ids[i] = store.NewSandboxID()
		if _, err := old.w.ExecContext(ctx, `INSERT INTO sandboxes (id, team_id, template, state, worker_id, spec, labels, created_us, updated_us, version)
			VALUES (?, 't1', 'base', 'running', '', ?, '{}', 1, 1, 1)`, ids[i], []byte(c.spec)); err != nil {
			t.Fatalf("setup: insert sandbox: %v", err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open() of a version 6 database = %v", err)
	}
	defer s.Close()
	for i, c := range backfillCases {
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
