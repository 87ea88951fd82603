package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"space/internal/errkind"
	"space/internal/store"
)

// querier is what a write needs of the pool or of a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// write runs fn on the pool, or, if fence is set, in a transaction that
// first checks fence (see checkFence).
func (s *Store) write(ctx context.Context, fence *store.Lease, fn func(querier) error) error {
	if fence == nil {
		return fn(s.pool)
	}
	return s.tx(ctx, fence, func(tx pgx.Tx) error { return fn(tx) })
}

// tx runs fn in a transaction, after checking fence unless it is nil.
func (s *Store) tx(ctx context.Context, fence *store.Lease, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if fence != nil {
			if err := checkFence(ctx, tx, fence); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// checkFence returns ErrLeaseLost unless l is held, unexpired, with its
// token. FOR KEY SHARE keeps the row until tx ends: a takeover (which
// changes token, a unique key) or a release waits for tx, so what tx
// writes commits before the next holder's lease exists; a renewal (which
// changes only expires) does not wait.
func checkFence(ctx context.Context, tx pgx.Tx, l *store.Lease) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM leases WHERE name = $1 AND token = $2 AND expires > clock_timestamp() FOR KEY SHARE`,
		l.Name, l.Token).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("lease %s token %d: %w", l.Name, l.Token, store.ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("check lease %s: %w", l.Name, err)
	}
	return nil
}

// admit locks sb's team row, so the team's quota-checked creates and
// resumes serialize across every connection (FOR NO KEY UPDATE: inserts
// that reference the team, which take FOR KEY SHARE, do not wait), and
// checks that sb fits q.
func admit(ctx context.Context, tx pgx.Tx, q store.Quota, sb *store.Sandbox) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM teams WHERE id = $1 FOR NO KEY UPDATE`, sb.TeamID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("team %s: %w", sb.TeamID, store.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("lock team %s: %w", sb.TeamID, err)
	}
	// A new statement: under READ COMMITTED it sees every create and
	// resume that held the lock before.
	u, err := teamUsage(ctx, tx, sb.TeamID)
	if err != nil {
		return err
	}
	return q.Admit(sb.TeamID, u, sb)
}

// admitResume checks, in tx, that sb fits q if writing it would make the
// stored sandbox live again; sb counts with the VCPUs and MemoryMiB
// stored with it, as an update keeps those. Otherwise it checks nothing
// and leaves the outcome (not found, a version conflict, the write) to
// the update. It locks the row as the update would, before the team row,
// so the state it reads is the one the update replaces, and the sandbox,
// not live while locked, is not among the team's usage.
func admitResume(ctx context.Context, tx pgx.Tx, q store.Quota, sb *store.Sandbox) error {
	if !store.Live(sb.State) {
		return nil
	}
	var (
		state string
		cur   = store.Sandbox{ID: sb.ID, TeamID: sb.TeamID, State: sb.State}
	)
	err := tx.QueryRow(ctx, `SELECT state, version, vcpus, memory_mib FROM sandboxes WHERE team_id = $1 AND id = $2 FOR NO KEY UPDATE`,
		sb.TeamID, sb.ID).Scan(&state, &cur.Version, &cur.VCPUs, &cur.MemoryMiB)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lock sandbox: %w", err)
	}
	if cur.Version != sb.Version || store.Live(store.SandboxState(state)) {
		return nil
	}
	return admit(ctx, tx, q, &cur)
}

func notLive() []string {
	states := make([]string, len(store.NotLive))
	for i, st := range store.NotLive {
		states[i] = string(st)
	}
	return states
}

func teamUsage(ctx context.Context, q querier, teamID string) (store.Usage, error) {
	var u store.Usage
	err := q.QueryRow(ctx, `SELECT count(*), coalesce(sum(vcpus), 0)::bigint, coalesce(sum(memory_mib), 0)::bigint
		FROM sandboxes WHERE team_id = $1 AND NOT (state = ANY ($2))`, teamID, notLive()).Scan(&u.Sandboxes, &u.VCPUs, &u.MemoryMiB)
	if err != nil {
		return store.Usage{}, fmt.Errorf("usage of team %s: %w", teamID, err)
	}
	return u, nil
}

// CreateSandboxWithinQuota implements [store.Quotas].
func (s *Store) CreateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	return s.createSandbox(ctx, nil, &q, sb)
}

// UpdateSandboxWithinQuota implements [store.Quotas].
func (s *Store) UpdateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	return s.updateSandbox(ctx, nil, &q, sb)
}

// TeamUsage implements [store.Quotas].
func (s *Store) TeamUsage(ctx context.Context, teamID string) (store.Usage, error) {
	return teamUsage(ctx, s.pool, teamID)
}

const leaseColumns = `name, holder, token, acquired, expires, expires <= now()`

func scanLease(row pgx.Row) (store.Lease, error) {
	var l store.Lease
	if err := row.Scan(&l.Name, &l.Holder, &l.Token, &l.Acquired, &l.Expires, &l.Expired); err != nil {
		return store.Lease{}, err
	}
	l.Acquired, l.Expires = l.Acquired.UTC(), l.Expires.UTC()
	return l, nil
}

