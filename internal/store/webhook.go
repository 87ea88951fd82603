package store

import (
	"context"
	"fmt"
	"time"
)

// Webhooks keeps the teams' webhooks (package webhook delivers to them)
// and the log of their delivery attempts. A webhook of another team is
// reported as ErrNotFound.
type Webhooks interface {
	// CreateWebhook stores w with Created/Updated set to now (its
	// Cursor, Failures and DisabledReason as given). ErrNotFound if the
	// team does not exist, ErrAlreadyExists if the ID is taken,
	// ErrInvalid if w fails [Webhook.Validate].
	CreateWebhook(ctx context.Context, w Webhook) (Webhook, error)
	// Webhook returns the team's webhook id, Secret included, or
	// ErrNotFound.
	Webhook(ctx context.Context, teamID, id string) (Webhook, error)
	// ListWebhooks returns the team's webhooks ordered by creation.
	ListWebhooks(ctx context.Context, teamID string) ([]Webhook, error)
	// EnabledWebhooks returns the enabled webhooks of every team, ordered
	// by creation: what the dispatcher delivers to.
	EnabledWebhooks(ctx context.Context) ([]Webhook, error)
	// UpdateWebhook replaces the fields a user changes (URL, Types,
	// Description, Secret, Enabled, DisabledReason) of w.TeamID's webhook w.ID
	// and returns the new record with Updated set to now. Enabling a
	// disabled webhook sets its Failures to 0. The delivery state
	// (Cursor, Failures otherwise) is the store's: see
	// AddWebhookDelivery. ErrNotFound if the webhook does not exist,
	// ErrInvalid if w fails [Webhook.Validate].
	UpdateWebhook(ctx context.Context, w Webhook) (Webhook, error)
	// DeleteWebhook removes the team's webhook id and its delivery log,
	// or returns ErrNotFound.
	DeleteWebhook(ctx context.Context, teamID, id string) error
	// AddWebhookDelivery logs the attempt d (ID and Time set by the
	// store; the log keeps the hook's last [WebhookDeliveriesKept]) and,
	// in the same transaction, applies its outcome to the hook unless
	// d.EventSeq is 0 (a ping): a delivered attempt sets Cursor to
	// d.EventSeq if that is higher and Failures to 0; a failed one adds
	// 1 to Failures and, when they reach disableAfter (if it is above
	// 0), disables the hook with DisabledReason saying why. Updated does
	// not change. It returns the hook as it now is; ErrNotFound if d's
	// webhook does not exist.
	AddWebhookDelivery(ctx context.Context, d WebhookDelivery, disableAfter int) (Webhook, error)
	// WebhookDeliveries returns the last limit (at most
	// WebhookDeliveriesKept; 0 = all kept) attempts of the team's webhook
	// id, newest first. ErrNotFound if the webhook does not exist.
	WebhookDeliveries(ctx context.Context, teamID, id string, limit int) ([]WebhookDelivery, error)
}

// Webhook is a team's subscription to its lifecycle events: the
// dispatcher POSTs each event after Cursor whose type is in Types to URL,
// signed with Secret.
type Webhook struct {
	ID     string // NewWebhookID
	TeamID string
	// URL is where events are sent: an absolute http(s) URL of at most
	// 2048 bytes (the control plane checks where it leads).
	URL string
	// Types are the event types sent, at most 64; empty = all.
	Types []string
	// Description is the user's note: at most 256 bytes.
	Description string
	// Secret keys the signatures: 1 to 256 bytes.
	Secret string
	// Format is how deliveries are written and signed: "" for SPACE's
	// (package webhook), "e2b" for E2B's (served by the E2B facade).
	Format string
	// Enabled is false once the user or the dispatcher disabled it.
	Enabled bool
	// DisabledReason says why the dispatcher disabled it, or "".
	DisabledReason string
	// Cursor is the sequence number of the last event delivered (0 =
	// none): delivery resumes after it.
	Cursor int64
	// Failures counts the attempts that failed since the last delivered
	// one.
	Failures int
	Created  time.Time // set by the store
	Updated  time.Time // set by the store when the user changes it
}

// WebhookDelivery is one attempt to deliver an event to a webhook.
type WebhookDelivery struct {
	ID        int64 // set by the store, increasing
	WebhookID string
	// EventSeq is the event's sequence number; 0 for a ping.
	EventSeq int64
	// EventType is the event's type ("ping" for a ping).
	EventType string
	Attempt   int       // 1 for the first attempt at this event
	Time      time.Time // set by the store: when it was logged
	// StatusCode is the receiver's HTTP status, or 0 if none came.
	StatusCode int
	// Error says why the attempt failed, or "" (at most 1 KiB is kept).
	Error    string
	Duration time.Duration // kept to the millisecond
	// Delivered is whether the receiver took it (a 2xx status).
	Delivered bool
}

