package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"space/internal/store"
)

const webhookColumns = `id, team_id, url, types, description, secret, format, enabled, disabled_reason, event_cursor, failures, created_us, updated_us`

func scanWebhook(sc interface{ Scan(...any) error }) (store.Webhook, error) {
	var (
		w                store.Webhook
		types            string
		created, updated int64
	)
	if err := sc.Scan(&w.ID, &w.TeamID, &w.URL, &types, &w.Description, &w.Secret, &w.Format, &w.Enabled, &w.DisabledReason,
		&w.Cursor, &w.Failures, &created, &updated); err != nil {
		return store.Webhook{}, err
	}
	if err := json.Unmarshal([]byte(types), &w.Types); err != nil {
		return store.Webhook{}, fmt.Errorf("webhook %s: types: %w", w.ID, err)
	}
	if len(w.Types) == 0 {
		w.Types = nil
	}
	w.Created, w.Updated = fromMicros(created), fromMicros(updated)
	return w, nil
}

func webhookTypes(types []string) string {
	if types == nil {
		types = []string{}
	}
	b, _ := json.Marshal(types) // strings always encode
	return string(b)
}

func noRows(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// CreateWebhook implements [store.Webhooks].
func (s *Store) CreateWebhook(ctx context.Context, w store.Webhook) (store.Webhook, error) {
	if err := w.Validate(); err != nil {
		return store.Webhook{}, fmt.Errorf("create webhook: %w", err)
	}
	w.Types = slices.Clone(w.Types)
	if len(w.Types) == 0 {
		w.Types = nil
	}
	w.Created = store.StoredTime(time.Now())
	w.Updated = w.Created
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO webhooks (`+webhookColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			w.ID, w.TeamID, w.URL, webhookTypes(w.Types), w.Description, w.Secret, w.Format, w.Enabled, w.DisabledReason,
			w.Cursor, w.Failures, micros(w.Created), micros(w.Updated))
		return mapErr(err, "team "+w.TeamID)
	})
	if err != nil {
		return store.Webhook{}, fmt.Errorf("create webhook %s: %w", w.ID, err)
	}
	return w, nil
}

// Webhook implements [store.Webhooks].
func (s *Store) Webhook(ctx context.Context, teamID, id string) (store.Webhook, error) {
	w, err := scanWebhook(s.r.QueryRowContext(ctx, `SELECT `+webhookColumns+` FROM webhooks
		WHERE team_id = ? AND id = ?`, teamID, id))
	if err != nil {
		return store.Webhook{}, fmt.Errorf("webhook %.100s: %w", id, noRows(err))
	}
	return w, nil
}

func (s *Store) queryWebhooks(ctx context.Context, what, where string, args ...any) ([]store.Webhook, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE `+where+` ORDER BY created_us, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	out := []store.Webhook{}
	for rows.Next() {
		w, err := scanWebhook(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// ListWebhooks implements [store.Webhooks].
func (s *Store) ListWebhooks(ctx context.Context, teamID string) ([]store.Webhook, error) {
	return s.queryWebhooks(ctx, "list webhooks of "+teamID, `team_id = ?`, teamID)
}

// EnabledWebhooks implements [store.Webhooks].
func (s *Store) EnabledWebhooks(ctx context.Context) ([]store.Webhook, error) {
	return s.queryWebhooks(ctx, "list enabled webhooks", `enabled = 1`)
}

// UpdateWebhook implements [store.Webhooks].
func (s *Store) UpdateWebhook(ctx context.Context, w store.Webhook) (store.Webhook, error) {
	if err := w.Validate(); err != nil {
		return store.Webhook{}, fmt.Errorf("update webhook: %w", err)
	}
	now := store.StoredTime(time.Now())
	var out store.Webhook
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = scanWebhook(tx.QueryRowContext(ctx, `UPDATE webhooks SET url = ?, types = ?, description = ?, secret = ?,
			failures = CASE WHEN enabled = 0 AND ? THEN 0 ELSE failures END,
			enabled = ?, disabled_reason = ?, updated_us = ?
			WHERE team_id = ? AND id = ? RETURNING `+webhookColumns,
			w.URL, webhookTypes(w.Types), w.Description, w.Secret, w.Enabled, w.Enabled, w.DisabledReason, micros(now), w.TeamID, w.ID))
		return noRows(err)
	})
	if err != nil {
		return store.Webhook{}, fmt.Errorf("update webhook %s: %w", w.ID, err)
	}
	return out, nil
}

// DeleteWebhook implements [store.Webhooks].
func (s *Store) DeleteWebhook(ctx context.Context, teamID, id string) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id IN
			(SELECT id FROM webhooks WHERE team_id = ? AND id = ?)`, teamID, id); err != nil {
			return err
		}
		return deleted(tx.ExecContext(ctx, `DELETE FROM webhooks WHERE team_id = ? AND id = ?`, teamID, id))
	})
	if err != nil {
		return fmt.Errorf("delete webhook %.100s: %w", id, err)
	}
	return nil
}

