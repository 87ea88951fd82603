// Package postgres implements [store.Store] on PostgreSQL (pgx).
//
// Several control plane replicas may share one database: writes are single
// statements or short transactions, UpdateSandbox, UpdateSnapshot and
// UpdateTemplate compare versions in the database, and schema migrations
// serialize on an advisory lock. Replicas coordinate through the database
// alone: leases expire by its clock (now()), a fenced write holds its
// lease's row (FOR KEY SHARE) until it commits, so no takeover can slip in
// between check and write, and CreateSandboxWithinQuota serializes on the
// team's row (FOR NO KEY UPDATE), per team, not globally. AppendAudit
// serializes globally on the audit log's head (audit_chain's one row,
// FOR UPDATE): the log is one chain.
package postgres

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"space/internal/store"
	"space/internal/store/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLock is the pg_advisory_xact_lock key migrations hold.
const migrationLock = 0x5350414345 // "SPACE"

// Store is a [store.Store] backed by PostgreSQL.
type Store struct {
	pool *pgxpool.Pool

	closeOnce sync.Once
}

var _ store.Store = (*Store)(nil)

// Open connects to the database dsn names (a libpq keyword/value string or
// URL) and applies the schema migrations it lacks. The caller must call
// Close.
func Open(ctx context.Context, dsn string) (*Store, error) {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return open(ctx, dsn, ms)
}

// open is Open with the schema given as migrations ms; tests pass a prefix
// of them to build the database an older binary wrote.
func open(ctx context.Context, dsn string, ms []migrate.Migration) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres: parse dsn: %v: %w", err, store.ErrInvalid)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	s := &Store{pool: pool}
	if err := s.migrate(ctx, ms); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return s, nil
}

// Close closes the connection pool. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(s.pool.Close)
	return nil
}

func (s *Store) migrate(ctx context.Context, ms []migrate.Migration) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("lock migrations: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version bigint PRIMARY KEY,
			name    text NOT NULL,
			applied timestamptz NOT NULL
		)`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		var applied int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&applied); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		pending, err := migrate.Pending(ms, applied)
		if err != nil {
			return err
		}
		for _, m := range pending {
			if _, err := tx.Exec(ctx, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name, applied) VALUES ($1, $2, now())`,
				m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
		}
		return nil
	})
}

// mapErr turns constraint violations into store sentinels. what names the
// referenced record for a foreign key violation.
func mapErr(err error, what string) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "23505": // unique_violation
			return store.ErrAlreadyExists
		case "23503": // foreign_key_violation
			return fmt.Errorf("%s: %w", what, store.ErrNotFound)
		}
	}
	return err
}