// WebhookFormatE2B is the [Webhook.Format] of E2B's deliveries.
const WebhookFormatE2B = "e2b"

// WebhookDeliveriesKept is how many delivery attempts the log keeps per
// webhook: older ones are pruned as new ones come.
const WebhookDeliveriesKept = 200

const (
	webhookPrefix      = "whk_"
	maxWebhookURL      = 2048
	maxWebhookTypes    = 64
	maxWebhookType     = 64
	maxWebhookNote     = 256
	maxWebhookSecret   = 256
	maxDeliveryError   = 1024
	maxDisabledMessage = 1024
)

// NewWebhookID returns a fresh webhook ID.
func NewWebhookID() string { return NewID(webhookPrefix) }

// ValidWebhookID reports whether id has the form NewWebhookID produces.
func ValidWebhookID(id string) bool { return validRandomID(id, webhookPrefix) }

// Validate checks w's caller-set fields; errors wrap ErrInvalid. It does
// not judge where the URL leads.
func (w *Webhook) Validate() error {
	switch {
	case !ValidWebhookID(w.ID):
		return invalid("webhook id %q", w.ID)
	case !ValidID(w.TeamID):
		return invalid("webhook %s: team id %q", w.ID, w.TeamID)
	case w.URL == "" || len(w.URL) > maxWebhookURL:
		return invalid("webhook %s: url of %d bytes (1 to %d)", w.ID, len(w.URL), maxWebhookURL)
	case len(w.Types) > maxWebhookTypes:
		return invalid("webhook %s: %d types (at most %d)", w.ID, len(w.Types), maxWebhookTypes)
	case len(w.Description) > maxWebhookNote:
		return invalid("webhook %s: description longer than %d bytes", w.ID, maxWebhookNote)
	case w.Secret == "" || len(w.Secret) > maxWebhookSecret:
		return invalid("webhook %s: secret of %d bytes (1 to %d)", w.ID, len(w.Secret), maxWebhookSecret)
	case w.Format != "" && w.Format != WebhookFormatE2B:
		return invalid("webhook %s: format %q", w.ID, w.Format)
	case len(w.DisabledReason) > maxDisabledMessage:
		return invalid("webhook %s: disabled reason longer than %d bytes", w.ID, maxDisabledMessage)
	case w.Cursor < 0 || w.Failures < 0:
		return invalid("webhook %s: negative cursor or failures", w.ID)
	}
	for _, t := range w.Types {
		if t == "" || len(t) > maxWebhookType {
			return invalid("webhook %s: type %q", w.ID, t)
		}
	}
	return nil
}

// Validate checks d's caller-set fields; errors wrap ErrInvalid. An
// Error longer than 1 KiB is not invalid: the store keeps its start.
func (d *WebhookDelivery) Validate() error {
	switch {
	case !ValidWebhookID(d.WebhookID):
		return invalid("delivery: webhook id %q", d.WebhookID)
	case d.EventSeq < 0 || d.Attempt < 1 || d.Duration < 0:
		return invalid("delivery to %s: event %d attempt %d duration %v", d.WebhookID, d.EventSeq, d.Attempt, d.Duration)
	case d.EventType == "" || len(d.EventType) > maxWebhookType:
		return invalid("delivery to %s: event type %q", d.WebhookID, d.EventType)
	case d.StatusCode < 0 || d.StatusCode > 999:
		return invalid("delivery to %s: status %d", d.WebhookID, d.StatusCode)
	}
	return nil
}

// TruncatedDeliveryError is e cut to what the delivery log keeps.
func TruncatedDeliveryError(e string) string {
	if len(e) > maxDeliveryError {
		return e[:maxDeliveryError]
	}
	return e
}

// WebhookDisabledReason is the DisabledReason of a webhook the store
// disabled after failures consecutive failed attempts, the last being d.
func WebhookDisabledReason(failures int, d WebhookDelivery) string {
	last := d.Error
	if last == "" {
		last = fmt.Sprintf("status %d", d.StatusCode)
	}
	r := fmt.Sprintf("disabled after %d consecutive failed delivery attempts; the last (event %d, attempt %d): %s", failures, d.EventSeq, d.Attempt, last)
	if len(r) > maxDisabledMessage {
		r = r[:maxDisabledMessage]
	}
	return r
}
