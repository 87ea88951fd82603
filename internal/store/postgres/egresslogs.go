package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"space/internal/store"
)

const egressLogColumns = `team_id, sandbox_id, log_id, created, data`

func scanEgressLog(row pgx.Row) (store.EgressLog, error) {
	var e store.EgressLog
	if err := row.Scan(&e.TeamID, &e.SandboxID, &e.LogID, &e.Created, &e.Data); err != nil {
		return store.EgressLog{}, err
	}
	e.Created = e.Created.UTC()
	e.Data = emptyNil(e.Data)
	return e, nil
}

// emptyNil returns b, or nil if it is empty: how [store.EgressLog.Data]
// comes back.
func emptyNil(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// PutEgressLog implements [store.EgressLogs].
func (s *Store) PutEgressLog(ctx context.Context, seg store.EgressLog) (store.EgressLog, error) {
	if err := seg.Validate(); err != nil {
		return store.EgressLog{}, fmt.Errorf("put egress log: %w", err)
	}
	seg.Data = emptyNil(append([]byte(nil), seg.Data...))
	data := seg.Data
	if data == nil {
		data = []byte{} // pgx sends a nil slice as NULL; the column is NOT NULL
	}
	// A replacement keeps the row's created, which RETURNING reports.
	err := s.pool.QueryRow(ctx, `INSERT INTO egress_logs (`+egressLogColumns+`) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (team_id, sandbox_id, log_id) DO UPDATE SET data = excluded.data
		RETURNING created`,
		seg.TeamID, seg.SandboxID, seg.LogID, store.StoredTime(time.Now()), data).Scan(&seg.Created)
	if err != nil {
		return store.EgressLog{}, fmt.Errorf("put egress log %s of %s: %w", seg.LogID, seg.SandboxID, mapErr(err, "team "+seg.TeamID))
	}
	seg.Created = seg.Created.UTC()
	return seg, nil
}

// EgressLogs implements [store.EgressLogs].
func (s *Store) EgressLogs(ctx context.Context, teamID, sandboxID string) ([]store.EgressLog, error) {
	// COLLATE "C": bytewise, whatever the database's collation.
	rows, err := s.pool.Query(ctx, `SELECT `+egressLogColumns+` FROM egress_logs
		WHERE team_id = $1 AND sandbox_id = $2 ORDER BY created, log_id COLLATE "C"`, teamID, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("egress logs of %s: %w", sandboxID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.EgressLog, error) { return scanEgressLog(r) })
	if err != nil {
		return nil, fmt.Errorf("egress logs of %s: %w", sandboxID, err)
	}
	return out, nil
}

// DeleteEgressLogsBefore implements [store.EgressLogs].
func (s *Store) DeleteEgressLogsBefore(ctx context.Context, t time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM egress_logs WHERE created < $1`, microCeil(t))
	if err != nil {
		return 0, fmt.Errorf("delete egress logs before %v: %w", t, err)
	}
	return int(tag.RowsAffected()), nil
}

// microCeil is t rounded up to a whole microsecond, the precision of
// timestamptz (pgx would drop the rest of t, rounding it down): a stored
// time is before t exactly when it is before microCeil(t).
func microCeil(t time.Time) time.Time {
	c := t.Truncate(time.Microsecond)
	if c.Before(t) {
		c = c.Add(time.Microsecond)
	}
	return c
}
