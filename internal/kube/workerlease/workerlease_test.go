package workerlease_test

// These tests publish workers' Leases on client-go's fake clientset
// (kubetest's fake API server); a real API server runs them in the k8s
// tier later. The Watcher's tests, with the control plane as its
// registry, are in package controlplane.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"

	"space/api"
	"space/internal/errkind"
	"space/internal/kube/kubefake"
	"space/internal/kube/workerlease"
	"space/internal/testenv"
)

const ns = "space"

var state = api.RegisterWorker{
	Address: "https://10.0.0.5:7071", VCPUs: 8, MemoryMiB: 8192, Protocol: 1,
	Capabilities: api.WorkerCapabilities{VMM: "qemu", Accel: "kvm", Snapshots: true},
}

func newPublisher(t *testing.T, cs *fake.Clientset, clk *kubefake.Clock, id, instance, life string) *workerlease.Publisher {
	t.Helper()
	p, err := workerlease.NewPublisher(workerlease.Config{
		Namespace: ns, ID: id, Instance: instance, Life: life, Now: clk.Now,
		State: func(context.Context) (api.RegisterWorker, error) { return state, nil },
	}, cs)
	if err != nil {
		t.Fatalf("setup: NewPublisher: %v", err)
	}
	return p
}

// TestPublishWithFakeAPIServer checks the Lease a worker publishes:
// named after it, labelled, held by its life, lasting 30 s, carrying what
// it registers; and that a renewal moves renewTime only.
func TestPublishWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	clk := kubefake.NewClock(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	p := newPublisher(t, cs, clk, "node-1", "i-1", "life1")
	if err := p.Publish(t.Context()); err != nil {
		t.Fatalf("Publish = %v", err)
	}
	l, err := cs.CoordinationV1().Leases(ns).Get(t.Context(), "space-worker-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get the Lease: %v", err)
	}
	want := map[string]string{
		workerlease.AnnotationID: "node-1", workerlease.AnnotationAddress: "https://10.0.0.5:7071",
		workerlease.AnnotationProtocol: "1", workerlease.AnnotationVCPUs: "8", workerlease.AnnotationMemoryMiB: "8192",
		workerlease.AnnotationInstance: "i-1",
	}
	var caps api.WorkerCapabilities
	if err := json.Unmarshal([]byte(l.Annotations[workerlease.AnnotationCapabilities]), &caps); err != nil || !cmp.Equal(caps, state.Capabilities) {
		t.Errorf("capabilities annotation %s, want %+v", l.Annotations[workerlease.AnnotationCapabilities], state.Capabilities)
	}
	delete(l.Annotations, workerlease.AnnotationCapabilities)
	if diff := cmp.Diff(want, l.Annotations); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"app.kubernetes.io/component": "worker", "space.dev/worker-lease": "true"}, l.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if h, d := *l.Spec.HolderIdentity, *l.Spec.LeaseDurationSeconds; h != "node-1/life1" || d != 30 || !l.Spec.RenewTime.Time.Equal(clk.Now()) {
		t.Errorf("spec = holder %q, %ds, renewed %v; want node-1/life1, 30s, renewed %v", h, d, l.Spec.RenewTime, clk.Now())
	}
	clk.Advance(10 * time.Second)
	if err := p.Publish(t.Context()); err != nil {
		t.Fatalf("Publish (renew) = %v", err)
	}
	l2, _ := cs.CoordinationV1().Leases(ns).Get(t.Context(), "space-worker-node-1", metav1.GetOptions{})
	if !l2.Spec.RenewTime.Time.Equal(clk.Now()) || !l2.Spec.AcquireTime.Equal(l.Spec.AcquireTime) || l2.ResourceVersion == l.ResourceVersion {
		t.Errorf("after a renewal: renewed %v, acquired %v (was %v); want renewed %v, acquired unchanged", l2.Spec.RenewTime, l2.Spec.AcquireTime, l.Spec.AcquireTime, clk.Now())
	}
}

// TestPublishAfterConflictWithFakeAPIServer checks a renewal that finds
// the Lease written by someone else since (a resourceVersion conflict)
// reads it again and renews it, keeping what it does not own.
func TestPublishAfterConflictWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	clk := kubefake.NewClock(time.Now())
	p := newPublisher(t, cs, clk, "w1", "", "a")
	if err := p.Publish(t.Context()); err != nil {
		t.Fatalf("Publish = %v", err)
	}
	leases := cs.CoordinationV1().Leases(ns)
	l, _ := leases.Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{})
	l.Annotations["example.com/note"] = "kept"
	if _, err := leases.Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	clk.Advance(10 * time.Second)
	if err := p.Publish(t.Context()); err != nil {
		t.Fatalf("Publish after another write = %v, want nil", err)
	}
	l, _ = leases.Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{})
	if !l.Spec.RenewTime.Time.Equal(clk.Now()) || l.Annotations["example.com/note"] != "kept" {
		t.Errorf("Lease after the renewal: renewed %v, note %q; want renewed %v, note kept", l.Spec.RenewTime, l.Annotations["example.com/note"], clk.Now())
	}
}

