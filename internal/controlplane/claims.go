package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"space/internal/store"
)

// A claim says, in the store, that a replica works on a record: a
// sandbox's create, delete, suspend, snapshot; a snapshot being taken; a
// template being built. Reconcile leaves claimed records alone, on every
// replica; a claim whose replica died expires, and the next reconcile
// settles the record, soon (the leader watches for dead claims).
//
// Claims are not locks: two operations of one record may both hold one
// (they settle between themselves by the records' versions), as two
// replicas may. Each replica holds its own lease per claimed record,
// named claimPrefix + key + "/" + holder, and writes what the operation
// decides fenced by it ([store.Store.Fenced]): once the lease may have
// expired, those writes fail and a reconcile elsewhere can act without
// racing a replica that only stalled.
const (
	claimPrefix = "claim/"
	// claimTTL is how long a claim outlives a replica that stops
	// renewing: with the leader's watch (deadClaimsEvery), a dead
	// replica's half-done work is settled within about 7 s.
	claimTTL = 5 * time.Second
	// claimRenew is how often held claims are renewed: three tries in a
	// ttl, so one slow round trip loses nothing.
	claimRenew = 1500 * time.Millisecond
)

// claims are this replica's claims.
type claims struct {
	leases  store.Leases
	replica string // this replica's ID
	holder  string // this process's: holderOf(replica)
	log     *slog.Logger
	ttl     time.Duration
	every   time.Duration
	lost    prometheus.Counter // counts claims lost

	mu sync.Mutex
	// +checklocks:mu
	held map[string]*heldClaim // by key
	// +checklocks:mu
	renewing bool // a renew loop runs (while held is not empty)
}

// heldClaim is one key's claim and the operations sharing it.
type heldClaim struct {
	refs int
	// ready is closed once the lease is acquired (or failed: err).
	ready chan struct{}
	lease store.Lease
	err   error
	// deadline is, by this process's clock, when the lease may expire:
	// the start of its last acquire or renewal plus the ttl.
	deadline time.Time
	// lost is set once the lease may have expired unrenewed: its holders'
	// fenced writes fail, and new claims of the key get a new lease.
	lost bool
	// released is closed once a lease no operation shares any more is
	// released in the store.
	released chan struct{}
}

// overdueLocked reports whether h was acquired and its deadline passed,
// noticed by the renewer or not. The caller holds the claims' mu.
func (h *heldClaim) overdueLocked(now time.Time) bool {
	select {
	case <-h.ready:
		return !now.Before(h.deadline)
	default:
		return false
	}
}

func newClaims(leases store.Leases, replica string, log *slog.Logger, lost prometheus.Counter) *claims {
	return &claims{leases: leases, replica: replica, holder: holderOf(replica), log: log, ttl: claimTTL, every: claimRenew, lost: lost, held: make(map[string]*heldClaim)}
}

// count is the number of claims this process holds or is taking.
func (c *claims) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

func (c *claims) name(key string) string { return claimPrefix + key + "/" + c.holder }

// claim claims key for the caller until release is called. The context
// it returns carries the claim's lease: writes made through
// Server.writes with it are fenced by the claim.
func (c *claims) claim(ctx context.Context, key string) (context.Context, func(), error) {
	ctx, release, _, err := c.take(ctx, key, false)
	return ctx, release, err
}

// take is claim; alone, it does not share a claim this process holds
// already, and returns false instead.
func (c *claims) take(ctx context.Context, key string, alone bool) (context.Context, func(), bool, error) {
	for {
		c.mu.Lock()
		h, ok := c.held[key]
		switch {
		case ok && alone:
			c.mu.Unlock()
			return ctx, nil, false, nil
		case ok && h.released != nil: // being released: wait, then claim anew
			c.mu.Unlock()
			<-h.released
			continue
		case ok && !h.lost && !h.overdueLocked(time.Now()):
			h.refs++
			c.mu.Unlock()
			<-h.ready
			c.mu.Lock()
			l, err := h.lease, h.err
			c.mu.Unlock()
			if err != nil {
				c.drop(key, h)
				return ctx, nil, false, err
			}
			return withFence(ctx, l), func() { c.drop(key, h) }, true, nil
		}
		// None held, or one that may have expired: a new lease (whose
		// token fences out the old one's writes).
		h = &heldClaim{refs: 1, ready: make(chan struct{})}
		c.held[key] = h
		c.startRenewingLocked()
		c.mu.Unlock()
		start := time.Now()
		l, err := c.leases.AcquireLease(ctx, c.name(key), c.holder, c.ttl)
		c.mu.Lock()
		h.lease, h.err, h.deadline = l, err, start.Add(c.ttl)
		c.mu.Unlock()
		close(h.ready)
		if err != nil {
			c.drop(key, h)
			return ctx, nil, false, fmt.Errorf("claim %s: %w", key, err)
		}
		return withFence(ctx, l), func() { c.drop(key, h) }, true, nil
	}
}

