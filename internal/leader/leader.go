// Package leader elects the one control plane replica that runs
// background work (reconciling, expiring, collecting garbage).
//
// A replica leads while it holds a lease in the store ([store.Leases]); the
// lease's fencing token goes with every write the leader's work makes
// ([store.Store.Fenced]), so a leader that stalled past its lease and was
// replaced cannot commit. A [LeaseElector] keeps the terms of one lease
// whose [Backend] is the store's lease rows ([New]: PostgreSQL, where
// replicas share the database, and trivially SQLite, where there is one
// control plane) or a Kubernetes Lease (package kube).
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"space/internal/errkind"
	"space/internal/store"
)

// ErrNotLeader is the cause of a term's context once leadership is lost or
// given up. It wraps errkind.FailedPrecondition.
var ErrNotLeader = fmt.Errorf("not the leader: %w", errkind.FailedPrecondition)

// Elector is background-work leadership as the control plane consumes it.
type Elector interface {
	// Run campaigns for leadership and keeps it, until ctx ends; then it
	// gives leadership up and returns.
	Run(ctx context.Context) error
	// Leading returns the leader's lease (for fenced writes) and true
	// while this replica leads.
	Leading() (store.Lease, bool)
	// Await blocks until this replica leads (or ctx ends), then returns
	// the term: a context cancelled, with a cause wrapping ErrNotLeader,
	// as soon as leadership ends, and the lease that fences its writes.
	// The term's context does not derive from ctx.
	Await(ctx context.Context) (context.Context, store.Lease, error)
}

// Leases is what New needs of the store.
type Leases interface {
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error)
	RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error)
	ReleaseLease(ctx context.Context, l store.Lease) error
}

// Config configures a LeaseElector.
type Config struct {
	// Holder names this replica: unique among the replicas sharing the
	// store (a host name and process ID, say). Required.
	Holder string
	// Name is the lease's name; "" means "leader".
	Name string
	// TTL is how long the lease lasts unless renewed; 0 means 6s. A dead
	// leader's successor takes over within TTL plus RenewEvery.
	TTL time.Duration
	// RenewEvery is how often the leader renews and a follower tries to
	// take over; 0 means TTL/3. It must be below TTL.
	RenewEvery time.Duration
	// Log receives failures to renew or release; nil discards them.
	Log *slog.Logger
	// Now and After are the clock; nil means time.Now and time.After.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
}

// WithDefaults returns cfg with its zero fields defaulted, name for Name.
func (cfg Config) WithDefaults(name string) Config {
	if cfg.Name == "" {
		cfg.Name = name
	}
	if cfg.TTL == 0 {
		cfg.TTL = 6 * time.Second
	}
	if cfg.RenewEvery == 0 {
		cfg.RenewEvery = cfg.TTL / 3
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	return cfg
}

// Backend is where a LeaseElector's lease lives. Only the elector's Run
// goroutine calls it, one call at a time.
type Backend interface {
	// Acquire begins a term for the elector's holder, at now, if the
	// lease is free or expired; an error wrapping errkind.Conflict while
	// another holder's term runs.
	Acquire(ctx context.Context, now time.Time) (store.Lease, error)
	// Renew extends the term l at now; an error wrapping
	// store.ErrLeaseLost once another holder has taken the lease.
	Renew(ctx context.Context, l store.Lease, now time.Time) (store.Lease, error)
	// Release gives up the term l, so that a successor need not wait
	// for it to expire.
	Release(ctx context.Context, l store.Lease) error
}

// New returns an elector on the store's lease cfg describes; it campaigns
// once Run is called. Errors wrap errkind.InvalidArgument.
func New(cfg Config, leases Leases) (*LeaseElector, error) {
	cfg = cfg.WithDefaults("leader")
	if err := store.ValidateLease(cfg.Name, cfg.Holder, cfg.TTL); err != nil {
		return nil, fmt.Errorf("new elector: %w", err)
	}
	return NewLeaseElector(cfg, storeBackend{leases: leases, name: cfg.Name, holder: cfg.Holder, ttl: cfg.TTL})
}

// storeBackend is a lease row of the store.
type storeBackend struct {
	leases       Leases
	name, holder string
	ttl          time.Duration
}

func (b storeBackend) Acquire(ctx context.Context, _ time.Time) (store.Lease, error) {
	return b.leases.AcquireLease(ctx, b.name, b.holder, b.ttl)
}

func (b storeBackend) Renew(ctx context.Context, l store.Lease, _ time.Time) (store.Lease, error) {
	return b.leases.RenewLease(ctx, l, b.ttl)
}

func (b storeBackend) Release(ctx context.Context, l store.Lease) error {
	return b.leases.ReleaseLease(ctx, l)
}

// LeaseElector is an [Elector] on one lease of a [Backend]: it campaigns
// and renews every RenewEvery, and a term lasts until a renewal fails past
// its TTL by this process's clock, the lease is lost, or Run ends.
type LeaseElector struct {
	backend Backend
	name    string
	ttl     time.Duration
	every   time.Duration
	log     *slog.Logger
	now     func() time.Time
	after   func(time.Duration) <-chan time.Time

	mu sync.Mutex
	// +checklocks:mu
	running bool
	// +checklocks:mu
	leading bool
	// +checklocks:mu
	lease store.Lease // the current term's, if leading
	// +checklocks:mu
	deadline time.Time // by this process's clock: when the lease may have expired
	// +checklocks:mu
	term context.Context // the current term's, if leading
	// +checklocks:mu
	endTerm context.CancelCauseFunc // ends term, if leading
	// +checklocks:mu
	changed chan struct{} // closed and replaced when leadership starts or ends
}

var _ Elector = (*LeaseElector)(nil)

// NewLeaseElector returns an elector on b; cfg.Name names the lease in
// errors and logs, and cfg.Holder is b's business. Errors wrap
// errkind.InvalidArgument.
func NewLeaseElector(cfg Config, b Backend) (*LeaseElector, error) {
	cfg = cfg.WithDefaults("leader")
	if b == nil {
		return nil, fmt.Errorf("new elector: no backend: %w", errkind.InvalidArgument)
	}
	if cfg.RenewEvery <= 0 || cfg.RenewEvery >= cfg.TTL {
		return nil, fmt.Errorf("new elector: renew interval %v, want between 0 and ttl %v: %w", cfg.RenewEvery, cfg.TTL, errkind.InvalidArgument)
	}
	return &LeaseElector{
		backend: b, name: cfg.Name, ttl: cfg.TTL, every: cfg.RenewEvery,
		log: cfg.Log.With("component", "leader", "lease", cfg.Name), now: cfg.Now, after: cfg.After,
		changed: make(chan struct{}),
	}, nil
}

// Run implements [Elector]. It returns nil once ctx ends, after releasing
// the lease if it led; an error only if another Run is under way.
func (e *LeaseElector) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return fmt.Errorf("run elector %s: already running: %w", e.name, errkind.FailedPrecondition)
	}
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()
	for {
		wait := e.step(ctx)
		select {
		case <-ctx.Done():
			e.stop(ctx)
			return nil
		case <-e.after(wait):
		}
	}
}

