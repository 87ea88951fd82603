// Package audit verifies the audit log's hash chain: that no entry was
// edited, deleted, inserted or moved since the store appended it.
//
// Each entry's Hash is [store.AuditHash] of its Prev and its fields, and
// its Prev is the Hash of the entry before it (of the anchor, for the
// first entry after a prune; empty at the start of the log). Verification
// recomputes every hash from the entries alone, so it runs the same on
// the server, on the CLI's download, or on an export file offline.
package audit

import (
	"bytes"
	"encoding/hex"
	"fmt"

	"space/api"
	"space/internal/errkind"
	"space/internal/store"
)

// ErrBroken is what a verification failure wraps: the log is not the
// chain the store wrote.
var ErrBroken = fmt.Errorf("audit log broken: %w", errkind.FailedPrecondition)

// Verifier checks a log one entry at a time, in the order of the log, so
// a log of any length is checked in constant memory. The zero value is
// not ready: use NewVerifier.
type Verifier struct {
	anchor store.AuditAnchor
	// Seq and hash of the last entry checked (the anchor's before any).
	seq  int64
	hash []byte
	n    int64
	// first is the Seq of the first entry checked; 0 before any.
	first int64
	err   error // the first failure; later entries are not checked
}

// NewVerifier returns a Verifier of a log that starts after anchor (the
// zero anchor: the start of the log).
func NewVerifier(anchor store.AuditAnchor) *Verifier {
	return &Verifier{anchor: anchor, seq: anchor.Seq, hash: bytes.Clone(anchor.Hash)}
}

// Add checks e, the next entry of the log. The error (the same one from
// then on) wraps ErrBroken and names e's Seq: an entry whose hash is not
// that of its fields was edited; an entry whose Seq or Prev does not
// follow the entry before was deleted, inserted or moved (or the one
// before it was).
func (v *Verifier) Add(e store.AuditEntry) error {
	if v.err != nil {
		return v.err
	}
	switch {
	case e.Seq != v.seq+1:
		what := fmt.Sprintf("entry %d follows entry %d: entries %d to %d are missing", e.Seq, v.seq, v.seq+1, e.Seq-1)
		if e.Seq <= v.seq {
			what = fmt.Sprintf("entry %d follows entry %d: out of order", e.Seq, v.seq)
		}
		v.err = fmt.Errorf("seq %d: %s: %w", e.Seq, what, ErrBroken)
	case !bytes.Equal(e.Prev, v.hash):
		v.err = fmt.Errorf("seq %d: its prev %s is not the hash %s of entry %d (an entry was deleted, replaced or moved): %w",
			e.Seq, short(e.Prev), short(v.hash), v.seq, ErrBroken)
	case !bytes.Equal(e.Hash, store.AuditHash(e.Prev, e)):
		v.err = fmt.Errorf("seq %d: its hash does not match its fields (the entry was edited): %w", e.Seq, ErrBroken)
	}
	if v.err != nil {
		return v.err
	}
	if v.first == 0 {
		v.first = e.Seq
	}
	v.seq, v.hash = e.Seq, e.Hash
	v.n++
	return nil
}

// Result is what a verification covered.
type Result struct {
	Entries     int64 // how many entries were checked
	First, Last int64 // their Seqs; 0 if none
	Anchor      store.AuditAnchor
}

// Result returns what the entries added so far cover, and the first
// failure, if any.
func (v *Verifier) Result() (Result, error) {
	r := Result{Entries: v.n, Anchor: v.anchor}
	if v.n > 0 {
		r.First, r.Last = v.first, v.seq
	}
	return r, v.err
}

// Verify checks that entries, ascending by Seq, are the whole log after
// anchor: see Verifier.Add for the errors.
func Verify(entries []store.AuditEntry, anchor store.AuditAnchor) (Result, error) {
	v := NewVerifier(anchor)
	for _, e := range entries {
		if v.Add(e) != nil {
			break
		}
	}
	return v.Result()
}

// short is the first 12 hex digits of a hash, or "(none)".
func short(h []byte) string {
	if len(h) == 0 {
		return "(none)"
	}
	s := hex.EncodeToString(h)
	if len(s) > 12 {
		s = s[:12] + "…"
	}
	return s
}

// ToAPI returns e as the API shows it.
func ToAPI(e store.AuditEntry) api.AuditEntry {
	targets := e.Targets
	if targets == nil {
		targets = map[string]string{}
	}
	return api.AuditEntry{
		Seq: e.Seq, Time: e.Time, RequestID: e.RequestID, KeyID: e.KeyID, TeamID: e.TeamID,
		Source: e.Source, Method: e.Method, Route: e.Route, Targets: targets, Code: e.Code,
		Outcome: e.Outcome, Prev: hex.EncodeToString(e.Prev), Hash: hex.EncodeToString(e.Hash),
	}
}

// FromAPI returns the entry the API showed as e, to verify it. An error
// names a hash that is not hex.
func FromAPI(e api.AuditEntry) (store.AuditEntry, error) {
	prev, err := hex.DecodeString(e.Prev)
	if err != nil {
		return store.AuditEntry{}, fmt.Errorf("audit entry %d: prev: %w", e.Seq, err)
	}
	hash, err := hex.DecodeString(e.Hash)
	if err != nil {
		return store.AuditEntry{}, fmt.Errorf("audit entry %d: hash: %w", e.Seq, err)
	}
	targets := e.Targets
	if len(targets) == 0 {
		targets = nil
	}
	return store.AuditEntry{
		Seq: e.Seq, Time: e.Time, RequestID: e.RequestID, KeyID: e.KeyID, TeamID: e.TeamID,
		Source: e.Source, Method: e.Method, Route: e.Route, Targets: targets, Code: e.Code,
		Outcome: e.Outcome, Prev: prev, Hash: hash,
	}, nil
}

// AnchorToAPI returns a as the API shows it.
func AnchorToAPI(a store.AuditAnchor) api.AuditAnchor {
	v := api.AuditAnchor{Seq: a.Seq, Hash: hex.EncodeToString(a.Hash)}
	if !a.Time.IsZero() {
		t := a.Time
		v.Time = &t
	}
	return v
}

// AnchorFromAPI returns the anchor the API showed as a.
func AnchorFromAPI(a api.AuditAnchor) (store.AuditAnchor, error) {
	hash, err := hex.DecodeString(a.Hash)
	if err != nil {
		return store.AuditAnchor{}, fmt.Errorf("audit anchor: hash: %w", err)
	}
	out := store.AuditAnchor{Seq: a.Seq, Hash: hash}
	if a.Time != nil {
		out.Time = *a.Time
	}
	return out, nil
}