// AddWebhookDelivery implements [store.Webhooks].
func (s *Store) AddWebhookDelivery(ctx context.Context, d store.WebhookDelivery, disableAfter int) (store.Webhook, error) {
	if err := d.Validate(); err != nil {
		return store.Webhook{}, fmt.Errorf("add webhook delivery: %w", err)
	}
	d.Error = store.TruncatedDeliveryError(d.Error)
	now := store.StoredTime(time.Now())
	var w store.Webhook
	err := s.write(ctx, func(tx *sql.Tx) error {
		var err error
		switch {
		case d.EventSeq == 0:
			w, err = scanWebhook(tx.QueryRowContext(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE id = ?`, d.WebhookID))
		case d.Delivered:
			w, err = scanWebhook(tx.QueryRowContext(ctx, `UPDATE webhooks SET event_cursor = max(event_cursor, ?), failures = 0
				WHERE id = ? RETURNING `+webhookColumns, d.EventSeq, d.WebhookID))
		default:
			w, err = scanWebhook(tx.QueryRowContext(ctx, `UPDATE webhooks SET failures = failures + 1
				WHERE id = ? RETURNING `+webhookColumns, d.WebhookID))
			if err == nil && w.Enabled && disableAfter > 0 && w.Failures >= disableAfter {
				w.Enabled, w.DisabledReason = false, store.WebhookDisabledReason(w.Failures, d)
				_, err = tx.ExecContext(ctx, `UPDATE webhooks SET enabled = 0, disabled_reason = ? WHERE id = ?`, w.DisabledReason, w.ID)
			}
		}
		if err != nil {
			return noRows(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries
			(webhook_id, event_seq, event_type, attempt, time_us, status_code, error, duration_ms, delivered)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			d.WebhookID, d.EventSeq, d.EventType, d.Attempt, micros(now), d.StatusCode, d.Error, d.Duration.Milliseconds(), d.Delivered); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = ? AND id <=
			(SELECT id FROM webhook_deliveries WHERE webhook_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`,
			d.WebhookID, d.WebhookID, store.WebhookDeliveriesKept)
		return err
	})
	if err != nil {
		return store.Webhook{}, fmt.Errorf("add delivery to webhook %s: %w", d.WebhookID, err)
	}
	return w, nil
}

// WebhookDeliveries implements [store.Webhooks].
func (s *Store) WebhookDeliveries(ctx context.Context, teamID, id string, limit int) ([]store.WebhookDelivery, error) {
	if limit <= 0 || limit > store.WebhookDeliveriesKept {
		limit = store.WebhookDeliveriesKept
	}
	var one int
	if err := s.r.QueryRowContext(ctx, `SELECT 1 FROM webhooks WHERE team_id = ? AND id = ?`, teamID, id).Scan(&one); err != nil {
		return nil, fmt.Errorf("webhook deliveries of %.100s: %w", id, noRows(err))
	}
	rows, err := s.r.QueryContext(ctx, `SELECT id, webhook_id, event_seq, event_type, attempt, time_us, status_code, error, duration_ms, delivered
		FROM webhook_deliveries WHERE webhook_id = ? ORDER BY id DESC LIMIT ?`, id, limit)
	if err != nil {
		return nil, fmt.Errorf("webhook deliveries of %s: %w", id, err)
	}
	defer rows.Close()
	out := []store.WebhookDelivery{}
	for rows.Next() {
		var (
			d       store.WebhookDelivery
			at, dur int64
		)
		if err := rows.Scan(&d.ID, &d.WebhookID, &d.EventSeq, &d.EventType, &d.Attempt, &at, &d.StatusCode, &d.Error, &dur, &d.Delivered); err != nil {
			return nil, fmt.Errorf("webhook deliveries of %s: %w", id, err)
		}
		d.Time, d.Duration = fromMicros(at), time.Duration(dur)*time.Millisecond
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("webhook deliveries of %s: %w", id, err)
	}
	return out, nil
}
