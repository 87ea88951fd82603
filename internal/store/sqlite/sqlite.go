// Package sqlite implements [store.Store] on a SQLite file (pure Go driver).
//
// The database runs in WAL mode with synchronous=FULL, so a write is on disk
// when it returns. All writes go through one connection and serialize;
// reads use a separate pool and run concurrently with them.
//
// One control plane uses a file at a time: Open takes an exclusive flock
// on the file's name with ".lock" appended and Close releases it, so a
// second control plane on the same file (or a second Open of it in one
// process) is refused rather than left to share claims it cannot see.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"space/internal/errkind"
	"space/internal/store"
	"space/internal/store/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// busyTimeout is how long a connection waits for another process's lock.
const busyTimeout = 10 * time.Second

// Store is a [store.Store] backed by a SQLite file.
type Store struct {
	w    *sql.DB  // exactly one connection; every write goes through it
	r    *sql.DB  // read-only connections
	lock *os.File // holds the flock on the lock file

	closeOnce sync.Once
	closeErr  error // set by closeOnce
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file at path and applies the
// schema migrations it lacks. The caller must call Close. While the store
// is open, another Open of path fails with an error wrapping
// errkind.FailedPrecondition.
func Open(ctx context.Context, path string) (*Store, error) {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	return open(ctx, path, ms)
}

// open is Open with the schema given as migrations ms; tests pass a prefix
// of them to build the database an older binary wrote.
func open(ctx context.Context, path string, ms []migrate.Migration) (*Store, error) {
	if path == "" || strings.ContainsAny(path, "?#") || strings.HasPrefix(path, "file:") || path == ":memory:" {
		return nil, fmt.Errorf("open sqlite %q: need a plain file path: %w", path, store.ErrInvalid)
	}
	lock, err := lockFile(path)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate") // take the write lock at BEGIN: no upgrade deadlocks
	w, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open sqlite %s: %w", path, err), lock.Close())
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s := &Store{w: w, lock: lock}
	// Migrate before opening readers: the first connection creates the file
	// and switches it to WAL.
	if err := s.migrate(ctx, ms); err != nil {
		return nil, errors.Join(fmt.Errorf("open sqlite %s: %w", path, err), w.Close(), lock.Close())
	}
	q.Set("_query_only", "1")
	q.Del("_txlock")
	r, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open sqlite %s: %w", path, err), w.Close(), lock.Close())
	}
	r.SetMaxOpenConns(max(4, runtime.GOMAXPROCS(0)))
	s.r = r
	return s, nil
}

// Close closes the database. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		// The lock goes last, once nothing of ours can write.
		s.closeErr = errors.Join(s.r.Close(), s.w.Close(), s.lock.Close())
	})
	return s.closeErr
}

// lockFile takes an exclusive flock on path+".lock", creating it if need
// be. The lock lives as long as the returned file is open (or the process:
// a crash releases it). It belongs to the open file description, so a
// second lockFile of the same path fails even in the same process.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: lock: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			break
		}
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, errors.Join(fmt.Errorf("sqlite store %s is in use by another control plane; run one, or use PostgreSQL for several: %w",
			path, errkind.FailedPrecondition), f.Close())
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open sqlite %s: lock %s: %w", path, f.Name(), err), f.Close())
	}
	return f, nil
}

func (s *Store) migrate(ctx context.Context, ms []migrate.Migration) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_us INTEGER NOT NULL
		) STRICT`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		var applied int64
		if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&applied); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		pending, err := migrate.Pending(ms, applied)
		if err != nil {
			return err
		}
		for _, m := range pending {
			if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.Name, err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_us) VALUES (?, ?, ?)`,
				m.Version, m.Name, micros(time.Now())); err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
		}
		return nil
	})
}

// write runs fn in a write transaction and commits it if fn returns nil.
func (s *Store) write(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// mapErr turns constraint violations into store sentinels. what names the
// referenced record for a foreign key violation.
func mapErr(err error, what string) error {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() {
		case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
			return store.ErrAlreadyExists
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return fmt.Errorf("%s: %w", what, store.ErrNotFound)
		}
	}
	return err
}

func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func nullMicros(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: micros(t), Valid: true}
}

const teamColumns = `id, name, quota, created_us`