// drop ends one operation's share of h; the last one releases the lease.
func (c *claims) drop(key string, h *heldClaim) {
	c.mu.Lock()
	h.refs--
	if h.refs > 0 {
		c.mu.Unlock()
		return
	}
	current := c.held[key] == h
	if !current {
		c.mu.Unlock()
		c.release(h) // a lost one, replaced already
		return
	}
	h.released = make(chan struct{})
	c.mu.Unlock()
	c.release(h)
	c.mu.Lock()
	delete(c.held, key)
	close(h.released)
	c.mu.Unlock()
}

func (c *claims) release(h *heldClaim) {
	if h.err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.leases.ReleaseLease(ctx, h.lease); err != nil {
		// It expires on its own; until then reconciles pass the record by.
		c.log.Warn("release claim", "lease", h.lease.Name, "err", err)
	}
}

// +checklocks:c.mu
func (c *claims) startRenewingLocked() {
	if !c.renewing {
		c.renewing = true
		go c.renewLoop()
	}
}

// renewLoop renews the held claims every c.every until none is held.
func (c *claims) renewLoop() {
	t := time.NewTicker(c.every)
	defer t.Stop()
	for range t.C {
		c.mu.Lock()
		if len(c.held) == 0 {
			c.renewing = false
			c.mu.Unlock()
			return
		}
		var due []*heldClaim
		for _, h := range c.held {
			select {
			case <-h.ready:
				if h.err == nil && !h.lost && h.released == nil {
					due = append(due, h)
				}
			default: // still being acquired
			}
		}
		c.mu.Unlock()
		for _, h := range due {
			c.renew(h)
		}
	}
}

