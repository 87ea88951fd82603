package controlplane

import (
	"sync"
	"time"
)

// expiryHints tell this replica's leader loop of expiries set here that
// may come before its next reaping round, so that a sandbox given a 1 s
// timeout goes after about 1 s, not at the next ReapInterval tick. A
// replica that does not lead keeps only the soonest hint; expiries set by
// other replicas are found by the leader's rounds (reapExpired looks one
// interval ahead).
type expiryHints struct {
	wake chan struct{} // capacity 1: a hint is waiting

	mu sync.Mutex
	// +checklocks:mu
	soonest time.Time // zero = no hint
}

func newExpiryHints() *expiryHints { return &expiryHints{wake: make(chan struct{}, 1)} }

// note records that a sandbox expires at t.
func (h *expiryHints) note(t time.Time) {
	if t.IsZero() {
		return
	}
	h.mu.Lock()
	if h.soonest.IsZero() || t.Before(h.soonest) {
		h.soonest = t
	}
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// take returns the soonest expiry noted since the last take, or zero.
func (h *expiryHints) take() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.soonest
	h.soonest = time.Time{}
	return t
}

// retrySkipped is how soon reaping looks again at an expired sandbox it
// had to skip (being created, or claimed by an operation).
const retrySkipped = time.Second

// reapTimer runs the leader's reaping rounds: every interval at the
// latest, and at the soonest expiry it knows of.
type reapTimer struct {
	t   *time.Timer
	due time.Time // wall clock
	now func() time.Time
	max time.Duration
}

func newReapTimer(interval time.Duration, now func() time.Time) *reapTimer {
	return &reapTimer{t: time.NewTimer(interval), due: time.Now().Add(interval), now: now, max: interval}
}

// at sets the next round for the expiry next (on the server's clock), or
// one interval from now when next is zero or later than that.
func (r *reapTimer) at(next time.Time) {
	d := r.max
	if !next.IsZero() {
		d = min(d, max(next.Sub(r.now()), 0))
	}
	r.t.Reset(d)
	r.due = time.Now().Add(d)
}

// sooner moves the next round to the expiry next if that comes first.
func (r *reapTimer) sooner(next time.Time) {
	if next.IsZero() {
		return
	}
	d := max(next.Sub(r.now()), 0)
	if time.Now().Add(d).Before(r.due) {
		r.t.Reset(d)
		r.due = time.Now().Add(d)
	}
}