// step acquires or renews the lease once and returns how long to wait
// before the next step.
func (e *LeaseElector) step(ctx context.Context) time.Duration {
	start := e.now()
	l, deadline, leading := e.current(start)
	if !leading {
		l, err := e.backend.Acquire(ctx, start)
		if err != nil {
			if !errors.Is(err, errkind.Conflict) && ctx.Err() == nil {
				e.log.Warn("campaign failed", "err", err)
			}
			return e.every
		}
		e.begin(l, start.Add(e.ttl))
		return e.every
	}
	// Give up the renewal when the lease may have expired anyway.
	rctx, cancel := context.WithTimeout(ctx, deadline.Sub(start))
	nl, err := e.backend.Renew(rctx, l, start)
	cancel()
	now := e.now()
	switch {
	case err == nil:
		e.renewed(nl, start.Add(e.ttl))
		return e.every
	case ctx.Err() != nil:
		return e.every // stopping: Run releases
	case errors.Is(err, store.ErrLeaseLost):
		e.end(fmt.Errorf("%w: lease %s: %w", ErrNotLeader, e.name, err))
		return e.every
	case !now.Before(deadline):
		e.end(fmt.Errorf("%w: lease %s not renewed before it expired: %w", ErrNotLeader, e.name, err))
		return e.every
	}
	e.log.Warn("renew failed", "err", err)
	return min(e.every, deadline.Sub(now))
}

// current returns the lease and its deadline if this replica leads at
// now, ending a term whose deadline passed.
func (e *LeaseElector) current(now time.Time) (store.Lease, time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leading && !now.Before(e.deadline) {
		e.endLocked(fmt.Errorf("%w: lease %s not renewed before it expired", ErrNotLeader, e.name))
	}
	return e.lease, e.deadline, e.leading
}

func (e *LeaseElector) begin(l store.Lease, deadline time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leading, e.lease, e.deadline = true, l, deadline
	e.term, e.endTerm = context.WithCancelCause(context.Background())
	e.notifyLocked()
	e.log.Info("leading", "token", l.Token)
}

func (e *LeaseElector) renewed(l store.Lease, deadline time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leading && e.lease.Token == l.Token {
		e.lease, e.deadline = l, deadline
	}
}

func (e *LeaseElector) end(cause error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.endLocked(cause)
}

// +checklocks:e.mu
func (e *LeaseElector) endLocked(cause error) {
	if !e.leading {
		return
	}
	e.endTerm(cause)
	e.leading, e.term, e.endTerm = false, nil, nil
	e.notifyLocked()
	e.log.Info("no longer leading", "token", e.lease.Token, "cause", cause)
}

// +checklocks:e.mu
func (e *LeaseElector) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// stop ends the term, then releases the lease, so a successor need not
// wait for it to expire.
func (e *LeaseElector) stop(ctx context.Context) {
	e.mu.Lock()
	l, leading := e.lease, e.leading
	e.endLocked(fmt.Errorf("%w: elector stopped", ErrNotLeader))
	e.mu.Unlock()
	if !leading {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.ttl)
	defer cancel()
	if err := e.backend.Release(rctx, l); err != nil {
		e.log.Warn("release failed", "err", err)
	}
}

// Leading implements [Elector].
func (e *LeaseElector) Leading() (store.Lease, bool) {
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading || !now.Before(e.deadline) {
		return store.Lease{}, false
	}
	return e.lease, true
}

// Await implements [Elector].
func (e *LeaseElector) Await(ctx context.Context) (context.Context, store.Lease, error) {
	for {
		now := e.now()
		e.mu.Lock()
		if e.leading && now.Before(e.deadline) {
			term, l := e.term, e.lease
			e.mu.Unlock()
			return term, l, nil
		}
		changed := e.changed
		e.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, store.Lease{}, fmt.Errorf("await leadership of %s: %w", e.name, context.Cause(ctx))
		case <-changed:
		}
	}
}