// renew extends h, or marks it lost if it may have expired meanwhile: a
// lease renewed after its expiry would let writes through that a
// reconcile elsewhere did not expect.
func (c *claims) renew(h *heldClaim) {
	start := time.Now()
	c.mu.Lock()
	l, deadline := h.lease, h.deadline
	c.mu.Unlock()
	if !start.Before(deadline) {
		c.lose(h, errors.New("not renewed in time"))
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	nl, err := c.leases.RenewLease(ctx, l, c.ttl)
	cancel()
	if err != nil {
		if errors.Is(err, store.ErrLeaseLost) || !time.Now().Before(deadline) {
			c.lose(h, err)
		} else {
			c.log.Warn("renew claim", "lease", l.Name, "err", err)
		}
		return
	}
	c.mu.Lock()
	h.lease, h.deadline = nl, start.Add(c.ttl)
	c.mu.Unlock()
}

func (c *claims) lose(h *heldClaim, cause error) {
	c.mu.Lock()
	h.lost = true
	c.mu.Unlock()
	c.lost.Inc()
	c.log.Warn("claim lost: its operation's writes will fail", "lease", h.lease.Name, "cause", cause)
}

// holds reports whether this process holds or is taking a claim on key.
func (c *claims) holds(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.held[key]
	return ok
}

// holdsPrefix reports whether this process holds a claim on a key
// beginning with prefix.
func (c *claims) holdsPrefix(prefix string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.held {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// claimed is what every replica claims, as reconcile sees it.
type claimed map[string]bool

// busy reports whether key is claimed.
func (b claimed) busy(key string) bool { return b[key] }

// busyPrefix reports whether a key beginning with prefix is claimed.
func (b claimed) busyPrefix(prefix string) bool {
	for key := range b {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// all lists the keys claimed by the live claims of every replica, this
// one's included, and removes the leases of claims that expired or whose
// holder was an earlier life of this replica (those processes are gone:
// a replica's data directory is locked while it runs).
func (c *claims) all(ctx context.Context) (claimed, error) {
	ls, err := c.leases.ListLeases(ctx, claimPrefix)
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	out := claimed{}
	for _, l := range ls {
		key, ok := c.keyOf(l)
		if !ok {
			continue
		}
		if !c.dead(l) {
			out[key] = true
			continue
		}
		if l.Holder == c.holder {
			continue // expired but ours: its operation notices when it writes
		}
		if err := c.leases.ReleaseLease(ctx, l); err != nil {
			c.log.Warn("remove a dead claim", "lease", l.Name, "err", err)
		}
	}
	c.mu.Lock()
	for key := range c.held {
		out[key] = true
	}
	c.mu.Unlock()
	return out, nil
}

// contested reports whether a replica other than this one (or another
// life of it) has a live claim on key.
func (c *claims) contested(ctx context.Context, key string) (bool, error) {
	ls, err := c.leases.ListLeases(ctx, claimPrefix+key+"/")
	if err != nil {
		return false, fmt.Errorf("list claims of %s: %w", key, err)
	}
	for _, l := range ls {
		if k, ok := c.keyOf(l); ok && k == key && l.Holder != c.holder && !c.dead(l) {
			return true, nil
		}
	}
	return false, nil
}

// keyOf returns the key a claim's lease names.
func (c *claims) keyOf(l store.Lease) (string, bool) {
	return strings.CutSuffix(strings.TrimPrefix(l.Name, claimPrefix), "/"+l.Holder)
}

// dead reports whether a claim's lease no longer counts: it expired, or
// its holder was an earlier life of this replica.
func (c *claims) dead(l store.Lease) bool {
	return l.Expired || (l.Holder != c.holder && sameReplica(l.Holder, c.replica))
}

// Holders are "<replica>/<life>": a replica's ID, persisted, and one
// process's random life, so a restarted replica tells its dead lives'
// leases from its own.
func holderOf(replica string) string { return replica + "/" + store.NewID("") }

func sameReplica(holder, replica string) bool {
	r, _, ok := strings.Cut(holder, "/")
	return ok && r == replica
}

// fenceKey carries the lease a context's writes are fenced by.
type fenceKey struct{}

func withFence(ctx context.Context, l store.Lease) context.Context {
	return context.WithValue(ctx, fenceKey{}, l)
}

// writes returns the store's writes, fenced by the claim ctx carries if
// any.
func (s *Server) writes(ctx context.Context) store.FencedWrites {
	if l, ok := ctx.Value(fenceKey{}).(store.Lease); ok {
		return s.cfg.Store.Fenced(l)
	}
	return s.cfg.Store
}

// claim claims key (a record's ID, or a build's key) for the caller, so
// no replica's reconcile acts on it until release. Writes through
// s.writes with the returned context are fenced by the claim.
func (s *Server) claim(ctx context.Context, key string) (context.Context, func(), error) {
	return s.claims.claim(ctx, key)
}

// settle runs fix on key under a claim of this replica's, unless a claim
// of anyone's is on it already (its operation is under way: the next
// round looks again). fix gets the claim's context.
func (s *Server) settle(ctx context.Context, key string, fix func(context.Context) error) error {
	ctx, release, ok, err := s.claims.take(ctx, key, true)
	if err != nil || !ok {
		return err
	}
	defer release()
	if busy, err := s.claims.contested(ctx, key); err != nil || busy {
		return err
	}
	return fix(ctx)
}

// anyDead reports whether a claim in the store expired, or was left by
// an earlier life of this replica: work to settle.
func (c *claims) anyDead(ctx context.Context) (bool, error) {
	ls, err := c.leases.ListLeases(ctx, claimPrefix)
	if err != nil {
		return false, fmt.Errorf("list claims: %w", err)
	}
	for _, l := range ls {
		if c.dead(l) && l.Holder != c.holder {
			return true, nil
		}
	}
	return false, nil
}
