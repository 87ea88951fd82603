package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"space/internal/origin"
	"space/internal/sandbox"
)

// Event is one lifecycle event of a sandbox: a change of its state, which
// the store records itself in the transaction that makes the change, or
// something else the control plane appends (a checkpoint completed, a
// fork was made; see the types in package sandbox).
type Event struct {
	// Seq is the event's cursor, assigned by AppendEvent (or the write
	// that recorded it): strictly increasing, and committed in Seq order,
	// so a reader that saw every event up to N never later finds one
	// below N.
	Seq int64
	// Time is when it was recorded, set by the store.
	Time time.Time
	// Type is one of sandbox.EventTypes.
	Type      string
	TeamID    string
	SandboxID string
	// State is the state the sandbox reached ("" for an event that is not
	// a state change), Prev the one it left ("" for none).
	State SandboxState
	Prev  SandboxState
	// Actor is who or what caused it ([origin.Origin.Actor]:
	// "api_key:key_…", "policy:timeout", "leader:replica-1"), RequestID
	// the request or round of background work it came in; "" if unknown.
	Actor     string
	RequestID string
	// Reason says why, in words, where there is more to say than the type
	// (a failure's cause); at most MaxEventReason bytes.
	Reason string
	// Data holds a few details of the type (a JSON object:
	// {"snapshot_id": …}, {"child_id": …}), or nil; at most MaxEventData
	// bytes.
	Data json.RawMessage
}

// Limits of an event's free-form fields.
const (
	MaxEventReason = 1024
	MaxEventData   = 4096
)

// MaxEventLimit is the most events one ListEvents returns.
const MaxEventLimit = 1000

// EventQuery selects events for ListEvents.
type EventQuery struct {
	// TeamID restricts the events to one team's; "" means every team's
	// (for an admin: the caller checks who may ask).
	TeamID string
	// SandboxID restricts them to one sandbox's; "" means every sandbox.
	SandboxID string
	// Types restricts them to these types; nil means any type.
	Types []string
	// After returns only events whose Seq is greater: the cursor of the
	// last event the caller has. 0 starts from the oldest kept.
	After int64
	// Since returns only events recorded at or after it; zero means
	// any time.
	Since time.Time
	// Limit is the most to return: 0 or more than MaxEventLimit means
	// MaxEventLimit.
	Limit int
}

// Validate returns ErrInvalid for a malformed query.
func (q EventQuery) Validate() error {
	if q.SandboxID != "" && !ValidSandboxID(q.SandboxID) {
		return fmt.Errorf("event query: sandbox id %q: %w", q.SandboxID, ErrInvalid)
	}
	for _, t := range q.Types {
		if !sandbox.ValidEventType(t) {
			return fmt.Errorf("event query: unknown event type %q: %w", t, ErrInvalid)
		}
	}
	if q.After < 0 || q.Limit < 0 {
		return fmt.Errorf("event query: negative after or limit: %w", ErrInvalid)
	}
	return nil
}

// EffectiveLimit is q.Limit with its default and cap applied.
func (q EventQuery) EffectiveLimit() int {
	if q.Limit <= 0 || q.Limit > MaxEventLimit {
		return MaxEventLimit
	}
	return q.Limit
}

// Events keeps sandboxes' lifecycle events. Events outlive the sandbox
// record; they go only by age (DeleteEventsBefore).
//
// Besides AppendEvent, the store records an event in the same transaction
// as every change of a sandbox's state (CreateSandbox and
// CreateSandboxWithinQuota: sandbox.EventCreated; UpdateSandbox and
// UpdateSandboxWithinQuota when State changes: the type
// sandbox.EventOf(old, new); DeleteSandbox: sandbox.EventDeleted; the
// Fenced variants alike), with the actor and request ID of the write's
// context (origin.From) and the reason it carries (WithReason). A write
// that fails records nothing.
type Events interface {
	// AppendEvent records e with Seq and Time set by the store and
	// returns it. ErrInvalid if e fails [Event.Validate].
	AppendEvent(ctx context.Context, e Event) (Event, error)
	// ListEvents returns the events q selects, in Seq order. None is an
	// empty slice. ErrInvalid if q fails [EventQuery.Validate].
	ListEvents(ctx context.Context, q EventQuery) ([]Event, error)
	// DeleteEventsBefore removes every team's events recorded before t
	// and returns how many went.
	DeleteEventsBefore(ctx context.Context, t time.Time) (int, error)
}

