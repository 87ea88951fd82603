package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"space/internal/store"
)

const auditColumns = `seq, time, request_id, key_id, team_id, source, method, route, targets, code, outcome, prev, hash`

func scanAudit(row pgx.Row) (store.AuditEntry, error) {
	var (
		e       store.AuditEntry
		targets string
	)
	if err := row.Scan(&e.Seq, &e.Time, &e.RequestID, &e.KeyID, &e.TeamID, &e.Source, &e.Method, &e.Route,
		&targets, &e.Code, &e.Outcome, &e.Prev, &e.Hash); err != nil {
		return store.AuditEntry{}, err
	}
	e.Time = e.Time.UTC()
	var err error
	if e.Targets, err = store.DecodeAuditTargets(targets); err != nil {
		return store.AuditEntry{}, fmt.Errorf("audit entry %d: %w", e.Seq, err)
	}
	if e.Prev == nil {
		e.Prev = []byte{}
	}
	return e, nil
}

// AppendAudit implements [store.Audit]. The head's row, locked FOR
// UPDATE, serializes the appends of every replica; the entry's time is
// the database's clock once the lock is held, so times follow the chain.
func (s *Store) AppendAudit(ctx context.Context, e store.AuditEntry) (store.AuditEntry, error) {
	if err := e.Validate(); err != nil {
		return store.AuditEntry{}, fmt.Errorf("append audit: %w", err)
	}
	in := e
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var (
			seq  int64
			hash []byte
			now  time.Time
		)
		if err := tx.QueryRow(ctx, `SELECT head_seq, head_hash, clock_timestamp() FROM audit_chain WHERE id = 1 FOR UPDATE`).Scan(&seq, &hash, &now); err != nil {
			return fmt.Errorf("read head: %w", err)
		}
		e = store.ChainAudit(in, seq, hash, now)
		if _, err := tx.Exec(ctx, `INSERT INTO audit_log (`+auditColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
			e.Seq, e.Time, e.RequestID, e.KeyID, e.TeamID, e.Source, e.Method, e.Route,
			store.EncodeAuditTargets(e.Targets), e.Code, e.Outcome, e.Prev, e.Hash); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE audit_chain SET head_seq = $1, head_hash = $2 WHERE id = 1`, e.Seq, e.Hash)
		return err
	})
	if err != nil {
		return store.AuditEntry{}, fmt.Errorf("append audit %s %s: %w", in.Method, in.Route, err)
	}
	return e, nil
}

// ListAudit implements [store.Audit].
func (s *Store) ListAudit(ctx context.Context, q store.AuditQuery) ([]store.AuditEntry, error) {
	where := []string{"seq > $1"}
	args := []any{q.After}
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, cond+" $"+strconv.Itoa(len(args)))
	}
	if q.TeamID != "" {
		add("team_id =", q.TeamID)
	}
	if !q.Since.IsZero() {
		add("time >=", microCeil(q.Since))
	}
	if !q.Until.IsZero() {
		add("time <", microCeil(q.Until))
	}
	query := `SELECT ` + auditColumns + ` FROM audit_log WHERE ` + strings.Join(where, " AND ") + ` ORDER BY seq`
	if q.Limit > 0 {
		args = append(args, q.Limit)
		query += ` LIMIT $` + strconv.Itoa(len(args))
	}
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.AuditEntry, error) { return scanAudit(r) })
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return out, nil
}

// PruneAuditBefore implements [store.Audit]. It holds the head's row
// like an append, so the anchor and the entries it removes change
// together.
func (s *Store) PruneAuditBefore(ctx context.Context, t time.Time) (int, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var head int64
		if err := tx.QueryRow(ctx, `SELECT head_seq FROM audit_chain WHERE id = 1 FOR UPDATE`).Scan(&head); err != nil {
			return fmt.Errorf("read head: %w", err)
		}
		// The last entry of the prefix before the first one at or after t.
		var (
			seq  int64
			at   time.Time
			hash []byte
		)
		err := tx.QueryRow(ctx, `SELECT seq, time, hash FROM audit_log
			WHERE seq < coalesce((SELECT min(seq) FROM audit_log WHERE time >= $1), $2)
			ORDER BY seq DESC LIMIT 1`, microCeil(t), head+1).Scan(&seq, &at, &hash)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM audit_log WHERE seq <= $1`, seq)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		_, err = tx.Exec(ctx, `UPDATE audit_chain SET anchor_seq = $1, anchor_hash = $2, anchor_time = $3 WHERE id = 1`, seq, hash, at)
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
		at *time.Time
	)
	if err := s.pool.QueryRow(ctx, `SELECT anchor_seq, anchor_hash, anchor_time FROM audit_chain WHERE id = 1`).Scan(&a.Seq, &a.Hash, &at); err != nil {
		return store.AuditAnchor{}, fmt.Errorf("audit anchor: %w", err)
	}
	if a.Seq == 0 || at == nil {
		return store.AuditAnchor{}, nil
	}
	a.Time = at.UTC()
	return a, nil
}