// TestTwoPublishersOneIDWithFakeAPIServer checks a second process with
// a worker's id is refused while the first's Lease is alive, says which
// holds it, and changes nothing; it takes over once the Lease expired,
// and then the first is refused at its next renewal. An earlier life of
// the same instance (data dir) is taken over at once.
func TestTwoPublishersOneIDWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	clk := kubefake.NewClock(time.Now())
	first := newPublisher(t, cs, clk, "w1", "i-host-a", "one")
	if err := first.Publish(t.Context()); err != nil {
		t.Fatalf("first Publish = %v", err)
	}
	leases := cs.CoordinationV1().Leases(ns)
	before, _ := leases.Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{})

	second := newPublisher(t, cs, clk, "w1", "i-host-b", "two")
	err := second.Publish(t.Context())
	if !errors.Is(err, workerlease.ErrHeld) || !errors.Is(err, errkind.Conflict) || !strings.Contains(err.Error(), "already running as w1/one") {
		t.Fatalf("second Publish = %v, want ErrHeld saying w1/one holds it", err)
	}
	if err := second.Run(t.Context()); !errors.Is(err, workerlease.ErrHeld) {
		t.Errorf("second Run = %v, want ErrHeld", err)
	}
	after, _ := leases.Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{})
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("a refused publisher wrote the Lease")
	}

	// The same instance's next life (a restart on the same data dir).
	restarted := newPublisher(t, cs, clk, "w1", "i-host-a", "one-again")
	if err := restarted.Publish(t.Context()); err != nil {
		t.Fatalf("Publish of a restart on the same instance = %v, want nil", err)
	}
	if err := first.Publish(t.Context()); !errors.Is(err, workerlease.ErrHeld) {
		t.Errorf("earlier life's renewal = %v, want ErrHeld", err)
	}

	// Expired: the other instance takes it over.
	clk.Advance(workerlease.DefaultDuration)
	if err := second.Publish(t.Context()); err != nil {
		t.Fatalf("second Publish after the Lease expired = %v, want nil", err)
	}
	l, _ := leases.Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{})
	if *l.Spec.HolderIdentity != "w1/two" || *l.Spec.LeaseTransitions != 2 || l.Annotations[workerlease.AnnotationInstance] != "i-host-b" {
		t.Errorf("Lease after the takeover = holder %q, transitions %d, instance %q; want w1/two, 2, i-host-b",
			*l.Spec.HolderIdentity, *l.Spec.LeaseTransitions, l.Annotations[workerlease.AnnotationInstance])
	}
	if err := restarted.Publish(t.Context()); !errors.Is(err, workerlease.ErrHeld) {
		t.Errorf("renewal by the holder it was taken from = %v, want ErrHeld", err)
	}
}

// TestRunReleasesWithFakeAPIServer checks Run publishes, and deletes the
// Lease when it stops.
func TestRunReleasesWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	clk := kubefake.NewClock(time.Now())
	p := newPublisher(t, cs, clk, "w1", "", "a")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	leases := cs.CoordinationV1().Leases(ns)
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, err := leases.Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{})
		return err == nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	if _, err := leases.Get(t.Context(), workerlease.Name("w1"), metav1.GetOptions{}); err == nil {
		t.Errorf("the Lease is left after Run stopped")
	}
}

// TestNames checks every worker id gets a Lease name that is a DNS
// label, its own, and readable when the id already is one.
func TestNames(t *testing.T) {
	ids := []string{"node-1", "w-abcdefghijklmnop", "Node_1", "node.1", "node-1.", "_", "A", "a", strings.Repeat("x", 32), strings.Repeat("X", 32)}
	seen := map[string]string{}
	for _, id := range ids {
		n := workerlease.Name(id)
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			t.Errorf("Name(%q) = %q: %s", id, n, msgs[0])
		}
		if other, dup := seen[n]; dup {
			t.Errorf("Name(%q) = Name(%q) = %q", id, other, n)
		}
		seen[n] = id
	}
	if got := workerlease.Name("node-1"); got != "space-worker-node-1" {
		t.Errorf("Name(node-1) = %q, want space-worker-node-1", got)
	}
}

// TestNewPublisherRefusesBadConfig checks bad settings are refused.
func TestNewPublisherRefusesBadConfig(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	st := func(context.Context) (api.RegisterWorker, error) { return state, nil }
	for _, tt := range []struct {
		name string
		cfg  workerlease.Config
	}{
		{"no namespace", workerlease.Config{ID: "w1", State: st}},
		{"bad namespace", workerlease.Config{Namespace: "Space!", ID: "w1", State: st}},
		{"no id", workerlease.Config{Namespace: ns, State: st}},
		{"no state", workerlease.Config{Namespace: ns, ID: "w1"}},
		{"fractional duration", workerlease.Config{Namespace: ns, ID: "w1", State: st, Duration: 1500 * time.Millisecond}},
		{"renew too slow", workerlease.Config{Namespace: ns, ID: "w1", State: st, Duration: 10 * time.Second, RenewEvery: 10 * time.Second}},
	} {
		if _, err := workerlease.NewPublisher(tt.cfg, cs); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("NewPublisher(%s) = %v, want invalid argument", tt.name, err)
		}
	}
}
