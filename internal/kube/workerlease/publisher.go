package workerlease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"space/api"
	"space/internal/errkind"
	kubeapi "space/internal/kube"
)

// ErrHeld is returned by Publish and Run when another live process
// publishes the Lease of the same worker id.
var ErrHeld = fmt.Errorf("worker lease held by another live process: %w", errkind.Conflict)

// Config configures a Publisher.
type Config struct {
	// Namespace holds the Lease. Required.
	Namespace string
	// ID is the worker's id. Required.
	ID string
	// Instance names what the worker process runs on (its data dir),
	// the same across restarts: a Lease another life of the same
	// instance holds is taken over at once, since the caller makes sure
	// only one process runs per instance (the data dir's lock). "" =
	// every other life's Lease is refused until it expires.
	Instance string
	// Life names this process among the lives of the worker; "" = a
	// random one.
	Life string
	// State is what the Lease carries, asked at every renewal (its ID is
	// set to ID). Required.
	State func(context.Context) (api.RegisterWorker, error)
	// Duration is how long the Lease lasts unrenewed (whole seconds); 0
	// = DefaultDuration.
	Duration time.Duration
	// RenewEvery is how often it is renewed; 0 = DefaultRenewEvery. It
	// must be below Duration.
	RenewEvery time.Duration
	// Log receives failures to renew; nil discards them.
	Log *slog.Logger
	// Now and After are the clock; nil means time.Now and time.After.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
}

// Publisher creates and renews a worker's Lease (see the package doc).
type Publisher struct {
	leases coordinationv1client.LeaseInterface
	cfg    Config
	name   string
	holder string
	log    *slog.Logger

	// Only Publish's caller (Run's goroutine) uses these.
	last *coordinationv1.Lease // the Lease as this process last wrote it, or nil
	held bool                  // this process wrote the Lease once
}

