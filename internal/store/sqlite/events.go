package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"space/internal/store"
)

const eventColumns = `seq, time_us, type, team_id, sandbox_id, state, prev, actor, request_id, reason, data`

// insertEvent records e in tx, setting its Seq and Time. Writes serialize
// on the one write connection, so events commit in Seq order.
func insertEvent(ctx context.Context, tx *sql.Tx, e *store.Event) error {
	e.Time = store.StoredTime(time.Now())
	e.Data = cloneJSON(e.Data)
	err := tx.QueryRowContext(ctx, `INSERT INTO events (time_us, type, team_id, sandbox_id, state, prev, actor, request_id, reason, data)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq`,
		micros(e.Time), e.Type, e.TeamID, e.SandboxID, string(e.State), string(e.Prev), e.Actor, e.RequestID, e.Reason,
		nullBytes(e.Data)).Scan(&e.Seq)
	if err != nil {
		return fmt.Errorf("record event %s: %w", e.Type, err)
	}
	return nil
}

// recordState records the event of sb's state going from prev to
// sb.State, if that is a change (see store.StateEvent).
func recordState(ctx context.Context, tx *sql.Tx, prev store.SandboxState, sb store.Sandbox) error {
	e, ok := store.StateEvent(ctx, prev, sb)
	if !ok {
		return nil
	}
	return insertEvent(ctx, tx, &e)
}

func scanEvent(sc interface{ Scan(...any) error }) (store.Event, error) {
	var (
		e           store.Event
		t           int64
		state, prev string
		data        []byte // scanned as []byte: database/sql copies it
	)
	if err := sc.Scan(&e.Seq, &t, &e.Type, &e.TeamID, &e.SandboxID, &state, &prev, &e.Actor, &e.RequestID, &e.Reason, &data); err != nil {
		return store.Event{}, err
	}
	e.Time = fromMicros(t)
	e.State, e.Prev = store.SandboxState(state), store.SandboxState(prev)
	e.Data = data
	return e, nil
}

// AppendEvent implements [store.Events].
func (s *Store) AppendEvent(ctx context.Context, e store.Event) (store.Event, error) {
	if err := e.Validate(); err != nil {
		return store.Event{}, fmt.Errorf("append event: %w", err)
	}
	err := s.write(ctx, func(tx *sql.Tx) error { return insertEvent(ctx, tx, &e) })
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
	where, args := []string{`seq > ?`}, []any{q.After}
	if q.TeamID != "" {
		where, args = append(where, `team_id = ?`), append(args, q.TeamID)
	}
	if q.SandboxID != "" {
		where, args = append(where, `sandbox_id = ?`), append(args, q.SandboxID)
	}
	if !q.Since.IsZero() {
		where, args = append(where, `time_us >= ?`), append(args, micros(q.Since))
	}
	if len(q.Types) > 0 {
		where = append(where, `type IN (?`+strings.Repeat(`, ?`, len(q.Types)-1)+`)`)
		for _, t := range q.Types {
			args = append(args, t)
		}
	}
	args = append(args, q.EffectiveLimit())
	rows, err := s.r.QueryContext(ctx, `SELECT `+eventColumns+` FROM events WHERE `+strings.Join(where, ` AND `)+
		` ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	out := []store.Event{}
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return out, nil
}

// DeleteEventsBefore implements [store.Events].
func (s *Store) DeleteEventsBefore(ctx context.Context, t time.Time) (int, error) {
	var n int64
	err := s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM events WHERE time_us < ?`, microsCeil(t))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete events before %v: %w", t, err)
	}
	return int(n), nil
}