// Validate returns ErrInvalid unless e has a known Type, a TeamID, a
// valid SandboxID, valid or empty states, a Reason and Data within their
// limits, and Data (if any) is a JSON object.
func (e Event) Validate() error {
	if !sandbox.ValidEventType(e.Type) {
		return fmt.Errorf("event: unknown type %q: %w", e.Type, ErrInvalid)
	}
	if e.TeamID == "" {
		return fmt.Errorf("event %s: empty team: %w", e.Type, ErrInvalid)
	}
	if !ValidSandboxID(e.SandboxID) {
		return fmt.Errorf("event %s: sandbox id %q: %w", e.Type, e.SandboxID, ErrInvalid)
	}
	for _, st := range []SandboxState{e.State, e.Prev} {
		if st != "" && !st.Valid() {
			return fmt.Errorf("event %s: state %q: %w", e.Type, st, ErrInvalid)
		}
	}
	if len(e.Reason) > MaxEventReason {
		return fmt.Errorf("event %s: reason of %d bytes, more than %d: %w", e.Type, len(e.Reason), MaxEventReason, ErrInvalid)
	}
	if len(e.Data) > MaxEventData {
		return fmt.Errorf("event %s: data of %d bytes, more than %d: %w", e.Type, len(e.Data), MaxEventData, ErrInvalid)
	}
	if len(e.Data) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(e.Data, &obj); err != nil || obj == nil {
			return fmt.Errorf("event %s: data is not a JSON object: %w", e.Type, ErrInvalid)
		}
	}
	return nil
}

// NewEvent returns an event of type typ about sb, with the actor and
// request ID of ctx's origin and the reason ctx carries (WithReason):
// what a backend records, and what the control plane passes to
// AppendEvent (setting Data). State is left for the caller to set.
func NewEvent(ctx context.Context, typ string, sb Sandbox) Event {
	o := origin.From(ctx)
	return Event{
		Type:      typ,
		TeamID:    sb.TeamID,
		SandboxID: sb.ID,
		Actor:     o.Actor(),
		RequestID: o.RequestID,
		Reason:    clip(ReasonFrom(ctx), MaxEventReason),
	}
}

// StateEvent returns the event a backend records when sb's state goes
// from prev ("" for a new record) to sb.State, or false if that is no
// change. A created record is sandbox.EventCreated; a deleted one should
// be passed with State sandbox.Deleted.
func StateEvent(ctx context.Context, prev SandboxState, sb Sandbox) (Event, bool) {
	typ := sandbox.EventCreated
	if prev != "" {
		typ = sandbox.EventOf(prev, sb.State)
	}
	if typ == "" {
		return Event{}, false
	}
	e := NewEvent(ctx, typ, sb)
	e.State, e.Prev = sb.State, prev
	return e, true
}

// clip cuts s to at most n bytes, on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 { // continuation byte
		n--
	}
	return s[:n]
}

type reasonKey struct{}

// WithReason returns ctx carrying reason: the words the events recorded
// by the writes made with ctx give as their Reason ("worker w1 lost",
// "boot: out of memory"). The actor and request ID come from the
// context's origin (package origin); the reason is per write, so set it
// on the context of the write it explains.
func WithReason(ctx context.Context, reason string) context.Context {
	return context.WithValue(ctx, reasonKey{}, reason)
}

// ReasonFrom returns the reason ctx carries (WithReason), or "".
func ReasonFrom(ctx context.Context) string {
	r, _ := ctx.Value(reasonKey{}).(string)
	return r
}
