package api

import "time"

// CreateWebhook is the body of POST /v1/webhooks: push the team's
// lifecycle events to URL.
type CreateWebhook struct {
	// URL receives the events (POST, JSON): https, at most 2048 bytes,
	// no user or password, and a host that resolves only to public
	// addresses (unless the server allows private targets, which also
	// admits http).
	URL string `json:"url"`
	// Types are the event types sent (see docs/operations.md, "Events");
	// empty = every type.
	Types []string `json:"types,omitempty"`
	// Description is a note for people: at most 256 bytes.
	Description string `json:"description,omitempty"`
	// Secret signs the deliveries: 16 to 256 printable ASCII bytes; ""
	// = the server makes one (whsec_…).
	Secret string `json:"secret,omitempty"`
	// Format is how deliveries are written and signed: "space" (or "")
	// for SPACE's, "e2b" for E2B's (sandbox.lifecycle.* events and an
	// e2b-signature header; what the E2B facade's webhooks use).
	Format string `json:"format,omitempty"`
}

// UpdateWebhook is the body of PATCH /v1/webhooks/{wid}; an absent field
// is left as it is.
type UpdateWebhook struct {
	URL         *string   `json:"url,omitempty"`
	Types       *[]string `json:"types,omitempty"`
	Description *string   `json:"description,omitempty"`
	// Secret replaces the signing secret (as CreateWebhook's).
	Secret *string `json:"secret,omitempty"`
	// Enabled false stops deliveries; true resumes them where they
	// stopped (after the last event delivered) and clears the failures.
	Enabled *bool `json:"enabled,omitempty"`
}

// Webhook is a team's webhook.
type Webhook struct {
	ID          string   `json:"id"`
	URL         string   `json:"url"`
	Types       []string `json:"types"` // empty = every type
	Description string   `json:"description,omitempty"`
	// Secret signs the deliveries (Space-Webhook-Signature). Only the
	// reply of POST /v1/webhooks holds it: keep it then.
	Secret string `json:"secret,omitempty"`
	// Format is "space" or "e2b" (see CreateWebhook).
	Format string `json:"format"`
	// Enabled is false once the team disabled it or the server did after
	// too many failed attempts in a row (DisabledReason says so).
	Enabled        bool   `json:"enabled"`
	DisabledReason string `json:"disabled_reason,omitempty"`
	// Cursor is the cursor of the last event delivered ("0" = none).
	Cursor string `json:"cursor"`
	// Failures counts the failed attempts since the last delivered one.
	Failures  int       `json:"failures"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// WebhookList is the reply of GET /v1/webhooks, oldest first.
type WebhookList struct {
	Webhooks []Webhook `json:"webhooks"`
}

// WebhookDelivery is one attempt to deliver an event to a webhook.
type WebhookDelivery struct {
	ID int64 `json:"id"`
	// EventID is the delivered event's ID (also its Space-Webhook-Id),
	// or "ping" for a test.
	EventID   string    `json:"event_id"`
	EventType string    `json:"event_type"`
	Attempt   int       `json:"attempt"` // 1 for the first attempt at the event
	Time      time.Time `json:"time"`
	// StatusCode is the receiver's HTTP status; 0 if none came.
	StatusCode int `json:"status_code"`
	// Error says why the attempt failed; "" when it did not.
	Error      string `json:"error,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	// Delivered is true when the receiver answered 2xx.
	Delivered bool `json:"delivered"`
}

// WebhookDeliveryList is the reply of GET /v1/webhooks/{wid}/deliveries,
// newest first.
type WebhookDeliveryList struct {
	Deliveries []WebhookDelivery `json:"deliveries"`
}
