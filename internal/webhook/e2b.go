package webhook

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"space/internal/sandbox"
)

// E2B's webhooks (the E2B facade's /events/webhooks) get E2B's body and
// signature instead of SPACE's: the "sandbox.lifecycle.*" event types,
// the sandbox's E2B ID, and an e2b-signature header that is the unpadded
// base64 SHA-256 of the secret followed by the body (no timestamp: E2B's
// scheme, kept for its receivers).

// E2BTypes maps the SPACE event types that have an E2B counterpart to
// it; the other types are not sent to E2B's webhooks.
var E2BTypes = map[string]string{
	sandbox.EventCreated:      "sandbox.lifecycle.created",
	sandbox.EventDeleted:      "sandbox.lifecycle.killed",
	sandbox.EventPaused:       "sandbox.lifecycle.paused",
	sandbox.EventResumed:      "sandbox.lifecycle.resumed",
	sandbox.EventCheckpointed: "sandbox.lifecycle.checkpointed",
}

// e2bEvent is an event as E2B's webhooks send it.
type e2bEvent struct {
	Version            string          `json:"version"`
	ID                 string          `json:"id"`
	Type               string          `json:"type"`
	EventData          json.RawMessage `json:"eventData"`
	SandboxBuildID     string          `json:"sandboxBuildId"`
	SandboxExecutionID string          `json:"sandboxExecutionId"`
	SandboxID          string          `json:"sandboxId"`
	SandboxTeamID      string          `json:"sandboxTeamId"`
	SandboxTemplateID  string          `json:"sandboxTemplateId"`
	Timestamp          string          `json:"timestamp"`
}

// e2bBody is ev as E2B's webhooks send it. A type without an E2B
// counterpart (a ping) keeps its SPACE name.
func e2bBody(ev Event) ([]byte, error) {
	typ, ok := E2BTypes[ev.Type]
	if !ok {
		typ = ev.Type
	}
	data := ev.Data
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	return json.Marshal(e2bEvent{
		Version:   "v1",
		ID:        ev.ID,
		Type:      typ,
		EventData: data,
		// The facade's sandbox IDs are SPACE's without the prefix.
		SandboxID:     strings.TrimPrefix(ev.SandboxID, "sbx_"),
		SandboxTeamID: ev.Team,
		Timestamp:     ev.Time.UTC().Format(time.RFC3339),
	})
}

// E2BSignature is E2B's signature of body under secret.
func E2BSignature(secret string, body []byte) string {
	sum := sha256.Sum256(append([]byte(secret), body...))
	return base64.RawStdEncoding.EncodeToString(sum[:])
}

// signE2B sets E2B's delivery headers, and Space-Webhook-Id: the
// delivery ID is the event's, the same on every attempt.
func signE2B(h http.Header, hookID, eventID, secret string, body []byte) {
	h.Set("e2b-webhook-id", hookID)
	h.Set("e2b-delivery-id", eventID)
	h.Set("e2b-signature-version", "v1")
	h.Set("e2b-signature", E2BSignature(secret, body))
	h.Set(HeaderID, eventID)
}
