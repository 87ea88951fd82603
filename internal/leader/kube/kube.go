// Package kube elects the control plane's leader on a Kubernetes
// coordination.k8s.io/v1 Lease, for replicas that share an API server
// rather than a database.
//
// The election is client-go's leaderelection protocol done by hand, so that
// its terms behave exactly like [leader.StoreElector]'s: replicas read the
// Lease and write it back with the resourceVersion they read (a conflict
// means another replica wrote first); the holder renews renewTime; a
// follower takes the Lease over only once leaseDurationSeconds have passed,
// by its own clock, since it last saw the record change (so clock skew
// between replicas does not matter); leaseTransitions grows with every new
// term and is the term's fencing token.
//
// Lock order: Elector.mu is a leaf; it is never held across a request.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"space/internal/errkind"
	kubeapi "space/internal/kube"
	"space/internal/leader"
	"space/internal/store"
)

// Config configures an Elector.
type Config struct {
	// Namespace holds the Lease. Required.
	Namespace string
	// Name is the Lease's name; "" means "space-leader".
	Name string
	// Holder names this replica (its pod name, say): unique among the
	// replicas campaigning on the Lease. Required.
	Holder string
	// TTL is how long a term lasts unless renewed; 0 means 6s. The Lease
	// records it as leaseDurationSeconds rounded up to whole seconds, and
	// followers wait that long, so a TTL under a second still makes a dead
	// leader's successor wait a second.
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

// Elector is a [leader.Elector] on a Kubernetes Lease.
type Elector struct {
	leases    coordinationv1client.LeaseInterface
	namespace string
	name      string
	holder    string
	ttl       time.Duration
	every     time.Duration
	log       *slog.Logger
	now       func() time.Time
	after     func(time.Duration) <-chan time.Time

	// Only Run's goroutine uses these.
	observed   *coordinationv1.Lease // the record as last read or written, or nil
	observedAt time.Time             // when observed last changed, by this process's clock

	mu sync.Mutex
	// +checklocks:mu
	running bool
	// +checklocks:mu
	leading bool
	// +checklocks:mu
	lease store.Lease // the current term's, if leading
	// +checklocks:mu
	deadline time.Time // by this process's clock: when the term may have expired
	// +checklocks:mu
	term context.Context // the current term's, if leading
	// +checklocks:mu
	endTerm context.CancelCauseFunc // ends term, if leading
	// +checklocks:mu
	changed chan struct{} // closed and replaced when leadership starts or ends
}

var _ leader.Elector = (*Elector)(nil)

// errHeld is returned by tryAcquireOrRenew while another replica's term on
// the Lease is still valid.
var errHeld = fmt.Errorf("lease held by another replica: %w", errkind.Conflict)

// errLost is returned by tryAcquireOrRenew when the leader finds that
// another replica wrote the Lease since its last renewal.
var errLost = fmt.Errorf("lease lost: %w", errkind.Conflict)

// New returns an elector on the Lease cfg describes, through client; it
// campaigns once Run is called. Errors wrap errkind.InvalidArgument.
func New(cfg Config, client kubernetes.Interface) (*Elector, error) {
	e := &Elector{
		namespace: cfg.Namespace, name: cfg.Name, holder: cfg.Holder, ttl: cfg.TTL, every: cfg.RenewEvery,
		log: cfg.Log, now: cfg.Now, after: cfg.After, changed: make(chan struct{}),
	}
	if e.name == "" {
		e.name = "space-leader"
	}
	if e.ttl == 0 {
		e.ttl = 6 * time.Second
	}
	if e.every == 0 {
		e.every = e.ttl / 3
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.after == nil {
		e.after = time.After
	}
	if err := e.validate(client); err != nil {
		return nil, fmt.Errorf("new lease elector: %w", err)
	}
	e.leases = client.CoordinationV1().Leases(e.namespace)
	e.log = e.log.With("component", "leader", "lease", e.namespace+"/"+e.name)
	return e, nil
}

func (e *Elector) validate(client kubernetes.Interface) error {
	if client == nil {
		return fmt.Errorf("no kubernetes client: %w", errkind.InvalidArgument)
	}
	if msgs := validation.IsDNS1123Label(e.namespace); len(msgs) > 0 {
		return fmt.Errorf("namespace %.100q: %s: %w", e.namespace, msgs[0], errkind.InvalidArgument)
	}
	if msgs := validation.IsDNS1123Subdomain(e.name); len(msgs) > 0 {
		return fmt.Errorf("lease name %.100q: %s: %w", e.name, msgs[0], errkind.InvalidArgument)
	}
	if err := store.ValidateLease(e.name, e.holder, e.ttl); err != nil {
		return err
	}
	if e.every <= 0 || e.every >= e.ttl {
		return fmt.Errorf("renew interval %v, want between 0 and ttl %v: %w", e.every, e.ttl, errkind.InvalidArgument)
	}
	return nil
}

// Run implements [leader.Elector]. It returns nil once ctx ends, after
// releasing the Lease if it led; an error only if another Run is under way.
func (e *Elector) Run(ctx context.Context) error {
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

// step acquires or renews the Lease once and returns how long to wait
// before the next step.
func (e *Elector) step(ctx context.Context) time.Duration {
	start := e.now()
	_, deadline, leading := e.current(start)
	if !leading {
		l, err := e.tryAcquireOrRenew(ctx, start, false)
		if err != nil {
			if !errors.Is(err, errkind.Conflict) && ctx.Err() == nil {
				e.log.Warn("campaign failed", "err", err)
			}
			return e.every
		}
		e.begin(l, start.Add(e.ttl))
		return e.every
	}
	// Give up the renewal when the term may have expired anyway.
	rctx, cancel := context.WithTimeout(ctx, deadline.Sub(start))
	l, err := e.tryAcquireOrRenew(rctx, start, true)
	cancel()
	now := e.now()
	switch {
	case err == nil:
		e.renewed(l, start.Add(e.ttl))
		return e.every
	case ctx.Err() != nil:
		return e.every // stopping: Run releases
	case errors.Is(err, errLost):
		e.end(fmt.Errorf("%w: lease %s: %w", leader.ErrNotLeader, e.name, err))
		return e.every
	case !now.Before(deadline):
		e.end(fmt.Errorf("%w: lease %s not renewed before it expired: %w", leader.ErrNotLeader, e.name, err))
		return e.every
	}
	e.log.Warn("renew failed", "err", err)
	return min(e.every, deadline.Sub(now))
}

// tryAcquireOrRenew writes this replica into the Lease as holder, renewed
// at start, if the Lease is free, expired, or already this replica's; as
// client-go's leaderelection does. leading says whether this replica's
// term is still valid, which decides whether the write renews the term or
// begins a new one. It returns errHeld while another replica's term is
// valid, errLost if this replica led but another has written the Lease
// since, and an error wrapping errkind.Conflict if another replica wrote
// the Lease first.
func (e *Elector) tryAcquireOrRenew(ctx context.Context, start time.Time, leading bool) (store.Lease, error) {
	// Fast path: the leader renews the record it last wrote.
	if leading && e.observed != nil {
		l, err := e.write(ctx, e.renewal(e.observed, start))
		if err == nil {
			return l, nil
		}
		e.log.Debug("renew from last record failed; reading the lease", "err", err)
	}
	cur, err := e.leases.Get(ctx, e.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return e.create(ctx, start)
	}
	if err != nil {
		return store.Lease{}, fmt.Errorf("get lease %s: %w", e.name, kubeapi.Kind(err))
	}
	e.observe(cur)
	holder := kubeapi.Deref(cur.Spec.HolderIdentity)
	switch {
	case leading && holder == e.holder:
		return e.write(ctx, e.renewal(cur, start))
	case leading:
		return store.Lease{}, fmt.Errorf("lease %s taken over by %q: %w", e.name, holder, errLost)
	case holder != "" && holder != e.holder && e.observedValid(e.now()):
		return store.Lease{}, fmt.Errorf("lease %s held by %s: %w", e.name, holder, errHeld)
	}
	return e.write(ctx, e.takeover(cur, start))
}

// renewal is cur renewed at now by this replica, in the same term.
func (e *Elector) renewal(cur *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	next := cur.DeepCopy()
	next.Spec.HolderIdentity = &e.holder
	next.Spec.LeaseDurationSeconds = kubeapi.Ptr(kubeapi.DurationSeconds(e.ttl))
	next.Spec.RenewTime = &metav1.MicroTime{Time: now}
	return next
}

// takeover is cur taken over at now by this replica, beginning a new term.
func (e *Elector) takeover(cur *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	next := e.renewal(cur, now)
	next.Spec.AcquireTime = &metav1.MicroTime{Time: now}
	next.Spec.LeaseTransitions = kubeapi.Ptr(kubeapi.Deref(cur.Spec.LeaseTransitions) + 1)
	return next
}

// create makes the Lease with this replica its first holder. The first
// term's leaseTransitions is 1, so that no term's token is 0.
func (e *Elector) create(ctx context.Context, now time.Time) (store.Lease, error) {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.namespace, Name: e.name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &e.holder,
			LeaseDurationSeconds: kubeapi.Ptr(kubeapi.DurationSeconds(e.ttl)),
			AcquireTime:          &metav1.MicroTime{Time: now},
			RenewTime:            &metav1.MicroTime{Time: now},
			LeaseTransitions:     kubeapi.Ptr[int32](1),
		},
	}
	got, err := e.leases.Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		return store.Lease{}, fmt.Errorf("create lease %s: %w", e.name, kubeapi.Kind(err))
	}
	e.observe(got)
	return e.storeLease(got), nil
}