func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// deleted returns ErrNotFound when the statement affected no row.
func deleted(tag pgconn.CommandTag, err error) error {
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

const teamColumns = `id, name, quota, created`

func scanTeam(row pgx.Row) (store.Team, error) {
	var (
		t     store.Team
		quota []byte
	)
	if err := row.Scan(&t.ID, &t.Name, &quota, &t.Created); err != nil {
		return store.Team{}, err
	}
	t.Quota = quota
	t.Created = t.Created.UTC()
	return t, nil
}

// CreateTeam implements [store.Teams].
func (s *Store) CreateTeam(ctx context.Context, t store.Team) (store.Team, error) {
	if err := t.Validate(); err != nil {
		return store.Team{}, fmt.Errorf("create team: %w", err)
	}
	t.Quota = cloneJSON(t.Quota)
	t.Created = store.StoredTime(time.Now())
	_, err := s.pool.Exec(ctx, `INSERT INTO teams (`+teamColumns+`) VALUES ($1, $2, $3, $4)`,
		t.ID, t.Name, []byte(t.Quota), t.Created)
	if err != nil {
		return store.Team{}, fmt.Errorf("create team %s: %w", t.ID, mapErr(err, ""))
	}
	return t, nil
}

// cloneJSON makes b the caller's no longer, keeping nil nil.
func cloneJSON(b json.RawMessage) json.RawMessage {
	if b == nil {
		return nil
	}
	return append(json.RawMessage{}, b...)
}

// Team implements [store.Teams].
func (s *Store) Team(ctx context.Context, id string) (store.Team, error) {
	t, err := scanTeam(s.pool.QueryRow(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = $1`, id))
	if err != nil {
		return store.Team{}, fmt.Errorf("team %s: %w", id, notFound(err))
	}
	return t, nil
}

// SetTeamQuota implements [store.Teams].
func (s *Store) SetTeamQuota(ctx context.Context, id string, quota json.RawMessage) (store.Team, error) {
	if err := store.ValidateQuota(quota); err != nil {
		return store.Team{}, fmt.Errorf("set quota of team %s: %w", id, err)
	}
	t, err := scanTeam(s.pool.QueryRow(ctx, `UPDATE teams SET quota = $1 WHERE id = $2 RETURNING `+teamColumns,
		[]byte(quota), id))
	if err != nil {
		return store.Team{}, fmt.Errorf("set quota of team %s: %w", id, notFound(err))
	}
	return t, nil
}

// CreateAPIKey implements [store.APIKeys].
func (s *Store) CreateAPIKey(ctx context.Context, k store.APIKey) (store.APIKey, error) {
	if err := k.Validate(); err != nil {
		return store.APIKey{}, fmt.Errorf("create api key: %w", err)
	}
	k.Created = store.StoredTime(time.Now())
	_, err := s.pool.Exec(ctx, `INSERT INTO api_keys (id, team_id, name, admin, hash, created) VALUES ($1, $2, $3, $4, $5, $6)`,
		k.ID, k.TeamID, k.Name, k.Admin, k.Hash[:], k.Created)
	if err != nil {
		return store.APIKey{}, fmt.Errorf("create api key %s: %w", k.ID, mapErr(err, "team "+k.TeamID))
	}
	return k, nil
}

const apiKeyColumns = `id, team_id, name, admin, hash, created`

func scanAPIKey(row pgx.Row) (store.APIKey, error) {
	var (
		k    store.APIKey
		hash []byte
	)
	if err := row.Scan(&k.ID, &k.TeamID, &k.Name, &k.Admin, &hash, &k.Created); err != nil {
		return store.APIKey{}, err
	}
	if len(hash) != len(k.Hash) {
		return store.APIKey{}, fmt.Errorf("api key %s: stored hash has %d bytes", k.ID, len(hash))
	}
	copy(k.Hash[:], hash)
	k.Created = k.Created.UTC()
	return k, nil
}

// APIKeyByHash implements [store.APIKeys].
func (s *Store) APIKeyByHash(ctx context.Context, hash [32]byte) (store.APIKey, error) {
	k, err := scanAPIKey(s.pool.QueryRow(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE hash = $1`, hash[:]))
	if err != nil {
		return store.APIKey{}, fmt.Errorf("api key by hash: %w", notFound(err))
	}
	return k, nil
}

// ListAPIKeys implements [store.APIKeys].
func (s *Store) ListAPIKeys(ctx context.Context, teamID string) ([]store.APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE team_id = $1 ORDER BY created, id`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list api keys of %s: %w", teamID, err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.APIKey, error) { return scanAPIKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list api keys of %s: %w", teamID, err)
	}
	return keys, nil
}

// DeleteAPIKey implements [store.APIKeys].
func (s *Store) DeleteAPIKey(ctx context.Context, teamID, id string) error {
	if err := deleted(s.pool.Exec(ctx, `DELETE FROM api_keys WHERE team_id = $1 AND id = $2`, teamID, id)); err != nil {
		return fmt.Errorf("delete api key %s: %w", id, err)
	}
	return nil
}

const sandboxColumns = `id, team_id, template, state, worker_id, spec, handle, labels, created, updated, expires, version, vcpus, memory_mib`

func scanSandbox(row pgx.Row) (store.Sandbox, error) {
	var (
		sb           store.Sandbox
		spec, handle []byte
		labels       []byte
		expires      *time.Time
	)
	if err := row.Scan(&sb.ID, &sb.TeamID, &sb.Template, &sb.State, &sb.WorkerID, &spec, &handle,
		&labels, &sb.Created, &sb.Updated, &expires, &sb.Version, &sb.VCPUs, &sb.MemoryMiB); err != nil {
		return store.Sandbox{}, err
	}
	sb.Spec, sb.Handle = spec, handle
	if err := json.Unmarshal(labels, &sb.Labels); err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: decode labels: %w", sb.ID, err)
	}
	if len(sb.Labels) == 0 {
		sb.Labels = nil
	}
	sb.Created, sb.Updated = sb.Created.UTC(), sb.Updated.UTC()
	if expires != nil {
		sb.Expires = expires.UTC()
	}
	return sb, nil
}

func encodeLabels(labels map[string]string) (string, error) {
	if labels == nil {
		labels = map[string]string{}
	}
	b, err := json.Marshal(labels)
	return string(b), err
}

// clean makes sb's slices and map the caller's no longer and normalizes
// empty labels to nil, so the returned record equals a later read.
func clean(sb store.Sandbox) store.Sandbox {
	sb.Spec = append(json.RawMessage(nil), sb.Spec...)
	if sb.Handle != nil {
		sb.Handle = append(json.RawMessage{}, sb.Handle...)
	}
	if len(sb.Labels) == 0 {
		sb.Labels = nil
	} else {
		m := make(map[string]string, len(sb.Labels))
		for k, v := range sb.Labels {
			m[k] = v
		}
		sb.Labels = m
	}
	if !sb.Expires.IsZero() {
		sb.Expires = store.StoredTime(sb.Expires)
	}
	return sb
}

// CreateSandbox implements [store.Sandboxes].
func (s *Store) CreateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	return s.createSandbox(ctx, nil, nil, sb)
}

// createSandbox is CreateSandbox, fenced by fence and within quota q
// unless they are nil.
func (s *Store) createSandbox(ctx context.Context, fence *store.Lease, q *store.Quota, sb store.Sandbox) (store.Sandbox, error) {
	if err := sb.Validate(); err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	if q != nil {
		if err := q.Validate(); err != nil {
			return store.Sandbox{}, fmt.Errorf("create sandbox %s: %w", sb.ID, err)
		}
	}
	labels, err := encodeLabels(sb.Labels)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	sb = clean(sb)
	sb.Created = store.StoredTime(time.Now())
	sb.Updated = sb.Created
	sb.Version = 1
	err = s.tx(ctx, fence, func(tx pgx.Tx) error {
		if q != nil {
			if err := admit(ctx, tx, *q, &sb); err != nil {
				return err
			}
		}
		if err := insertSandbox(ctx, tx, &sb, labels); err != nil {
			return err
		}
		return recordState(ctx, tx, "", sb)
	})
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return sb, nil
}

func insertSandbox(ctx context.Context, q querier, sb *store.Sandbox, labels string) error {
	_, err := q.Exec(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $14)`,
		sb.ID, sb.TeamID, sb.Template, string(sb.State), sb.WorkerID, []byte(sb.Spec), []byte(sb.Handle),
		labels, sb.Created, sb.Updated, nullTime(sb.Expires), sb.Version, sb.VCPUs, sb.MemoryMiB)
	return mapErr(err, "team "+sb.TeamID)
}

