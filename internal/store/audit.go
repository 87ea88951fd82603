package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"time"
	"unicode/utf8"
)

// Audit keeps the audit log: one entry per mutating API call and per
// refused authentication, in a hash chain (see [AuditHash]) that shows
// an edited, deleted or reordered entry.
type Audit interface {
	// AppendAudit stores e as the entry after the log's head and returns
	// it with Seq (the head's plus one), Time (the store's clock), Prev
	// (the head's Hash) and Hash set; what the caller put in those is
	// ignored. Appends serialize in every process sharing the store, so
	// the log is one chain whoever writes it. ErrInvalid if e fails
	// [AuditEntry.Validate].
	AppendAudit(ctx context.Context, e AuditEntry) (AuditEntry, error)
	// ListAudit returns the entries q selects, ascending by Seq.
	ListAudit(ctx context.Context, q AuditQuery) ([]AuditEntry, error)
	// PruneAuditBefore removes the oldest entries, up to (not including)
	// the first whose Time is not before t, and returns how many went.
	// What it removes is always a prefix of the log, so the rest stays a
	// chain: the last entry removed becomes the anchor (AuditAnchor)
	// that verification starts from.
	PruneAuditBefore(ctx context.Context, t time.Time) (int, error)
	// AuditAnchor returns the last entry pruned, or the zero anchor if
	// none ever was.
	AuditAnchor(ctx context.Context) (AuditAnchor, error)
}

// AuditEntry is one entry of the audit log: one API call that changed
// something or whose authentication was refused. It never holds a request
// body, query values or header values.
type AuditEntry struct {
	Seq       int64     // set by the store: 1 for the first entry, contiguous
	Time      time.Time // set by the store
	RequestID string    // the request's ID (package origin)
	KeyID     string    // the API key that made the call; "" if unauthenticated
	TeamID    string    // the key's team; ""  if unauthenticated
	Source    string    // the client's address
	Method    string    // the HTTP method
	// Route is the route's template ("/v1/sandboxes/{id}"), never the
	// request's path.
	Route string
	// Targets are the records the call named: the route's path values
	// by wildcard name ("id", "sid", "name", …), and "created" for the ID
	// a create made; nil if none.
	Targets map[string]string
	Code    int    // the HTTP status of the answer
	Outcome string // one of the Audit* outcomes
	Prev    []byte // set by the store: the previous entry's Hash (the anchor's for the first; empty at the start of the log)
	Hash    []byte // set by the store: AuditHash(Prev, the entry)
}

// Audit outcomes.
const (
	AuditOK              = "ok"              // 1xx to 3xx
	AuditRefused         = "refused"         // 403: authenticated, not allowed
	AuditFailed          = "failed"          // any other 4xx or 5xx
	AuditUnauthenticated = "unauthenticated" // 401
)

// AuditOutcome returns the outcome of an answer with status code.
func AuditOutcome(code int) string {
	switch {
	case code == 401:
		return AuditUnauthenticated
	case code == 403:
		return AuditRefused
	case code >= 400:
		return AuditFailed
	}
	return AuditOK
}

// AuditQuery selects entries of the audit log. Its zero value selects
// them all.
type AuditQuery struct {
	TeamID string    // only this team's entries; "" = every team's and the unauthenticated
	After  int64     // only entries with a greater Seq: a cursor
	Since  time.Time // only entries whose Time is not before it; zero = no bound
	Until  time.Time // only entries whose Time is before it; zero = no bound
	Limit  int       // at most this many, the first ones; 0 = no limit
}

// AuditAnchor is where verification of the audit log starts: the last
// entry pruned. Its zero value is the start of the log: the first entry
// then has Seq 1 and an empty Prev.
type AuditAnchor struct {
	Seq  int64
	Hash []byte
	Time time.Time // the entry's Time; zero for the start of the log
}

// Bounds of an AuditEntry's fields.
const (
	maxAuditString  = 256 // bytes, of each string field and target value
	maxAuditTargets = 16
	maxAuditTarget  = 32 // bytes of a target's name
)

