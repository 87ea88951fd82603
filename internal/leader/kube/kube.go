// Package kube elects the control plane's leader on a Kubernetes
// coordination.k8s.io/v1 Lease, for replicas that share an API server
// rather than a database.
//
// The Lease is a [leader.Backend] of a [leader.LeaseElector], so its terms
// behave as the store's lease's do. The protocol is client-go's
// leaderelection done by hand: replicas read the Lease and write it back with the resourceVersion they read (a conflict
// means another replica wrote first); the holder renews renewTime; a
// follower takes the Lease over only once leaseDurationSeconds have passed,
// by its own clock, since it last saw the record change (so clock skew
// between replicas does not matter); leaseTransitions grows with every new
// term and is the term's fencing token.
//
// Only the elector's Run goroutine calls the backend, so it takes no locks.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Config configures the elector New returns.
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

// backend is a [leader.Backend] on a Kubernetes Lease.
type backend struct {
	leases    coordinationv1client.LeaseInterface
	namespace string
	name      string
	holder    string
	ttl       time.Duration
	log       *slog.Logger
	now       func() time.Time

	observed   *coordinationv1.Lease // the record as last read or written, or nil
	observedAt time.Time             // when observed last changed, by this process's clock
}

// errHeld is returned by tryAcquireOrRenew while another replica's term on
// the Lease is still valid.
var errHeld = fmt.Errorf("lease held by another replica: %w", errkind.Conflict)

// errLost is returned by tryAcquireOrRenew when the leader finds that
// another replica wrote the Lease since its last renewal.
var errLost = fmt.Errorf("lease lost: %w", store.ErrLeaseLost)

// New returns an elector on the Lease cfg describes, through client; it
// campaigns once Run is called. Errors wrap errkind.InvalidArgument.
func New(cfg Config, client kubernetes.Interface) (*leader.LeaseElector, error) {
	lc := leader.Config{Holder: cfg.Holder, Name: cfg.Name, TTL: cfg.TTL, RenewEvery: cfg.RenewEvery, Log: cfg.Log, Now: cfg.Now, After: cfg.After}.WithDefaults("space-leader")
	e := &backend{namespace: cfg.Namespace, name: lc.Name, holder: lc.Holder, ttl: lc.TTL, now: lc.Now}
	if err := e.validate(client); err != nil {
		return nil, fmt.Errorf("new lease elector: %w", err)
	}
	e.leases = client.CoordinationV1().Leases(e.namespace)
	lc.Name = e.namespace + "/" + e.name
	e.log = lc.Log.With("component", "leader", "lease", lc.Name)
	return leader.NewLeaseElector(lc, e)
}

func (e *backend) validate(client kubernetes.Interface) error {
	if client == nil {
		return fmt.Errorf("no kubernetes client: %w", errkind.InvalidArgument)
	}
	if msgs := validation.IsDNS1123Label(e.namespace); len(msgs) > 0 {
		return fmt.Errorf("namespace %.100q: %s: %w", e.namespace, msgs[0], errkind.InvalidArgument)
	}
	if msgs := validation.IsDNS1123Subdomain(e.name); len(msgs) > 0 {
		return fmt.Errorf("lease name %.100q: %s: %w", e.name, msgs[0], errkind.InvalidArgument)
	}
	return store.ValidateLease(e.name, e.holder, e.ttl)
}

// Acquire implements [leader.Backend].
func (e *backend) Acquire(ctx context.Context, now time.Time) (store.Lease, error) {
	return e.tryAcquireOrRenew(ctx, now, false)
}

// Renew implements [leader.Backend].
func (e *backend) Renew(ctx context.Context, _ store.Lease, now time.Time) (store.Lease, error) {
	return e.tryAcquireOrRenew(ctx, now, true)
}

// tryAcquireOrRenew writes this replica into the Lease as holder, renewed
// at start, if the Lease is free, expired, or already this replica's; as
// client-go's leaderelection does. leading says whether this replica's
// term is still valid, which decides whether the write renews the term or
// begins a new one. It returns errHeld while another replica's term is
// valid, errLost if this replica led but another has written the Lease
// since, and an error wrapping errkind.Conflict if another replica wrote
// the Lease first.
func (e *backend) tryAcquireOrRenew(ctx context.Context, start time.Time, leading bool) (store.Lease, error) {
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
func (e *backend) renewal(cur *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	next := cur.DeepCopy()
	next.Spec.HolderIdentity = &e.holder
	next.Spec.LeaseDurationSeconds = kubeapi.Ptr(kubeapi.DurationSeconds(e.ttl))
	next.Spec.RenewTime = &metav1.MicroTime{Time: now}
	return next
}

// takeover is cur taken over at now by this replica, beginning a new term.
func (e *backend) takeover(cur *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	next := e.renewal(cur, now)
	next.Spec.AcquireTime = &metav1.MicroTime{Time: now}
	next.Spec.LeaseTransitions = kubeapi.Ptr(kubeapi.Deref(cur.Spec.LeaseTransitions) + 1)
	return next
}

// create makes the Lease with this replica its first holder. The first
// term's leaseTransitions is 1, so that no term's token is 0.
func (e *backend) create(ctx context.Context, now time.Time) (store.Lease, error) {
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
func (e *backend) write(ctx context.Context, next *coordinationv1.Lease) (store.Lease, error) {
	got, err := e.leases.Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return store.Lease{}, fmt.Errorf("update lease %s: %w", e.name, kubeapi.Kind(err))
	}
	e.observe(got)
	return e.storeLease(got), nil
}

// observe records l as the Lease's current record, restarting the expiry
// count if its spec changed since last seen.
func (e *backend) observe(l *coordinationv1.Lease) {
	if e.observed == nil || !apiequality.Semantic.DeepEqual(e.observed.Spec, l.Spec) {
		e.observedAt = e.now()
	}
	e.observed = l
}

// observedValid reports whether the observed record's term may still be
// running at now: leaseDurationSeconds since the record last changed, by
// this process's clock.
func (e *backend) observedValid(now time.Time) bool {
	d := time.Duration(kubeapi.Deref(e.observed.Spec.LeaseDurationSeconds)) * time.Second
	return now.Before(e.observedAt.Add(d))
}

func (e *backend) storeLease(l *coordinationv1.Lease) store.Lease {
	sl := store.Lease{Name: e.name, Holder: kubeapi.Deref(l.Spec.HolderIdentity), Token: int64(kubeapi.Deref(l.Spec.LeaseTransitions))}
	if t := l.Spec.AcquireTime; t != nil {
		sl.Acquired = t.Time
	}
	if t := l.Spec.RenewTime; t != nil {
		sl.Expires = t.Add(e.ttl)
	}
	return sl
}

// Release implements [leader.Backend]: no holder and a one-second
// duration, as client-go's ReleaseOnCancel does. A Lease another replica
// holds by now is left alone.
func (e *backend) Release(ctx context.Context, _ store.Lease) error {
	if e.observed == nil || kubeapi.Deref(e.observed.Spec.HolderIdentity) != e.holder {
		return nil
	}
	next := e.observed.DeepCopy()
	next.Spec.HolderIdentity = kubeapi.Ptr("")
	next.Spec.LeaseDurationSeconds = kubeapi.Ptr[int32](1)
	next.Spec.RenewTime = &metav1.MicroTime{Time: e.now()}
	if _, err := e.write(ctx, next); err != nil && !errors.Is(err, errkind.Conflict) {
		return err
	}
	return nil
}