// Sandbox implements [store.Sandboxes].
func (s *Store) Sandbox(ctx context.Context, teamID, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.pool.QueryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE team_id = $1 AND id = $2`, teamID, id))
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, notFound(err))
	}
	return sb, nil
}

func (s *Store) SandboxByID(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.pool.QueryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = $1`, id))
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, notFound(err))
	}
	return sb, nil
}

func (s *Store) querySandboxes(ctx context.Context, f *store.Filter, query string, args ...any) ([]store.Sandbox, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes `+query, args...)
	if err != nil {
		return nil, err
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Sandbox, error) { return scanSandbox(r) })
	if err != nil || f == nil {
		return all, err
	}
	var sbs []store.Sandbox
	for i := range all {
		if f.Match(&all[i]) {
			sbs = append(sbs, all[i])
		}
	}
	return sbs, nil
}

// ListSandboxes implements [store.Sandboxes]. The filter runs in Go over
// the team's sandboxes.
func (s *Store) ListSandboxes(ctx context.Context, teamID string, f store.Filter) ([]store.Sandbox, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("list sandboxes of %s: %w", teamID, err)
	}
	sbs, err := s.querySandboxes(ctx, &f, `WHERE team_id = $1 ORDER BY created, id`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of %s: %w", teamID, err)
	}
	return sbs, nil
}

// UpdateSandbox implements [store.Sandboxes].
func (s *Store) UpdateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	return s.updateSandbox(ctx, nil, nil, sb)
}

// updateSandbox is UpdateSandbox, fenced by fence unless it is nil, and
// admitting a resumed sandbox within q unless q is nil.
func (s *Store) updateSandbox(ctx context.Context, fence *store.Lease, q *store.Quota, sb store.Sandbox) (store.Sandbox, error) {
	if err := sb.Validate(); err != nil {
		return store.Sandbox{}, fmt.Errorf("update sandbox: %w", err)
	}
	if q != nil {
		if err := q.Validate(); err != nil {
			return store.Sandbox{}, fmt.Errorf("update sandbox %s: %w", sb.ID, err)
		}
	}
	labels, err := encodeLabels(sb.Labels)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	sb = clean(sb)
	sb.Updated = store.StoredTime(time.Now())
	var out store.Sandbox
	err = s.tx(ctx, fence, func(tx pgx.Tx) error {
		if q != nil {
			if err := admitResume(ctx, tx, *q, &sb); err != nil {
				return err
			}
		}
		var (
			prev string
			err  error
		)
		out, prev, err = casSandbox(ctx, tx, &sb, labels)
		if err != nil {
			return err
		}
		return recordState(ctx, tx, store.SandboxState(prev), out)
	})
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	return out, nil
}

// casSandbox writes sb's mutable fields if the stored version is still
// sb.Version, and returns the new record and the state it replaced. It
// runs in a transaction: it locks the row first, so the state it reads is
// the one the update replaces (the update, a new statement under READ
// COMMITTED, sees the row as locked).
func casSandbox(ctx context.Context, tx pgx.Tx, sb *store.Sandbox, labels string) (store.Sandbox, string, error) {
	var prev string
	err := tx.QueryRow(ctx, `SELECT state FROM sandboxes WHERE team_id = $1 AND id = $2 FOR NO KEY UPDATE`,
		sb.TeamID, sb.ID).Scan(&prev)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Sandbox{}, "", store.ErrNotFound
	}
	if err != nil {
		return store.Sandbox{}, "", fmt.Errorf("lock sandbox: %w", err)
	}
	out, err := scanSandbox(tx.QueryRow(ctx, `UPDATE sandboxes
		SET state = $1, worker_id = $2, spec = $3, handle = $4, labels = $5::jsonb, updated = $6, expires = $7, version = version + 1
		WHERE team_id = $8 AND id = $9 AND version = $10
		RETURNING `+sandboxColumns,
		string(sb.State), sb.WorkerID, []byte(sb.Spec), []byte(sb.Handle), labels, sb.Updated, nullTime(sb.Expires),
		sb.TeamID, sb.ID, sb.Version))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Sandbox{}, "", fmt.Errorf("at version %d: %w", sb.Version, store.ErrVersionConflict)
	}
	return out, prev, err
}

// DeleteSandbox implements [store.Sandboxes].
func (s *Store) DeleteSandbox(ctx context.Context, teamID, id string) error {
	return s.deleteSandbox(ctx, nil, teamID, id)
}

// deleteSandbox is DeleteSandbox, fenced by fence unless it is nil.
func (s *Store) deleteSandbox(ctx context.Context, fence *store.Lease, teamID, id string) error {
	err := s.tx(ctx, fence, func(tx pgx.Tx) error {
		var prev string
		err := tx.QueryRow(ctx, `DELETE FROM sandboxes WHERE team_id = $1 AND id = $2 RETURNING state`, teamID, id).Scan(&prev)
		if err != nil {
			return notFound(err)
		}
		return recordState(ctx, tx, store.SandboxState(prev), store.Sandbox{ID: id, TeamID: teamID, State: store.StateDeleted})
	})
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// SandboxesByWorker implements [store.SandboxIndex].
func (s *Store) SandboxesByWorker(ctx context.Context, workerID string) ([]store.Sandbox, error) {
	if workerID == "" {
		return nil, fmt.Errorf("sandboxes by worker: empty worker id: %w", store.ErrInvalid)
	}
	sbs, err := s.querySandboxes(ctx, nil, `WHERE worker_id = $1 ORDER BY created, id`, workerID)
	if err != nil {
		return nil, fmt.Errorf("sandboxes by worker %s: %w", workerID, err)
	}
	return sbs, nil
}

// CountSandboxesByTeam implements [store.SandboxIndex].
func (s *Store) CountSandboxesByTeam(ctx context.Context) (map[string]map[store.SandboxState]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT team_id, state, count(*) FROM sandboxes WHERE state <> 'deleted' GROUP BY team_id, state`)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes by team: %w", err)
	}
	defer rows.Close()
	out := make(map[string]map[store.SandboxState]int)
	for rows.Next() {
		var (
			team, state string
			n           int
		)
		if err := rows.Scan(&team, &state, &n); err != nil {
			return nil, fmt.Errorf("count sandboxes by team: %w", err)
		}
		if out[team] == nil {
			out[team] = make(map[store.SandboxState]int)
		}
		out[team][store.SandboxState(state)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count sandboxes by team: %w", err)
	}
	return out, nil
}

