package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"space/internal/store"
)

const auditColumns = `seq, time_us, request_id, key_id, team_id, source, method, route, targets, code, outcome, prev, hash`

func scanAudit(sc interface{ Scan(...any) error }) (store.AuditEntry, error) {
	var (
		e       store.AuditEntry
		us      int64
		targets string
	)
	if err := sc.Scan(&e.Seq, &us, &e.RequestID, &e.KeyID, &e.TeamID, &e.Source, &e.Method, &e.Route,
		&targets, &e.Code, &e.Outcome, &e.Prev, &e.Hash); err != nil {
		return store.AuditEntry{}, err
	}
	e.Time = fromMicros(us)
	var err error
	if e.Targets, err = store.DecodeAuditTargets(targets); err != nil {
		return store.AuditEntry{}, fmt.Errorf("audit entry %d: %w", e.Seq, err)
	}
	if e.Prev == nil {
		e.Prev = []byte{}
	}
	return e, nil
}

// AppendAudit implements [store.Audit]. Appends serialize on the one
// write connection; the head is read in the transaction all the same.
func (s *Store) AppendAudit(ctx context.Context, e store.AuditEntry) (store.AuditEntry, error) {
	if err := e.Validate(); err != nil {
		return store.AuditEntry{}, fmt.Errorf("append audit: %w", err)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		var (
			seq  int64
			hash []byte
		)
		if err := tx.QueryRowContext(ctx, `SELECT head_seq, head_hash FROM audit_chain WHERE id = 1`).Scan(&seq, &hash); err != nil {
			return fmt.Errorf("read head: %w", err)
		}
		e = store.ChainAudit(e, seq, hash, time.Now())
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit_log (`+auditColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			e.Seq, micros(e.Time), e.RequestID, e.KeyID, e.TeamID, e.Source, e.Method, e.Route,
			store.EncodeAuditTargets(e.Targets), e.Code, e.Outcome, e.Prev, e.Hash); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE audit_chain SET head_seq = ?, head_hash = ? WHERE id = 1`, e.Seq, e.Hash)
		return err
	})
	if err != nil {
		return store.AuditEntry{}, fmt.Errorf("append audit %s %s: %w", e.Method, e.Route, err)
	}
	return e, nil
}

// ListAudit implements [store.Audit].
func (s *Store) ListAudit(ctx context.Context, q store.AuditQuery) ([]store.AuditEntry, error) {
	where := []string{"seq > ?"}
	args := []any{q.After}
	if q.TeamID != "" {
		where = append(where, "team_id = ?")
		args = append(args, q.TeamID)
	}
	if !q.Since.IsZero() {
		where = append(where, "time_us >= ?")
		args = append(args, microsCeil(q.Since))
	}
	if !q.Until.IsZero() {
		where = append(where, "time_us < ?")
		args = append(args, microsCeil(q.Until))
	}
	query := `SELECT ` + auditColumns + ` FROM audit_log WHERE ` + strings.Join(where, " AND ") + ` ORDER BY seq`
	if q.Limit > 0 {
		query += ` LIMIT ?`
		args = append(args, q.Limit)
	}
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	out := []store.AuditEntry{}
	for rows.Next() {
		e, err := scanAudit(rows)
		if err != nil {
			return nil, fmt.Errorf("list audit: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return out, nil
}

// PruneAuditBefore implements [store.Audit].
func (s *Store) PruneAuditBefore(ctx context.Context, t time.Time) (int, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		// The last entry of the prefix before the first one at or after t.
		var (
			seq  int64
			us   int64
			hash []byte
		)
		err := tx.QueryRowContext(ctx, `SELECT seq, time_us, hash FROM audit_log
			WHERE seq < coalesce((SELECT min(seq) FROM audit_log WHERE time_us >= ?), (SELECT head_seq + 1 FROM audit_chain WHERE id = 1))
			ORDER BY seq DESC LIMIT 1`, microsCeil(t)).Scan(&seq, &us, &hash)
		if err == sql.ErrNoRows {
			return nil
		}
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM audit_log WHERE seq <= ?`, seq)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE audit_chain SET anchor_seq = ?, anchor_hash = ?, anchor_us = ? WHERE id = 1`, seq, hash, us)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune audit before %v: %w", t, err)
	}
	return int(n), nil
}

// AuditAnchor implements [store.Audit].
func (s *Store) AuditAnchor(ctx context.Context) (store.AuditAnchor, error) {
	var (
		a  store.AuditAnchor
		us int64
	)
	if err := s.r.QueryRowContext(ctx, `SELECT anchor_seq, anchor_hash, anchor_us FROM audit_chain WHERE id = 1`).Scan(&a.Seq, &a.Hash, &us); err != nil {
		return store.AuditAnchor{}, fmt.Errorf("audit anchor: %w", err)
	}
	if a.Seq == 0 {
		return store.AuditAnchor{}, nil
	}
	a.Time = fromMicros(us)
	return a, nil
}