func scanTeam(sc interface{ Scan(...any) error }) (store.Team, error) {
	var (
		t       store.Team
		quota   []byte // scanned as []byte: database/sql copies it
		created int64
	)
	if err := sc.Scan(&t.ID, &t.Name, &quota, &created); err != nil {
		return store.Team{}, err
	}
	t.Quota = quota
	t.Created = fromMicros(created)
	return t, nil
}

// CreateTeam implements [store.Teams].
func (s *Store) CreateTeam(ctx context.Context, t store.Team) (store.Team, error) {
	if err := t.Validate(); err != nil {
		return store.Team{}, fmt.Errorf("create team: %w", err)
	}
	t.Quota = cloneJSON(t.Quota)
	t.Created = store.StoredTime(time.Now())
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO teams (`+teamColumns+`) VALUES (?, ?, ?, ?)`,
			t.ID, t.Name, nullBytes(t.Quota), micros(t.Created))
		return mapErr(err, "")
	})
	if err != nil {
		return store.Team{}, fmt.Errorf("create team %s: %w", t.ID, err)
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
	t, err := scanTeam(s.r.QueryRowContext(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Team{}, fmt.Errorf("team %s: %w", id, err)
	}
	return t, nil
}

// SetTeamQuota implements [store.Teams].
func (s *Store) SetTeamQuota(ctx context.Context, id string, quota json.RawMessage) (store.Team, error) {
	if err := store.ValidateQuota(quota); err != nil {
		return store.Team{}, fmt.Errorf("set quota of team %s: %w", id, err)
	}
	var t store.Team
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		t, err = scanTeam(tx.QueryRowContext(ctx, `UPDATE teams SET quota = ? WHERE id = ? RETURNING `+teamColumns,
			nullBytes(quota), id))
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return store.Team{}, fmt.Errorf("set quota of team %s: %w", id, err)
	}
	return t, nil
}

// CreateAPIKey implements [store.APIKeys].
func (s *Store) CreateAPIKey(ctx context.Context, k store.APIKey) (store.APIKey, error) {
	if err := k.Validate(); err != nil {
		return store.APIKey{}, fmt.Errorf("create api key: %w", err)
	}
	k.Created = store.StoredTime(time.Now())
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, team_id, name, admin, hash, created_us) VALUES (?, ?, ?, ?, ?, ?)`,
			k.ID, k.TeamID, k.Name, k.Admin, k.Hash[:], micros(k.Created))
		return mapErr(err, "team "+k.TeamID)
	})
	if err != nil {
		return store.APIKey{}, fmt.Errorf("create api key %s: %w", k.ID, err)
	}
	return k, nil
}

const apiKeyColumns = `id, team_id, name, admin, hash, created_us`

func scanAPIKey(sc interface{ Scan(...any) error }) (store.APIKey, error) {
	var (
		k       store.APIKey
		hash    []byte
		created int64
	)
	if err := sc.Scan(&k.ID, &k.TeamID, &k.Name, &k.Admin, &hash, &created); err != nil {
		return store.APIKey{}, err
	}
	if len(hash) != len(k.Hash) {
		return store.APIKey{}, fmt.Errorf("api key %s: stored hash has %d bytes", k.ID, len(hash))
	}
	copy(k.Hash[:], hash)
	k.Created = fromMicros(created)
	return k, nil
}

// APIKeyByHash implements [store.APIKeys].
func (s *Store) APIKeyByHash(ctx context.Context, hash [32]byte) (store.APIKey, error) {
	k, err := scanAPIKey(s.r.QueryRowContext(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE hash = ?`, hash[:]))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.APIKey{}, fmt.Errorf("api key by hash: %w", err)
	}
	return k, nil
}

// ListAPIKeys implements [store.APIKeys].
func (s *Store) ListAPIKeys(ctx context.Context, teamID string) ([]store.APIKey, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE team_id = ? ORDER BY created_us, id`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list api keys of %s: %w", teamID, err)
	}
	defer rows.Close()
	var keys []store.APIKey
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list api keys of %s: %w", teamID, err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list api keys of %s: %w", teamID, err)
	}
	return keys, nil
}

// DeleteAPIKey implements [store.APIKeys].
func (s *Store) DeleteAPIKey(ctx context.Context, teamID, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		return deleted(tx.ExecContext(ctx, `DELETE FROM api_keys WHERE team_id = ? AND id = ?`, teamID, id))
	})
	if err != nil {
		return fmt.Errorf("delete api key %s: %w", id, err)
	}
	return nil
}