// CountSandboxes implements [store.SandboxIndex].
func (s *Store) CountSandboxes(ctx context.Context) (map[store.SandboxState]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT state, count(*) FROM sandboxes GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes: %w", err)
	}
	defer rows.Close()
	out := make(map[store.SandboxState]int)
	for rows.Next() {
		var (
			state string
			n     int
		)
		if err := rows.Scan(&state, &n); err != nil {
			return nil, fmt.Errorf("count sandboxes: %w", err)
		}
		out[store.SandboxState(state)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count sandboxes: %w", err)
	}
	return out, nil
}

// ExpiredSandboxes implements [store.SandboxIndex].
func (s *Store) ExpiredSandboxes(ctx context.Context, now time.Time) ([]store.Sandbox, error) {
	sbs, err := s.querySandboxes(ctx, nil, `WHERE expires IS NOT NULL AND expires <= $1 AND state <> $2 ORDER BY expires, id`,
		store.StoredTime(now), string(store.StateDeleted))
	if err != nil {
		return nil, fmt.Errorf("expired sandboxes: %w", err)
	}
	return sbs, nil
}

const snapshotColumns = `id, team_id, sandbox_id, name, state, worker_id, manifest, logical_bytes, new_bytes, meta, created, updated, version`

func scanSnapshot(row pgx.Row) (store.Snapshot, error) {
	var (
		sn   store.Snapshot
		meta []byte
	)
	if err := row.Scan(&sn.ID, &sn.TeamID, &sn.SandboxID, &sn.Name, &sn.State, &sn.WorkerID, &sn.Manifest,
		&sn.LogicalBytes, &sn.NewBytes, &meta, &sn.Created, &sn.Updated, &sn.Version); err != nil {
		return store.Snapshot{}, err
	}
	sn.Meta = meta
	sn.Created, sn.Updated = sn.Created.UTC(), sn.Updated.UTC()
	return sn, nil
}

