package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"space/internal/store"
)

// eventLock is the pg_advisory_xact_lock key every transaction that
// inserts an event takes just before the insert, and holds until it
// ends. Those transactions therefore draw their Seq (an identity) and
// commit one at a time, in Seq order: a reader that saw events up to N
// never later finds one below N, which a follower reading "after N"
// relies on. The insert is the last statement of its transaction (the
// lock is taken after every row lock), so the lock orders after all
// others and cannot deadlock with them.
const eventLock = 0x5350414345 + 1 // "SPACE" + 1: migrationLock's neighbour

const eventColumns = `seq, time, type, team_id, sandbox_id, state, prev, actor, request_id, reason, data`

// insertEvent records e in tx, setting its Seq and Time.
func insertEvent(ctx context.Context, tx pgx.Tx, e *store.Event) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(eventLock)); err != nil {
		return fmt.Errorf("record event %s: lock: %w", e.Type, err)
	}
	e.Time = store.StoredTime(time.Now())
	e.Data = cloneJSON(e.Data)
	err := tx.QueryRow(ctx, `INSERT INTO events (time, type, team_id, sandbox_id, state, prev, actor, request_id, reason, data)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING seq`,
		e.Time, e.Type, e.TeamID, e.SandboxID, string(e.State), string(e.Prev), e.Actor, e.RequestID, e.Reason,
		[]byte(e.Data)).Scan(&e.Seq)
	if err != nil {
		return fmt.Errorf("record event %s: %w", e.Type, err)
	}
	return nil
}

// recordState records the event of sb's state going from prev to
// sb.State, if that is a change (see store.StateEvent).
func recordState(ctx context.Context, tx pgx.Tx, prev store.SandboxState, sb store.Sandbox) error {
	e, ok := store.StateEvent(ctx, prev, sb)
	if !ok {
		return nil
	}
	return insertEvent(ctx, tx, &e)
}

func scanEvent(row pgx.Row) (store.Event, error) {
	var (
		e           store.Event
		state, prev string
		data        []byte
	)
	if err := row.Scan(&e.Seq, &e.Time, &e.Type, &e.TeamID, &e.SandboxID, &state, &prev, &e.Actor, &e.RequestID, &e.Reason, &data); err != nil {
		return store.Event{}, err
	}
	e.Time = e.Time.UTC()
	e.State, e.Prev = store.SandboxState(state), store.SandboxState(prev)
	if data != nil {
		e.Data = data
	}
	return e, nil
}

// AppendEvent implements [store.Events].
func (s *Store) AppendEvent(ctx context.Context, e store.Event) (store.Event, error) {
	if err := e.Validate(); err != nil {
		return store.Event{}, fmt.Errorf("append event: %w", err)
	}
	err := s.tx(ctx, nil, func(tx pgx.Tx) error { return insertEvent(ctx, tx, &e) })
	if err != nil {
		return store.Event{}, fmt.Errorf("append event of %s: %w", e.SandboxID, err)
	}
	return e, nil
}

// ListEvents implements [store.Events].
func (s *Store) ListEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	where, args := []string{`seq > $1`}, []any{q.After}
	if q.TeamID != "" {
		args = append(args, q.TeamID)
		where = append(where, fmt.Sprintf(`team_id = $%d`, len(args)))
	}
	if q.SandboxID != "" {
		args = append(args, q.SandboxID)
		where = append(where, fmt.Sprintf(`sandbox_id = $%d`, len(args)))
	}
	if !q.Since.IsZero() {
		args = append(args, q.Since)
		where = append(where, fmt.Sprintf(`time >= $%d`, len(args)))
	}
	if len(q.Types) > 0 {
		args = append(args, q.Types)
		where = append(where, fmt.Sprintf(`type = ANY ($%d)`, len(args)))
	}
	args = append(args, q.EffectiveLimit())
	rows, err := s.pool.Query(ctx, `SELECT `+eventColumns+` FROM events WHERE `+strings.Join(where, ` AND `)+
		fmt.Sprintf(` ORDER BY seq LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r) })
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	if out == nil {
		out = []store.Event{}
	}
	return out, nil
}

// DeleteEventsBefore implements [store.Events].
func (s *Store) DeleteEventsBefore(ctx context.Context, t time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM events WHERE time < $1`, microCeil(t))
	if err != nil {
		return 0, fmt.Errorf("delete events before %v: %w", t, err)
	}
	return int(tag.RowsAffected()), nil
}