// deleted returns ErrNotFound when the statement affected no row.
func deleted(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

const sandboxColumns = `id, team_id, template, state, worker_id, spec, handle, labels, created_us, updated_us, expires_us, version, vcpus, memory_mib`

func scanSandbox(sc interface{ Scan(...any) error }) (store.Sandbox, error) {
	var (
		sb               store.Sandbox
		labels           string
		created, updated int64
		expires          sql.NullInt64
		spec, handle     []byte // scanned as []byte: database/sql copies those
	)
	if err := sc.Scan(&sb.ID, &sb.TeamID, &sb.Template, &sb.State, &sb.WorkerID, &spec, &handle,
		&labels, &created, &updated, &expires, &sb.Version, &sb.VCPUs, &sb.MemoryMiB); err != nil {
		return store.Sandbox{}, err
	}
	sb.Spec, sb.Handle = spec, handle
	if err := json.Unmarshal([]byte(labels), &sb.Labels); err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: decode labels: %w", sb.ID, err)
	}
	if len(sb.Labels) == 0 {
		sb.Labels = nil
	}
	sb.Created, sb.Updated = fromMicros(created), fromMicros(updated)
	if expires.Valid {
		sb.Expires = fromMicros(expires.Int64)
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
	sb.Expires = expiry(sb.Expires)
	sb.Version = 1
	err = s.writeFenced(ctx, fence, func(tx *sql.Tx) error {
		if q != nil {
			// The write connection serializes every transaction, so the
			// count and the insert are atomic.
			if err := admit(ctx, tx, *q, &sb); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sb.ID, sb.TeamID, sb.Template, sb.State, sb.WorkerID, []byte(sb.Spec), nullBytes(sb.Handle),
			labels, micros(sb.Created), micros(sb.Updated), nullMicros(sb.Expires), sb.Version, sb.VCPUs, sb.MemoryMiB)
		if err != nil {
			return mapErr(err, "team "+sb.TeamID)
		}
		return recordState(ctx, tx, "", sb)
	})
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return sb, nil
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
	return sb
}

func expiry(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return store.StoredTime(t)
}

// nullBytes keeps nil as SQL NULL and stores an empty non-nil slice as an
// empty blob.
func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return []byte(b)
}

// Sandbox implements [store.Sandboxes].
func (s *Store) Sandbox(ctx context.Context, teamID, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.r.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE team_id = ? AND id = ?`, teamID, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (s *Store) SandboxByID(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.r.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (s *Store) querySandboxes(ctx context.Context, f *store.Filter, query string, args ...any) ([]store.Sandbox, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes `+query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var sbs []store.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		if f == nil || f.Match(&sb) {
			sbs = append(sbs, sb)
		}
	}
	return sbs, rows.Err()
}