// CreateSnapshot implements [store.Snapshots].
func (s *Store) CreateSnapshot(ctx context.Context, sn store.Snapshot) (store.Snapshot, error) {
	if err := sn.Validate(); err != nil {
		return store.Snapshot{}, fmt.Errorf("create snapshot: %w", err)
	}
	sn.Meta = cloneJSON(sn.Meta)
	sn.Created = store.StoredTime(time.Now())
	sn.Updated = sn.Created
	sn.Version = 1
	_, err := s.pool.Exec(ctx, `INSERT INTO snapshots (`+snapshotColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		sn.ID, sn.TeamID, sn.SandboxID, sn.Name, string(sn.State), sn.WorkerID, sn.Manifest,
		sn.LogicalBytes, sn.NewBytes, []byte(sn.Meta), sn.Created, sn.Updated, sn.Version)
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("create snapshot %s: %w", sn.ID, mapErr(err, "team "+sn.TeamID))
	}
	return sn, nil
}

// Snapshot implements [store.Snapshots].
func (s *Store) Snapshot(ctx context.Context, teamID, id string) (store.Snapshot, error) {
	sn, err := scanSnapshot(s.pool.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE team_id = $1 AND id = $2`, teamID, id))
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, notFound(err))
	}
	return sn, nil
}

// SnapshotByName implements [store.Snapshots].
func (s *Store) SnapshotByName(ctx context.Context, teamID, name string) (store.Snapshot, error) {
	if name == "" {
		return store.Snapshot{}, fmt.Errorf("snapshot by name: empty name: %w", store.ErrInvalid)
	}
	sn, err := scanSnapshot(s.pool.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE team_id = $1 AND name = $2`, teamID, name))
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("snapshot named %s: %w", name, notFound(err))
	}
	return sn, nil
}