// NewPublisher returns the publisher of the Lease cfg describes, through
// client; nothing is written until Publish or Run. Errors wrap
// errkind.InvalidArgument.
func NewPublisher(cfg Config, client kubernetes.Interface) (*Publisher, error) {
	if cfg.Duration == 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.RenewEvery == 0 {
		cfg.RenewEvery = DefaultRenewEvery
	}
	if cfg.Life == "" {
		var b [6]byte
		rand.Read(b[:])
		cfg.Life = hex.EncodeToString(b[:])
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
	switch {
	case client == nil:
		return nil, fmt.Errorf("worker lease: no kubernetes client: %w", errkind.InvalidArgument)
	case len(validation.IsDNS1123Label(cfg.Namespace)) > 0:
		return nil, fmt.Errorf("worker lease: namespace %.100q: want a DNS label: %w", cfg.Namespace, errkind.InvalidArgument)
	case cfg.ID == "" || len(cfg.ID) > 32:
		return nil, fmt.Errorf("worker lease: worker id %.64q: want 1-32 characters: %w", cfg.ID, errkind.InvalidArgument)
	case cfg.State == nil:
		return nil, fmt.Errorf("worker lease %s: no state: %w", cfg.ID, errkind.InvalidArgument)
	case cfg.Duration%time.Second != 0 || cfg.Duration < time.Second:
		return nil, fmt.Errorf("worker lease %s: duration %v: want whole seconds: %w", cfg.ID, cfg.Duration, errkind.InvalidArgument)
	case cfg.RenewEvery <= 0 || cfg.RenewEvery >= cfg.Duration:
		return nil, fmt.Errorf("worker lease %s: renew interval %v: want between 0 and the duration %v: %w", cfg.ID, cfg.RenewEvery, cfg.Duration, errkind.InvalidArgument)
	}
	p := &Publisher{
		leases: client.CoordinationV1().Leases(cfg.Namespace),
		cfg:    cfg,
		name:   Name(cfg.ID),
		holder: cfg.ID + "/" + cfg.Life,
	}
	p.log = cfg.Log.With("component", "worker-lease", "lease", cfg.Namespace+"/"+p.name)
	return p, nil
}

// Holder is the Lease's holderIdentity while this publisher holds it.
func (p *Publisher) Holder() string { return p.holder }

// Run publishes the Lease now and then every RenewEvery until ctx ends,
// then deletes it (so the control plane stops placing on the worker at
// once) and returns nil. It returns an error wrapping ErrHeld if another
// live process holds the Lease, or takes it over; failures to reach the
// API server are logged and retried.
func (p *Publisher) Run(ctx context.Context) error {
	var failing string // the last failure's message, or ""
	for {
		err := p.Publish(ctx)
		switch {
		case errors.Is(err, ErrHeld):
			return err
		case err != nil && ctx.Err() == nil && err.Error() != failing:
			p.log.Warn("publish the worker lease", "err", err) // once per kind of failure
			failing = err.Error()
		case err != nil && ctx.Err() == nil:
			p.log.Debug("publish the worker lease", "err", err)
		case err == nil && failing != "":
			p.log.Info("worker lease published again")
			failing = ""
		}
		select {
		case <-ctx.Done():
			return p.release(ctx)
		case <-p.cfg.After(p.cfg.RenewEvery):
		}
	}
}

// Publish creates or renews the Lease once. It returns an error wrapping
// ErrHeld if another live process holds it.
func (p *Publisher) Publish(ctx context.Context) error {
	reg, err := p.cfg.State(ctx)
	if err != nil {
		return fmt.Errorf("worker lease %s: state: %w", p.name, err)
	}
	reg.ID = p.cfg.ID
	ann, err := annotations(reg, p.cfg.Instance)
	if err != nil {
		return fmt.Errorf("worker lease %s: %w", p.name, err)
	}
	// Fast path: renew what this process last wrote. A conflict means
	// someone else wrote it since: read it and decide again.
	if p.last != nil {
		err := p.write(ctx, p.renewal(p.last, ann))
		if err == nil || !errors.Is(err, errkind.Conflict) && !errors.Is(err, errkind.NotFound) {
			return err
		}
		p.log.Debug("renew from the last record failed; reading the lease", "err", err)
		p.last = nil
	}
	cur, err := p.leases.Get(ctx, p.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return p.create(ctx, ann)
	}
	if err != nil {
		return fmt.Errorf("get worker lease %s: %w", p.name, kubeapi.Kind(err))
	}
	holder := kubeapi.Deref(cur.Spec.HolderIdentity)
	if holder != p.holder && p.held {
		return fmt.Errorf("worker lease %s: taken over by %s, another process with worker id %s: %w", p.name, holder, p.cfg.ID, ErrHeld)
	}
	if holder != p.holder && !p.mayTakeOver(cur) {
		return fmt.Errorf("worker lease %s: worker %s is already running as %s (renewed %s, for %ds); stop it, or give this worker another id: %w",
			p.name, p.cfg.ID, holder, cur.Spec.RenewTime.UTC().Format(time.RFC3339), kubeapi.Deref(cur.Spec.LeaseDurationSeconds), ErrHeld)
	}
	return p.write(ctx, p.renewal(cur, ann))
}

// mayTakeOver reports whether this process may write the Lease cur,
// which another life holds: it expired, or its holder is an earlier life
// of this instance.
func (p *Publisher) mayTakeOver(cur *coordinationv1.Lease) bool {
	if p.cfg.Instance != "" && cur.Annotations[AnnotationInstance] == p.cfg.Instance {
		return true
	}
	return expired(cur, p.cfg.Now())
}

// renewal is cur held and renewed now by this process, carrying ann.
func (p *Publisher) renewal(cur *coordinationv1.Lease, ann map[string]string) *coordinationv1.Lease {
	next := cur.DeepCopy()
	now := metav1.NewMicroTime(p.cfg.Now())
	if kubeapi.Deref(next.Spec.HolderIdentity) != p.holder {
		next.Spec.AcquireTime = &now
		next.Spec.LeaseTransitions = kubeapi.Ptr(kubeapi.Deref(next.Spec.LeaseTransitions) + 1)
	}
	next.Spec.HolderIdentity = &p.holder
	next.Spec.LeaseDurationSeconds = kubeapi.Ptr(kubeapi.DurationSeconds(p.cfg.Duration))
	next.Spec.RenewTime = &now
	if next.Labels == nil {
		next.Labels = map[string]string{}
	}
	maps.Copy(next.Labels, labels())
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	delete(next.Annotations, AnnotationInstance)
	maps.Copy(next.Annotations, ann)
	return next
}

func labels() map[string]string {
	return map[string]string{LabelComponent: "worker", LabelLease: "true"}
}

func (p *Publisher) create(ctx context.Context, ann map[string]string) error {
	now := metav1.NewMicroTime(p.cfg.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: labels(), Annotations: ann},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &p.holder,
			LeaseDurationSeconds: kubeapi.Ptr(kubeapi.DurationSeconds(p.cfg.Duration)),
			AcquireTime:          &now,
			RenewTime:            &now,
			LeaseTransitions:     kubeapi.Ptr[int32](0),
		},
	}
	got, err := p.leases.Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create worker lease %s: %w", p.name, kubeapi.Kind(err))
	}
	p.last, p.held = got, true
	return nil
}

// write updates the Lease to next, which carries the resourceVersion it
// was read at.
func (p *Publisher) write(ctx context.Context, next *coordinationv1.Lease) error {
	got, err := p.leases.Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update worker lease %s: %w", p.name, kubeapi.Kind(err))
	}
	p.last, p.held = got, true
	return nil
}

// release deletes the Lease if this process still holds it as last
// written (the resourceVersion precondition: not if another took it).
func (p *Publisher) release(ctx context.Context) error {
	if p.last == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	rv := p.last.ResourceVersion
	err := p.leases.Delete(rctx, p.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	p.last = nil
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.log.Warn("delete the worker lease", "err", kubeapi.Kind(err))
	}
	return nil
}