// ListSandboxes implements [store.Sandboxes]. The filter runs in Go over
// the team's sandboxes.
func (s *Store) ListSandboxes(ctx context.Context, teamID string, f store.Filter) ([]store.Sandbox, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("list sandboxes of %s: %w", teamID, err)
	}
	sbs, err := s.querySandboxes(ctx, &f, `WHERE team_id = ? ORDER BY created_us, id`, teamID)
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
	sb.Expires = expiry(sb.Expires)
	var out store.Sandbox
	err = s.writeFenced(ctx, fence, func(tx *sql.Tx) error {
		if q != nil {
			// As in createSandbox, the write connection makes the check
			// and the update atomic.
			if err := admitResume(ctx, tx, *q, &sb); err != nil {
				return err
			}
		}
		// The write connection serializes transactions: the state read
		// here is the one the update replaces.
		var prev string
		err := tx.QueryRowContext(ctx, `SELECT state FROM sandboxes WHERE team_id = ? AND id = ? AND version = ?`,
			sb.TeamID, sb.ID, sb.Version).Scan(&prev)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read state: %w", err)
		}
		out, err = scanSandbox(tx.QueryRowContext(ctx, `UPDATE sandboxes
			SET state = ?, worker_id = ?, spec = ?, handle = ?, labels = ?, updated_us = ?, expires_us = ?, version = version + 1
			WHERE team_id = ? AND id = ? AND version = ?
			RETURNING `+sandboxColumns,
			sb.State, sb.WorkerID, []byte(sb.Spec), nullBytes(sb.Handle), labels, micros(sb.Updated), nullMicros(sb.Expires),
			sb.TeamID, sb.ID, sb.Version))
		if err == nil {
			return recordState(ctx, tx, store.SandboxState(prev), out)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sandboxes WHERE team_id = ? AND id = ?`, sb.TeamID, sb.ID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		return fmt.Errorf("at version %d: %w", sb.Version, store.ErrVersionConflict)
	})
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	return out, nil
}

// DeleteSandbox implements [store.Sandboxes].
func (s *Store) DeleteSandbox(ctx context.Context, teamID, id string) error {
	return s.deleteSandbox(ctx, nil, teamID, id)
}

// deleteSandbox is DeleteSandbox, fenced by fence unless it is nil.
func (s *Store) deleteSandbox(ctx context.Context, fence *store.Lease, teamID, id string) error {
	err := s.writeFenced(ctx, fence, func(tx *sql.Tx) error {
		var prev string
		err := tx.QueryRowContext(ctx, `DELETE FROM sandboxes WHERE team_id = ? AND id = ? RETURNING state`, teamID, id).Scan(&prev)
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
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
	sbs, err := s.querySandboxes(ctx, nil, `WHERE worker_id = ? ORDER BY created_us, id`, workerID)
	if err != nil {
		return nil, fmt.Errorf("sandboxes by worker %s: %w", workerID, err)
	}
	return sbs, nil
}

// CountSandboxesByTeam implements [store.SandboxIndex].
func (s *Store) CountSandboxesByTeam(ctx context.Context) (map[string]map[store.SandboxState]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT team_id, state, count(*) FROM sandboxes WHERE state <> 'deleted' GROUP BY team_id, state`)
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
	rows, err := s.r.QueryContext(ctx, `SELECT state, count(*) FROM sandboxes GROUP BY state`)
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
	sbs, err := s.querySandboxes(ctx, nil, `WHERE expires_us IS NOT NULL AND expires_us <= ? AND state <> ? ORDER BY expires_us, id`,
		micros(store.StoredTime(now)), store.StateDeleted)
	if err != nil {
		return nil, fmt.Errorf("expired sandboxes: %w", err)
	}
	return sbs, nil
}

// UpsertWorker implements [store.Workers].
func (s *Store) UpsertWorker(ctx context.Context, w store.Worker) error {
	if err := w.Validate(); err != nil {
		return fmt.Errorf("upsert worker: %w", err)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO workers (id, address, vcpus, memory_mib, last_heartbeat_us, protocol, capabilities)
			VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET address = excluded.address, vcpus = excluded.vcpus,
				memory_mib = excluded.memory_mib, last_heartbeat_us = excluded.last_heartbeat_us,
				protocol = excluded.protocol, capabilities = excluded.capabilities`,
			w.ID, w.Address, w.VCPUs, w.MemoryMiB, micros(store.StoredTime(w.LastHeartbeat)), w.Protocol, nullBytes(w.Capabilities))
		return err
	})
	if err != nil {
		return fmt.Errorf("upsert worker %s: %w", w.ID, err)
	}
	return nil
}

// ListWorkers implements [store.Workers].
func (s *Store) ListWorkers(ctx context.Context) ([]store.Worker, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, address, vcpus, memory_mib, last_heartbeat_us, protocol, capabilities, epoch FROM workers ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	defer rows.Close()
	var ws []store.Worker
	for rows.Next() {
		var (
			w    store.Worker
			hb   int64
			caps []byte // scanned as []byte: database/sql copies it
		)
		if err := rows.Scan(&w.ID, &w.Address, &w.VCPUs, &w.MemoryMiB, &hb, &w.Protocol, &caps, &w.Epoch); err != nil {
			return nil, fmt.Errorf("list workers: %w", err)
		}
		w.LastHeartbeat = fromMicros(hb)
		w.Capabilities = caps
		ws = append(ws, w)
	}
	if err := rows.Err(); err != nil {
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
	err := s.writeFenced(ctx, fence, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE workers SET epoch = ? WHERE id = ? AND epoch = ?`, from+1, id, from)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		var cur int64
		err = tx.QueryRowContext(ctx, `SELECT epoch FROM workers WHERE id = ?`, id).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
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
	err := s.write(ctx, func(tx *sql.Tx) error {
		return deleted(tx.ExecContext(ctx, `DELETE FROM workers WHERE id = ?`, id))
	})
	if err != nil {
		return fmt.Errorf("delete worker %s: %w", id, err)
	}
	return nil
}
