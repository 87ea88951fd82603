package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"space/internal/errkind"
	"space/internal/store"
)

// writeFenced is write that, if fence is set, first checks fence in the
// same transaction. Writes serialize on the one write connection, so
// nothing can take the lease over between the check and the commit.
func (s *Store) writeFenced(ctx context.Context, fence *store.Lease, fn func(*sql.Tx) error) error {
	if fence == nil {
		return s.write(ctx, fn)
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM leases WHERE name = ? AND token = ? AND expires_us > ?`,
			fence.Name, fence.Token, micros(time.Now())).Scan(&n); err != nil {
			return fmt.Errorf("check lease %s: %w", fence.Name, err)
		}
		if n == 0 {
			return fmt.Errorf("lease %s token %d: %w", fence.Name, fence.Token, store.ErrLeaseLost)
		}
		return fn(tx)
	})
}

// admit checks, in tx, that sb fits q.
func admit(ctx context.Context, tx *sql.Tx, q store.Quota, sb *store.Sandbox) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM teams WHERE id = ?`, sb.TeamID).Scan(&n); err != nil {
		return fmt.Errorf("team %s: %w", sb.TeamID, err)
	}
	if n == 0 {
		return fmt.Errorf("team %s: %w", sb.TeamID, store.ErrNotFound)
	}
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
// the update.
func admitResume(ctx context.Context, tx *sql.Tx, q store.Quota, sb *store.Sandbox) error {
	if !store.Live(sb.State) {
		return nil
	}
	var (
		state string
		cur   = store.Sandbox{ID: sb.ID, TeamID: sb.TeamID, State: sb.State}
	)
	err := tx.QueryRowContext(ctx, `SELECT state, version, vcpus, memory_mib FROM sandboxes WHERE team_id = ? AND id = ?`,
		sb.TeamID, sb.ID).Scan(&state, &cur.Version, &cur.VCPUs, &cur.MemoryMiB)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read sandbox: %w", err)
	}
	if cur.Version != sb.Version || store.Live(store.SandboxState(state)) {
		return nil
	}
	return admit(ctx, tx, q, &cur)
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func teamUsage(ctx context.Context, q queryRower, teamID string) (store.Usage, error) {
	args := []any{teamID}
	for _, st := range store.NotLive {
		args = append(args, string(st))
	}
	var u store.Usage
	err := q.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(vcpus), 0), coalesce(sum(memory_mib), 0)
		FROM sandboxes WHERE team_id = ? AND state NOT IN (?`+strings.Repeat(", ?", len(store.NotLive)-1)+`)`,
		args...).Scan(&u.Sandboxes, &u.VCPUs, &u.MemoryMiB)
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
	return teamUsage(ctx, s.r, teamID)
}

const leaseColumns = `name, holder, token, acquired_us, expires_us`

// scanLease reads a lease row; now (µs) decides Expired.
func scanLease(sc interface{ Scan(...any) error }, now int64) (store.Lease, error) {
	var (
		l                 store.Lease
		acquired, expires int64
	)
	if err := sc.Scan(&l.Name, &l.Holder, &l.Token, &acquired, &expires); err != nil {
		return store.Lease{}, err
	}
	l.Acquired, l.Expires = fromMicros(acquired), fromMicros(expires)
	l.Expired = expires <= now
	return l, nil
}

// AcquireLease implements [store.Leases].
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateLease(name, holder, ttl); err != nil {
		return store.Lease{}, fmt.Errorf("acquire lease: %w", err)
	}
	var out store.Lease
	err := s.write(ctx, func(tx *sql.Tx) error {
		now := micros(time.Now())
		cur, err := scanLease(tx.QueryRowContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE name = ?`, name), now)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case !cur.Expired && cur.Holder != holder:
			return fmt.Errorf("held by %s until %s: %w", cur.Holder, cur.Expires.Format(time.RFC3339Nano), errkind.Conflict)
		case !cur.Expired: // ours: extend
			out = cur
			out.Expires = fromMicros(now + ttl.Microseconds())
			_, err := tx.ExecContext(ctx, `UPDATE leases SET expires_us = ? WHERE name = ?`, micros(out.Expires), name)
			return err
		}
		var token int64
		if err := tx.QueryRowContext(ctx, `UPDATE lease_tokens SET last = last + 1 WHERE id = 1 RETURNING last`).Scan(&token); err != nil {
			return fmt.Errorf("next token: %w", err)
		}
		out = store.Lease{Name: name, Holder: holder, Token: token, Acquired: fromMicros(now), Expires: fromMicros(now + ttl.Microseconds())}
		_, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO leases (`+leaseColumns+`) VALUES (?, ?, ?, ?, ?)`,
			out.Name, out.Holder, out.Token, micros(out.Acquired), micros(out.Expires))
		return err
	})
	if err != nil {
		return store.Lease{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	return out, nil
}

// RenewLease implements [store.Leases].
func (s *Store) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateLease(l.Name, l.Holder, ttl); err != nil {
		return store.Lease{}, fmt.Errorf("renew lease: %w", err)
	}
	var out store.Lease
	err := s.write(ctx, func(tx *sql.Tx) error {
		now := micros(time.Now())
		var err error
		out, err = scanLease(tx.QueryRowContext(ctx, `UPDATE leases SET expires_us = ?
			WHERE name = ? AND holder = ? AND token = ?
			RETURNING `+leaseColumns, now+ttl.Microseconds(), l.Name, l.Holder, l.Token), now)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("token %d: %w", l.Token, store.ErrLeaseLost)
		}
		return err
	})
	if err != nil {
		return store.Lease{}, fmt.Errorf("renew lease %s: %w", l.Name, err)
	}
	return out, nil
}

// ReleaseLease implements [store.Leases].
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM leases WHERE name = ? AND holder = ? AND token = ?`, l.Name, l.Holder, l.Token)
		return err
	})
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.Name, err)
	}
	return nil
}

// ListLeases implements [store.Leases].
func (s *Store) ListLeases(ctx context.Context, prefix string) ([]store.Lease, error) {
	// substr, not LIKE: names may hold % and _. TEXT compares bytewise.
	rows, err := s.r.QueryContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE substr(name, 1, ?) = ? ORDER BY name`,
		len(prefix), prefix)
	if err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	defer rows.Close()
	now := micros(time.Now())
	var ls []store.Lease
	for rows.Next() {
		l, err := scanLease(rows, now)
		if err != nil {
			return nil, fmt.Errorf("list leases %q: %w", prefix, err)
		}
		ls = append(ls, l)
	}
	if err := rows.Err(); err != nil {
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