// write updates the Lease to next, which carries the resourceVersion it
// was read at.
func (e *Elector) write(ctx context.Context, next *coordinationv1.Lease) (store.Lease, error) {
	got, err := e.leases.Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return store.Lease{}, fmt.Errorf("update lease %s: %w", e.name, kubeapi.Kind(err))
	}
	e.observe(got)
	return e.storeLease(got), nil
}

// observe records l as the Lease's current record, restarting the expiry
// count if its spec changed since last seen.
func (e *Elector) observe(l *coordinationv1.Lease) {
	if e.observed == nil || !apiequality.Semantic.DeepEqual(e.observed.Spec, l.Spec) {
		e.observedAt = e.now()
	}
	e.observed = l
}

// observedValid reports whether the observed record's term may still be
// running at now: leaseDurationSeconds since the record last changed, by
// this process's clock.
func (e *Elector) observedValid(now time.Time) bool {
	d := time.Duration(kubeapi.Deref(e.observed.Spec.LeaseDurationSeconds)) * time.Second
	return now.Before(e.observedAt.Add(d))
}

func (e *Elector) storeLease(l *coordinationv1.Lease) store.Lease {
	sl := store.Lease{Name: e.name, Holder: kubeapi.Deref(l.Spec.HolderIdentity), Token: int64(kubeapi.Deref(l.Spec.LeaseTransitions))}
	if t := l.Spec.AcquireTime; t != nil {
		sl.Acquired = t.Time
	}
	if t := l.Spec.RenewTime; t != nil {
		sl.Expires = t.Add(e.ttl)
	}
	return sl
}