// ListSnapshots implements [store.Snapshots].
func (s *Store) ListSnapshots(ctx context.Context, teamID, sandboxID string) ([]store.Snapshot, error) {
	if sandboxID != "" && !store.ValidSandboxID(sandboxID) {
		return nil, fmt.Errorf("list snapshots of %s: sandbox id %q: %w", teamID, sandboxID, store.ErrInvalid)
	}
	query, args := `WHERE team_id = $1`, []any{teamID}
	if sandboxID != "" {
		query, args = query+` AND sandbox_id = $2`, append(args, sandboxID)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+snapshotColumns+` FROM snapshots `+query+` ORDER BY created, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots of %s: %w", teamID, err)
	}
	sns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Snapshot, error) { return scanSnapshot(r) })
	if err != nil {
		return nil, fmt.Errorf("list snapshots of %s: %w", teamID, err)
	}
	return sns, nil
}

// UpdateSnapshot implements [store.Snapshots].
func (s *Store) UpdateSnapshot(ctx context.Context, sn store.Snapshot) (store.Snapshot, error) {
	return s.updateSnapshot(ctx, nil, sn)
}

// updateSnapshot is UpdateSnapshot, fenced by fence unless it is nil.
func (s *Store) updateSnapshot(ctx context.Context, fence *store.Lease, sn store.Snapshot) (store.Snapshot, error) {
	if err := sn.Validate(); err != nil {
		return store.Snapshot{}, fmt.Errorf("update snapshot: %w", err)
	}
	updated := store.StoredTime(time.Now())
	var out store.Snapshot
	err := s.write(ctx, fence, func(q querier) error {
		// One statement, as in UpdateSandbox.
		var err error
		out, err = scanSnapshot(q.QueryRow(ctx, `UPDATE snapshots
			SET state = $1, worker_id = $2, manifest = $3, logical_bytes = $4, new_bytes = $5, meta = $6, updated = $7, version = version + 1
			WHERE team_id = $8 AND id = $9 AND version = $10
			RETURNING `+snapshotColumns,
			string(sn.State), sn.WorkerID, sn.Manifest, sn.LogicalBytes, sn.NewBytes, []byte(sn.Meta), updated,
			sn.TeamID, sn.ID, sn.Version))
		if errors.Is(err, pgx.ErrNoRows) {
			var exists bool
			if err = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM snapshots WHERE team_id = $1 AND id = $2)`,
				sn.TeamID, sn.ID).Scan(&exists); err == nil {
				err = store.ErrNotFound
				if exists {
					err = fmt.Errorf("at version %d: %w", sn.Version, store.ErrVersionConflict)
				}
			}
		}
		return err
	})
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("update snapshot %s: %w", sn.ID, err)
	}
	return out, nil
}

// DeleteSnapshot implements [store.Snapshots].
func (s *Store) DeleteSnapshot(ctx context.Context, teamID, id string) error {
	return s.deleteSnapshot(ctx, nil, teamID, id)
}

// deleteSnapshot is DeleteSnapshot, fenced by fence unless it is nil.
func (s *Store) deleteSnapshot(ctx context.Context, fence *store.Lease, teamID, id string) error {
	err := s.write(ctx, fence, func(q querier) error {
		return deleted(q.Exec(ctx, `DELETE FROM snapshots WHERE team_id = $1 AND id = $2`, teamID, id))
	})
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return nil
}

