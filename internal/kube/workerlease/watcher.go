package workerlease

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"space/api"
	"space/internal/errkind"
	kubeapi "space/internal/kube"
)

// Registry is what a Watcher tells about the workers it finds (the
// control plane: controlplane.Server).
type Registry interface {
	// RegisterLeased connects the worker reg describes, alive until
	// renewed+d unless renewed again, or says why not.
	RegisterLeased(ctx context.Context, reg api.RegisterWorker, renewed time.Time, d time.Duration) error
	// LeaseEnded marks worker id not seen: its Lease is gone.
	LeaseEnded(id string)
}

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Namespace holds the workers' Leases. Required.
	Namespace string
	// Resync is how often every Lease is listed anew, besides watching
	// their changes; 0 = one minute.
	Resync time.Duration
	// Log receives the Leases refused and the API server's failures; nil
	// discards them.
	Log *slog.Logger
	// After is the clock; nil means time.After.
	After func(time.Duration) <-chan time.Time
}

// Watcher lists and watches the workers' Leases in a namespace and tells
// a Registry of every change: a Lease created or renewed, or changed,
// registers its worker; one deleted ends it. An expired Lease needs no
// event: the Registry counts its worker alive only until it expires. A
// Lease whose annotations do not decode is logged and its worker not
// connected.
type Watcher struct {
	leases coordinationv1client.LeaseInterface
	reg    Registry
	resync time.Duration
	log    *slog.Logger
	after  func(time.Duration) <-chan time.Time

	// Only Run's goroutine uses these.
	known map[string]*seenLease // by Lease name
}

// seenLease is what a Watcher last made of a Lease.
type seenLease struct {
	holder      string
	renewed     *metav1.MicroTime
	duration    int32
	annotations map[string]string
	id          string // the worker registered from it, or ""
	refused     string // why it was last refused, or ""
}

// NewWatcher returns a watcher of the Leases in cfg.Namespace, through
// client, telling reg; it watches once Run is called. Errors wrap
// errkind.InvalidArgument.
func NewWatcher(cfg WatcherConfig, client kubernetes.Interface, reg Registry) (*Watcher, error) {
	switch {
	case client == nil || reg == nil:
		return nil, fmt.Errorf("worker lease watcher: no kubernetes client or registry: %w", errkind.InvalidArgument)
	case len(validation.IsDNS1123Label(cfg.Namespace)) > 0:
		return nil, fmt.Errorf("worker lease watcher: namespace %.100q: want a DNS label: %w", cfg.Namespace, errkind.InvalidArgument)
	case cfg.Resync < 0:
		return nil, fmt.Errorf("worker lease watcher: resync %v: %w", cfg.Resync, errkind.InvalidArgument)
	}
	w := &Watcher{
		leases: client.CoordinationV1().Leases(cfg.Namespace),
		reg:    reg, resync: cfg.Resync, log: cfg.Log, after: cfg.After,
		known: make(map[string]*seenLease),
	}
	if w.resync == 0 {
		w.resync = time.Minute
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.after == nil {
		w.after = time.After
	}
	w.log = w.log.With("component", "worker-lease-watcher", "namespace", cfg.Namespace)
	return w, nil
}

// Run lists the Leases, then watches them, listing anew every Resync and
// whenever the watch ends, until ctx ends; it returns nil then. Failures
// of the API server are logged and retried with backoff.
func (w *Watcher) Run(ctx context.Context) error {
	backoff := time.Second
	failing := false
	for ctx.Err() == nil {
		err := w.listAndWatch(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			if !failing {
				w.log.Warn("watch the worker leases", "err", err)
			}
			failing = true
			select {
			case <-ctx.Done():
				return nil
			case <-w.after(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		if failing {
			w.log.Info("watching the worker leases again")
		}
		failing, backoff = false, time.Second
	}
	return nil
}

// listAndWatch lists the Leases, then watches them until the watch ends
// or Resync passes.
func (w *Watcher) listAndWatch(ctx context.Context) error {
	list, err := w.leases.List(ctx, metav1.ListOptions{LabelSelector: Selector})
	if err != nil {
		return fmt.Errorf("list worker leases: %w", kubeapi.Kind(err))
	}
	present := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		present[list.Items[i].Name] = true
		w.saw(ctx, &list.Items[i])
	}
	for name := range w.known {
		if !present[name] {
			w.gone(name)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wi, err := w.leases.Watch(wctx, metav1.ListOptions{LabelSelector: Selector, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return fmt.Errorf("watch worker leases: %w", kubeapi.Kind(err))
	}
	defer wi.Stop()
	resync := w.after(w.resync)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resync:
			return nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return nil // relist
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok {
					w.saw(ctx, l)
				}
			case watch.Deleted:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok {
					w.gone(l.Name)
				}
			case watch.Error:
				err := apierrors.FromObject(ev.Object)
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					return nil // relist
				}
				return fmt.Errorf("watch worker leases: %w", kubeapi.Kind(err))
			}
		}
	}
}

// saw handles Lease l as listed or watched: it registers its worker if l
// is new or changed since last seen.
func (w *Watcher) saw(ctx context.Context, l *coordinationv1.Lease) {
	if l.Labels[LabelLease] != "true" {
		w.gone(l.Name) // no longer a worker's (or never was)
		return
	}
	prev := w.known[l.Name]
	cur := &seenLease{
		holder: kubeapi.Deref(l.Spec.HolderIdentity), renewed: l.Spec.RenewTime,
		duration: kubeapi.Deref(l.Spec.LeaseDurationSeconds), annotations: maps.Clone(l.Annotations),
	}
	if prev != nil && prev.holder == cur.holder && prev.duration == cur.duration && maps.Equal(prev.annotations, cur.annotations) &&
		(prev.renewed == nil) == (cur.renewed == nil) && (cur.renewed == nil || prev.renewed.Equal(cur.renewed)) {
		return // a resync, or a change to what the worker does not say
	}
	w.known[l.Name] = cur
	reg, renewed, d, err := registration(l)
	if err != nil && prev != nil && prev.id != "" {
		w.reg.LeaseEnded(prev.id) // it says nothing usable any more
	}
	if err == nil {
		if prev != nil && prev.id != "" {
			cur.id = prev.id // still connected, unless renamed below
		}
		err = w.reg.RegisterLeased(ctx, reg, renewed, d)
	}
	if err != nil {
		// A refused registration leaves the worker as it was: alive
		// until its last accepted renewal expires.
		cur.refused = err.Error()
		if prev == nil || prev.refused != cur.refused {
			w.log.Warn("worker lease refused; the worker is not connected", "lease", l.Name, "worker_id", reg.ID, "err", err)
		}
		return
	}
	if cur.id != "" && cur.id != reg.ID {
		w.reg.LeaseEnded(cur.id)
	}
	cur.id = reg.ID
}

// gone handles the deletion of the Lease name.
func (w *Watcher) gone(name string) {
	prev, ok := w.known[name]
	if !ok {
		return
	}
	delete(w.known, name)
	if prev.id != "" {
		w.reg.LeaseEnded(prev.id)
	}
}