// Validate checks e's caller-set fields; errors wrap ErrInvalid. Each
// string is valid UTF-8 without control characters, so that it reads
// back, and encodes (AuditHash), the same from every backend and from an
// export.
func (e AuditEntry) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"request id", e.RequestID}, {"key id", e.KeyID}, {"team id", e.TeamID},
		{"source", e.Source}, {"method", e.Method}, {"route", e.Route},
	} {
		if !validAuditString(f.v) {
			return invalid("audit entry: %s %.100q", f.name, f.v)
		}
	}
	if e.Method == "" || e.Route == "" {
		return invalid("audit entry: method %q and route %.100q are required", e.Method, e.Route)
	}
	if len(e.Targets) > maxAuditTargets {
		return invalid("audit entry: %d targets, want at most %d", len(e.Targets), maxAuditTargets)
	}
	for k, v := range e.Targets {
		if k == "" || len(k) > maxAuditTarget || !validAuditString(k) || !validAuditString(v) {
			return invalid("audit entry: target %.40q = %.100q", k, v)
		}
	}
	if e.Code < 100 || e.Code > 599 {
		return invalid("audit entry: status code %d", e.Code)
	}
	switch e.Outcome {
	case AuditOK, AuditRefused, AuditFailed, AuditUnauthenticated:
	default:
		return invalid("audit entry: outcome %.40q", e.Outcome)
	}
	return nil
}

// validAuditString reports whether s is at most 256 bytes of UTF-8
// without control characters.
func validAuditString(s string) bool {
	if len(s) > maxAuditString || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

// canonicalAudit is the hashed form of an entry: JSON, fields in this
// order, every one present.
type canonicalAudit struct {
	Seq       int64             `json:"seq"`
	Time      string            `json:"time"`
	RequestID string            `json:"request_id"`
	KeyID     string            `json:"key_id"`
	TeamID    string            `json:"team_id"`
	Source    string            `json:"source"`
	Method    string            `json:"method"`
	Route     string            `json:"route"`
	Targets   map[string]string `json:"targets"`
	Code      int               `json:"code"`
	Outcome   string            `json:"outcome"`
}

// CanonicalAudit returns the encoding of e that its hash covers: one JSON
// object without spaces or a trailing newline, with the members seq,
// time, request_id, key_id, team_id, source, method, route, targets,
// code, outcome in that order; time is RFC 3339 in UTC with as many
// fraction digits as needed (Go's time.RFC3339Nano: whole microseconds,
// trailing zeros dropped), targets an object with its members sorted
// bytewise by name ({} for none); strings are escaped as Go's
// encoding/json does with HTML escaping off. Prev and Hash are not part
// of it.
func CanonicalAudit(e AuditEntry) []byte {
	targets := e.Targets
	if targets == nil {
		targets = map[string]string{}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	// Cannot fail: strings, integers and a map of strings.
	_ = enc.Encode(canonicalAudit{
		Seq: e.Seq, Time: e.Time.UTC().Format(time.RFC3339Nano),
		RequestID: e.RequestID, KeyID: e.KeyID, TeamID: e.TeamID, Source: e.Source,
		Method: e.Method, Route: e.Route, Targets: targets, Code: e.Code, Outcome: e.Outcome,
	})
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// AuditHash returns the hash of entry e that follows an entry whose hash
// is prev (empty for the first entry of the log): SHA-256 of prev
// followed by CanonicalAudit(e). The stores chain entries with it, and
// verification (package audit) recomputes it.
func AuditHash(prev []byte, e AuditEntry) []byte {
	h := sha256.New()
	h.Write(prev)
	h.Write(CanonicalAudit(e))
	return h.Sum(nil)
}

// ChainAudit returns e as the entry that follows the head of a log whose
// last entry has seq and hash, appended at now: what AppendAudit stores.
// For the backends, which call it in the transaction that read the head.
func ChainAudit(e AuditEntry, seq int64, hash []byte, now time.Time) AuditEntry {
	e.Seq = seq + 1
	e.Time = StoredTime(now)
	e.Prev = bytes.Clone(hash)
	if e.Prev == nil {
		e.Prev = []byte{}
	}
	if len(e.Targets) == 0 {
		e.Targets = nil
	} else {
		e.Targets = maps.Clone(e.Targets)
	}
	e.Hash = AuditHash(e.Prev, e)
	return e
}

// EncodeAuditTargets is how the backends store an entry's Targets: a
// JSON object ({} for none).
func EncodeAuditTargets(t map[string]string) string {
	if t == nil {
		return "{}"
	}
	b, _ := json.Marshal(t) // cannot fail: a map of strings
	return string(b)
}

// DecodeAuditTargets reads what EncodeAuditTargets wrote; {} is nil.
func DecodeAuditTargets(s string) (map[string]string, error) {
	var t map[string]string
	if err := json.Unmarshal([]byte(s), &t); err != nil {
		return nil, fmt.Errorf("audit targets: %w", err)
	}
	if len(t) == 0 {
		return nil, nil
	}
	return t, nil
}