// current returns the lease and its deadline if this replica leads at
// now, ending a term whose deadline passed.
func (e *Elector) current(now time.Time) (store.Lease, time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leading && !now.Before(e.deadline) {
		e.endLocked(fmt.Errorf("%w: lease %s not renewed before it expired", leader.ErrNotLeader, e.name))
	}
	return e.lease, e.deadline, e.leading
}

func (e *Elector) begin(l store.Lease, deadline time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leading, e.lease, e.deadline = true, l, deadline
	e.term, e.endTerm = context.WithCancelCause(context.Background())
	e.notifyLocked()
	e.log.Info("leading", "token", l.Token)
}

func (e *Elector) renewed(l store.Lease, deadline time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leading && e.lease.Token == l.Token {
		e.lease, e.deadline = l, deadline
	}
}

func (e *Elector) end(cause error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.endLocked(cause)
}

// +checklocks:e.mu
func (e *Elector) endLocked(cause error) {
	if !e.leading {
		return
	}
	e.endTerm(cause)
	e.leading, e.term, e.endTerm = false, nil, nil
	e.notifyLocked()
	e.log.Info("no longer leading", "token", e.lease.Token, "cause", cause)
}

// +checklocks:e.mu
func (e *Elector) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// stop ends the term, then releases the Lease (no holder, a one-second
// duration, as client-go's ReleaseOnCancel does), so a successor need not
// wait for it to expire.
func (e *Elector) stop(ctx context.Context) {
	e.mu.Lock()
	leading := e.leading
	e.endLocked(fmt.Errorf("%w: elector stopped", leader.ErrNotLeader))
	e.mu.Unlock()
	if !leading || e.observed == nil || kubeapi.Deref(e.observed.Spec.HolderIdentity) != e.holder {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.ttl)
	defer cancel()
	next := e.observed.DeepCopy()
	next.Spec.HolderIdentity = kubeapi.Ptr("")
	next.Spec.LeaseDurationSeconds = kubeapi.Ptr[int32](1)
	next.Spec.RenewTime = &metav1.MicroTime{Time: e.now()}
	_, err := e.write(rctx, next)
	if err != nil && !errors.Is(err, errkind.Conflict) { // conflict: someone else holds it now
		e.log.Warn("release failed", "err", err)
	}
}

// Leading implements [leader.Elector].
func (e *Elector) Leading() (store.Lease, bool) {
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading || !now.Before(e.deadline) {
		return store.Lease{}, false
	}
	return e.lease, true
}

// Await implements [leader.Elector].
func (e *Elector) Await(ctx context.Context) (context.Context, store.Lease, error) {
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
