package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"space/internal/store"
)

const egressLogColumns = `team_id, sandbox_id, log_id, created_us, data`

func scanEgressLog(sc interface{ Scan(...any) error }) (store.EgressLog, error) {
	var (
		e       store.EgressLog
		data    []byte // scanned as []byte: database/sql copies it
		created int64
	)
	if err := sc.Scan(&e.TeamID, &e.SandboxID, &e.LogID, &created, &data); err != nil {
		return store.EgressLog{}, err
	}
	e.Created = fromMicros(created)
	e.Data = emptyNil(data)
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
		data = []byte{} // an empty blob: the column is NOT NULL
	}
	now := store.StoredTime(time.Now())
	var created int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		// A replacement keeps the row's created_us, which RETURNING reports.
		err := tx.QueryRowContext(ctx, `INSERT INTO egress_logs (`+egressLogColumns+`) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (team_id, sandbox_id, log_id) DO UPDATE SET data = excluded.data
			RETURNING created_us`,
			seg.TeamID, seg.SandboxID, seg.LogID, micros(now), data).Scan(&created)
		return mapErr(err, "team "+seg.TeamID)
	})
	if err != nil {
		return store.EgressLog{}, fmt.Errorf("put egress log %s of %s: %w", seg.LogID, seg.SandboxID, err)
	}
	seg.Created = fromMicros(created)
	return seg, nil
}

// EgressLogs implements [store.EgressLogs].
func (s *Store) EgressLogs(ctx context.Context, teamID, sandboxID string) ([]store.EgressLog, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+egressLogColumns+` FROM egress_logs
		WHERE team_id = ? AND sandbox_id = ? ORDER BY created_us, log_id`, teamID, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("egress logs of %s: %w", sandboxID, err)
	}
	defer rows.Close()
	out := []store.EgressLog{}
	for rows.Next() {
		e, err := scanEgressLog(rows)
		if err != nil {
			return nil, fmt.Errorf("egress logs of %s: %w", sandboxID, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("egress logs of %s: %w", sandboxID, err)
	}
	return out, nil
}

// DeleteEgressLogsBefore implements [store.EgressLogs].
func (s *Store) DeleteEgressLogsBefore(ctx context.Context, t time.Time) (int, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM egress_logs WHERE created_us < ?`, microsCeil(t))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete egress logs before %v: %w", t, err)
	}
	return int(n), nil
}

// microsCeil is t in microseconds, rounded up: a stored time (whole
// microseconds) is before t exactly when it is before microsCeil(t).
func microsCeil(t time.Time) int64 {
	us := t.UnixMicro() // rounded down, before 1970 too
	if t.Nanosecond()%1000 != 0 {
		us++
	}
	return us
}