// AcquireLease implements [store.Leases].
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateLease(name, holder, ttl); err != nil {
		return store.Lease{}, fmt.Errorf("acquire lease: %w", err)
	}
	for {
		// One statement: a row conflict waits for the other writer and
		// re-checks the WHERE clause. The sequence advances even when its
		// value goes unused; tokens only need to grow.
		l, err := scanLease(s.pool.QueryRow(ctx, `INSERT INTO leases AS l (name, holder, token, acquired, expires)
			VALUES ($1, $2, nextval('lease_tokens'), now(), now() + $3 * interval '1 microsecond')
			ON CONFLICT (name) DO UPDATE SET
				holder = excluded.holder,
				token = CASE WHEN l.holder = excluded.holder AND l.expires > now() THEN l.token ELSE excluded.token END,
				acquired = CASE WHEN l.holder = excluded.holder AND l.expires > now() THEN l.acquired ELSE excluded.acquired END,
				expires = excluded.expires
			WHERE l.holder = excluded.holder OR l.expires <= now()
			RETURNING `+leaseColumns, name, holder, ttl.Microseconds()))
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return store.Lease{}, fmt.Errorf("acquire lease %s: %w", name, err)
		}
		cur, err := scanLease(s.pool.QueryRow(ctx, `SELECT `+leaseColumns+` FROM leases WHERE name = $1`, name))
		if errors.Is(err, pgx.ErrNoRows) {
			continue // released meanwhile: try again
		}
		if err != nil {
			return store.Lease{}, fmt.Errorf("acquire lease %s: %w", name, err)
		}
		return store.Lease{}, fmt.Errorf("acquire lease %s: held by %s until %s: %w",
			name, cur.Holder, cur.Expires.Format(time.RFC3339Nano), errkind.Conflict)
	}
}

// RenewLease implements [store.Leases].
func (s *Store) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateLease(l.Name, l.Holder, ttl); err != nil {
		return store.Lease{}, fmt.Errorf("renew lease: %w", err)
	}
	out, err := scanLease(s.pool.QueryRow(ctx, `UPDATE leases SET expires = now() + $1 * interval '1 microsecond'
		WHERE name = $2 AND holder = $3 AND token = $4
		RETURNING `+leaseColumns, ttl.Microseconds(), l.Name, l.Holder, l.Token))
	if errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("token %d: %w", l.Token, store.ErrLeaseLost)
	}
	if err != nil {
		return store.Lease{}, fmt.Errorf("renew lease %s: %w", l.Name, err)
	}
	return out, nil
}

// ReleaseLease implements [store.Leases].
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM leases WHERE name = $1 AND holder = $2 AND token = $3`, l.Name, l.Holder, l.Token)
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.Name, err)
	}
	return nil
}

// ListLeases implements [store.Leases].
func (s *Store) ListLeases(ctx context.Context, prefix string) ([]store.Lease, error) {
	// name is COLLATE "C": the order is bytewise and, with starts_with, a
	// prefix scan.
	rows, err := s.pool.Query(ctx, `SELECT `+leaseColumns+` FROM leases WHERE starts_with(name, $1) ORDER BY name`, prefix)
	if err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Lease, error) { return scanLease(r) })
	if err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	return ls, nil
}

// Fenced implements [store.Store].
func (s *Store) Fenced(l store.Lease) store.FencedWrites { return fenced{s: s, l: l} }

// fenced is the writes of Store fenced by l.
type fenced struct {
	s *Store
	l store.Lease
}

func (f fenced) CreateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	return f.s.createSandbox(ctx, &f.l, nil, sb)
}

func (f fenced) CreateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	return f.s.createSandbox(ctx, &f.l, &q, sb)
}

func (f fenced) UpdateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	return f.s.updateSandbox(ctx, &f.l, nil, sb)
}

func (f fenced) UpdateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	return f.s.updateSandbox(ctx, &f.l, &q, sb)
}

func (f fenced) DeleteSandbox(ctx context.Context, teamID, id string) error {
	return f.s.deleteSandbox(ctx, &f.l, teamID, id)
}

func (f fenced) UpdateSnapshot(ctx context.Context, sn store.Snapshot) (store.Snapshot, error) {
	return f.s.updateSnapshot(ctx, &f.l, sn)
}

func (f fenced) DeleteSnapshot(ctx context.Context, teamID, id string) error {
	return f.s.deleteSnapshot(ctx, &f.l, teamID, id)
}

func (f fenced) RaiseWorkerEpoch(ctx context.Context, id string, from int64) (int64, error) {
	return f.s.raiseWorkerEpoch(ctx, &f.l, id, from)
}

func (f fenced) UpdateTemplate(ctx context.Context, t store.Template) (store.Template, error) {
	return f.s.updateTemplate(ctx, &f.l, t)
}
