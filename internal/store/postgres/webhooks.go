package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"space/internal/store"
)

const webhookColumns = `id, team_id, url, types, description, secret, format, enabled, disabled_reason, event_cursor, failures, created, updated`

func scanWebhook(row pgx.Row) (store.Webhook, error) {
	var w store.Webhook
	if err := row.Scan(&w.ID, &w.TeamID, &w.URL, &w.Types, &w.Description, &w.Secret, &w.Format, &w.Enabled, &w.DisabledReason,
		&w.Cursor, &w.Failures, &w.Created, &w.Updated); err != nil {
		return store.Webhook{}, err
	}
	if len(w.Types) == 0 {
		w.Types = nil
	}
	w.Created, w.Updated = w.Created.UTC(), w.Updated.UTC()
	return w, nil
}

// webhookTypes is types as the NOT NULL column takes them.
func webhookTypes(types []string) []string {
	if types == nil {
		return []string{}
	}
	return types
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
	_, err := s.pool.Exec(ctx, `INSERT INTO webhooks (`+webhookColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		w.ID, w.TeamID, w.URL, webhookTypes(w.Types), w.Description, w.Secret, w.Format, w.Enabled, w.DisabledReason,
		w.Cursor, w.Failures, w.Created, w.Updated)
	if err != nil {
		return store.Webhook{}, fmt.Errorf("create webhook %s: %w", w.ID, mapErr(err, "team "+w.TeamID))
	}
	return w, nil
}

// Webhook implements [store.Webhooks].
func (s *Store) Webhook(ctx context.Context, teamID, id string) (store.Webhook, error) {
	w, err := scanWebhook(s.pool.QueryRow(ctx, `SELECT `+webhookColumns+` FROM webhooks
		WHERE team_id = $1 AND id = $2`, teamID, id))
	if err != nil {
		return store.Webhook{}, fmt.Errorf("webhook %.100s: %w", id, notFound(err))
	}
	return w, nil
}

func (s *Store) queryWebhooks(ctx context.Context, what, where string, args ...any) ([]store.Webhook, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE `+where+` ORDER BY created, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Webhook, error) { return scanWebhook(r) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if out == nil {
		out = []store.Webhook{}
	}
	return out, nil
}

// ListWebhooks implements [store.Webhooks].
func (s *Store) ListWebhooks(ctx context.Context, teamID string) ([]store.Webhook, error) {
	return s.queryWebhooks(ctx, "list webhooks of "+teamID, `team_id = $1`, teamID)
}

// EnabledWebhooks implements [store.Webhooks].
func (s *Store) EnabledWebhooks(ctx context.Context) ([]store.Webhook, error) {
	return s.queryWebhooks(ctx, "list enabled webhooks", `enabled`)
}

// UpdateWebhook implements [store.Webhooks].
func (s *Store) UpdateWebhook(ctx context.Context, w store.Webhook) (store.Webhook, error) {
	if err := w.Validate(); err != nil {
		return store.Webhook{}, fmt.Errorf("update webhook: %w", err)
	}
	now := store.StoredTime(time.Now())
	out, err := scanWebhook(s.pool.QueryRow(ctx, `UPDATE webhooks SET url = $1, types = $2, description = $3, secret = $9,
		failures = CASE WHEN NOT enabled AND $4 THEN 0 ELSE failures END,
		enabled = $4, disabled_reason = $5, updated = $6
		WHERE team_id = $7 AND id = $8 RETURNING `+webhookColumns,
		w.URL, webhookTypes(w.Types), w.Description, w.Enabled, w.DisabledReason, now, w.TeamID, w.ID, w.Secret))
	if err != nil {
		return store.Webhook{}, fmt.Errorf("update webhook %s: %w", w.ID, notFound(err))
	}
	return out, nil
}

// DeleteWebhook implements [store.Webhooks]. Its deliveries go with it
// (ON DELETE CASCADE).
func (s *Store) DeleteWebhook(ctx context.Context, teamID, id string) error {
	err := deleted(s.pool.Exec(ctx, `DELETE FROM webhooks WHERE team_id = $1 AND id = $2`, teamID, id))
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
	err := s.tx(ctx, nil, func(tx pgx.Tx) error {
		var err error
		switch {
		case d.EventSeq == 0:
			w, err = scanWebhook(tx.QueryRow(ctx, `SELECT `+webhookColumns+` FROM webhooks WHERE id = $1 FOR UPDATE`, d.WebhookID))
		case d.Delivered:
			w, err = scanWebhook(tx.QueryRow(ctx, `UPDATE webhooks SET event_cursor = GREATEST(event_cursor, $1), failures = 0
				WHERE id = $2 RETURNING `+webhookColumns, d.EventSeq, d.WebhookID))
		default:
			w, err = scanWebhook(tx.QueryRow(ctx, `UPDATE webhooks SET failures = failures + 1
				WHERE id = $1 RETURNING `+webhookColumns, d.WebhookID))
			if err == nil && w.Enabled && disableAfter > 0 && w.Failures >= disableAfter {
				w.Enabled, w.DisabledReason = false, store.WebhookDisabledReason(w.Failures, d)
				_, err = tx.Exec(ctx, `UPDATE webhooks SET enabled = false, disabled_reason = $1 WHERE id = $2`, w.DisabledReason, w.ID)
			}
		}
		if err != nil {
			return notFound(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries
			(webhook_id, event_seq, event_type, attempt, time, status_code, error, duration_ms, delivered)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			d.WebhookID, d.EventSeq, d.EventType, d.Attempt, now, d.StatusCode, d.Error, d.Duration.Milliseconds(), d.Delivered); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = $1 AND id <=
			(SELECT id FROM webhook_deliveries WHERE webhook_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)`,
			d.WebhookID, store.WebhookDeliveriesKept)
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
	if err := s.pool.QueryRow(ctx, `SELECT 1 FROM webhooks WHERE team_id = $1 AND id = $2`, teamID, id).Scan(&one); err != nil {
		return nil, fmt.Errorf("webhook deliveries of %.100s: %w", id, notFound(err))
	}
	rows, err := s.pool.Query(ctx, `SELECT id, webhook_id, event_seq, event_type, attempt, time, status_code, error, duration_ms, delivered
		FROM webhook_deliveries WHERE webhook_id = $1 ORDER BY id DESC LIMIT $2`, id, limit)
	if err != nil {
		return nil, fmt.Errorf("webhook deliveries of %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.WebhookDelivery, error) {
		var (
			d   store.WebhookDelivery
			dur int64
		)
		err := r.Scan(&d.ID, &d.WebhookID, &d.EventSeq, &d.EventType, &d.Attempt, &d.Time, &d.StatusCode, &d.Error, &dur, &d.Delivered)
		d.Time, d.Duration = d.Time.UTC(), time.Duration(dur)*time.Millisecond
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("webhook deliveries of %s: %w", id, err)
	}
	if out == nil {
		out = []store.WebhookDelivery{}
	}
	return out, nil
}