// TeamSnapshotBytes implements [store.Snapshots].
func (s *Store) TeamSnapshotBytes(ctx context.Context, teamID string) (int64, error) {
	var n int64
	// sum(bigint) is numeric; the cast fails rather than wrap on overflow.
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(new_bytes), 0)::bigint FROM snapshots WHERE team_id = $1`, teamID).Scan(&n); err != nil {
		return 0, fmt.Errorf("snapshot bytes of %s: %w", teamID, err)
	}
	return n, nil
}

// AllSnapshotManifests implements [store.SnapshotIndex].
func (s *Store) AllSnapshotManifests(ctx context.Context) ([]string, error) {
	// COLLATE "C": bytewise, whatever the database's collation.
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT manifest COLLATE "C" AS m FROM snapshots WHERE manifest <> '' ORDER BY m`)
	if err != nil {
		return nil, fmt.Errorf("all snapshot manifests: %w", err)
	}
	ms, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("all snapshot manifests: %w", err)
	}
	return ms, nil
}

// UnsettledSnapshots implements [store.SnapshotIndex].
func (s *Store) UnsettledSnapshots(ctx context.Context) ([]store.Snapshot, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE state IN ($1, $2) ORDER BY created, id`,
		string(store.SnapshotCreating), string(store.SnapshotDeleting))
	if err != nil {
		return nil, fmt.Errorf("unsettled snapshots: %w", err)
	}
	sns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Snapshot, error) { return scanSnapshot(r) })
	if err != nil {
		return nil, fmt.Errorf("unsettled snapshots: %w", err)
	}
	return sns, nil
}

// UpsertWorker implements [store.Workers].
func (s *Store) UpsertWorker(ctx context.Context, w store.Worker) error {
	if err := w.Validate(); err != nil {
		return fmt.Errorf("upsert worker: %w", err)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO workers (id, address, vcpus, memory_mib, last_heartbeat, protocol, capabilities)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (id) DO UPDATE SET address = excluded.address, vcpus = excluded.vcpus,
			memory_mib = excluded.memory_mib, last_heartbeat = excluded.last_heartbeat,
			protocol = excluded.protocol, capabilities = excluded.capabilities`,
		w.ID, w.Address, w.VCPUs, w.MemoryMiB, store.StoredTime(w.LastHeartbeat), w.Protocol, []byte(w.Capabilities))
	if err != nil {
		return fmt.Errorf("upsert worker %s: %w", w.ID, err)
	}
	return nil
}

// ListWorkers implements [store.Workers].
func (s *Store) ListWorkers(ctx context.Context) ([]store.Worker, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, address, vcpus, memory_mib, last_heartbeat, protocol, capabilities, epoch FROM workers ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Worker, error) {
		var (
			w    store.Worker
			caps []byte
		)
		err := r.Scan(&w.ID, &w.Address, &w.VCPUs, &w.MemoryMiB, &w.LastHeartbeat, &w.Protocol, &caps, &w.Epoch)
		w.LastHeartbeat = w.LastHeartbeat.UTC()
		w.Capabilities = caps
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	return ws, nil
}

// RaiseWorkerEpoch implements [store.Workers].
func (s *Store) RaiseWorkerEpoch(ctx context.Context, id string, from int64) (int64, error) {
	return s.raiseWorkerEpoch(ctx, nil, id, from)
}

// raiseWorkerEpoch is RaiseWorkerEpoch, fenced by fence unless it is nil.
func (s *Store) raiseWorkerEpoch(ctx context.Context, fence *store.Lease, id string, from int64) (int64, error) {
	err := s.write(ctx, fence, func(q querier) error {
		tag, err := q.Exec(ctx, `UPDATE workers SET epoch = $1 WHERE id = $2 AND epoch = $3`, from+1, id, from)
		if err != nil || tag.RowsAffected() == 1 {
			return err
		}
		var cur int64
		err = q.QueryRow(ctx, `SELECT epoch FROM workers WHERE id = $1`, id).Scan(&cur)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("epoch is %d, not %d: %w", cur, from, store.ErrVersionConflict)
	})
	if err != nil {
		return 0, fmt.Errorf("raise epoch of worker %s: %w", id, err)
	}
	return from + 1, nil
}

// DeleteWorker implements [store.Workers].
func (s *Store) DeleteWorker(ctx context.Context, id string) error {
	if err := deleted(s.pool.Exec(ctx, `DELETE FROM workers WHERE id = $1`, id)); err != nil {
		return fmt.Errorf("delete worker %s: %w", id, err)
	}
	return nil
}
