// Package kubefake fakes the Kubernetes API server for the adapters'
// tests: client-go's fake clientset, made to treat Leases as an API
// server does. The chart's test on a real cluster (internal/deploy/chartcluster) runs
// the adapters against a real API server.
package kubefake

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Leases is the resource of coordination.k8s.io/v1 Leases.
var Leases = coordinationv1.SchemeGroupVersion.WithResource("leases")

// NewAPIServer returns a fake clientset whose Lease creates and updates
// behave like an API server's: each write gets a new resourceVersion, and
// an update whose resourceVersion is not the stored one is a conflict.
// (The fake's reactors run one at a time, so check and write are atomic.)
func NewAPIServer(t testing.TB) *fake.Clientset {
	t.Helper()
	cs := fake.NewClientset()
	var version int64
	cs.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		if l.ResourceVersion != "" {
			return true, nil, apierrors.NewBadRequest("resourceVersion must not be set on create")
		}
		version++
		l.ResourceVersion = strconv.FormatInt(version, 10)
		if err := cs.Tracker().Create(Leases, l, a.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, l.DeepCopy(), nil
	})
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, err := cs.Tracker().Get(Leases, a.GetNamespace(), l.Name)
		if err != nil {
			return true, nil, err
		}
		if got := cur.(*coordinationv1.Lease).ResourceVersion; l.ResourceVersion != got {
			return true, nil, apierrors.NewConflict(Leases.GroupResource(), l.Name,
				errors.New("the object has been modified"))
		}
		version++
		l.ResourceVersion = strconv.FormatInt(version, 10)
		if err := cs.Tracker().Update(Leases, l, a.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, l.DeepCopy(), nil
	})
	return cs
}

// Clock is a clock that moves only when told, for the adapters' Now
// functions.
type Clock struct {
	mu sync.Mutex
	// +checklocks:mu
	t time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
