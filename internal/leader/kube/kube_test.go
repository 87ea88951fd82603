package kube_test

// These tests run the election against client-go's fake clientset, made to
// enforce resourceVersion preconditions the way an API server does. A real
// API server runs them in the k8s test tier later.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"space/internal/errkind"
	"space/internal/kube/kubefake"
	"space/internal/leader"
	"space/internal/leader/kube"
	"space/internal/store"
	"space/internal/testenv"
)

const (
	ns    = "space"
	ttl   = 300 * time.Millisecond
	every = 100 * time.Millisecond
)

// failUpdatesBy makes updates that write holder into the Lease fail while
// the returned flag is set.
func failUpdatesBy(cs *fake.Clientset, holder string) *atomic.Bool {
	var on atomic.Bool
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if !on.Load() || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != holder {
			return false, nil, nil
		}
		return true, nil, apierrors.NewServiceUnavailable("api server unreachable")
	})
	return &on
}

func newElector(t *testing.T, cs *fake.Clientset, holder string, now func() time.Time) *leader.LeaseElector {
	t.Helper()
	e, err := kube.New(kube.Config{Namespace: ns, Holder: holder, TTL: ttl, RenewEvery: every, Now: now}, cs)
	if err != nil {
		t.Fatalf("setup: New(%s): %v", holder, err)
	}
	return e
}

// start runs e until the returned stop is called (or the test ends) and
// fails t if Run returns an error.
func start(t *testing.T, e *leader.LeaseElector) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var stopped atomic.Bool
	stop = func() {
		if stopped.Swap(true) {
			return
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v, want nil", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func await(t *testing.T, e leader.Elector, within time.Duration) (context.Context, store.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	term, l, err := e.Await(ctx)
	if err != nil {
		t.Fatalf("Await() = %v, want leadership within %v", err, within)
	}
	return term, l
}

func wantEnded(t *testing.T, term context.Context, within time.Duration) {
	t.Helper()
	select {
	case <-term.Done():
	case <-time.After(within):
		t.Fatalf("term not ended within %v", within)
	}
	if cause := context.Cause(term); !errors.Is(cause, leader.ErrNotLeader) || !errors.Is(cause, errkind.FailedPrecondition) {
		t.Errorf("term cause = %v, want ErrNotLeader", cause)
	}
}

func getLease(t *testing.T, cs *fake.Clientset) *coordinationv1.Lease {
	t.Helper()
	l, err := cs.CoordinationV1().Leases(ns).Get(t.Context(), "space-leader", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Get(lease) = %v", err)
	}
	return l
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func TestLeadAndStopWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	e := newElector(t, cs, "r1", nil)
	if _, ok := e.Leading(); ok {
		t.Errorf("Leading() before Run = true")
	}
	stop := start(t, e)
	term, l := await(t, e, 5*time.Second)
	if l.Name != "space-leader" || l.Holder != "r1" || l.Token <= 0 || l.Acquired.IsZero() || !l.Expires.After(l.Acquired) {
		t.Errorf("Await() lease = %+v, want r1's lease on space-leader", l)
	}
	if got, ok := e.Leading(); !ok || got.Token != l.Token {
		t.Errorf("Leading() = %+v, %v; want token %d", got, ok, l.Token)
	}
	if err := e.Run(t.Context()); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("second Run() = %v, want failed precondition", err)
	}
	// Renewals keep the token.
	testenv.Eventually(t, 5*time.Second, func() bool {
		got, ok := e.Leading()
		return ok && got.Expires.After(l.Expires)
	})
	if got, _ := e.Leading(); got.Token != l.Token {
		t.Errorf("Leading() after renewal: token %d, want %d", got.Token, l.Token)
	}
	if got := getLease(t, cs); holderOf(got) != "r1" || *got.Spec.LeaseTransitions != int32(l.Token) {
		t.Errorf("lease spec = %+v, want held by r1 with transitions %d", got.Spec, l.Token)
	}

	stop()
	wantEnded(t, term, time.Second)
	if _, ok := e.Leading(); ok {
		t.Errorf("Leading() after stop = true")
	}
	got := getLease(t, cs)
	if holderOf(got) != "" || *got.Spec.LeaseTransitions != int32(l.Token) {
		t.Errorf("lease spec after stop = %+v, want released with transitions %d", got.Spec, l.Token)
	}
}

// TestOneLeaderWithFakeAPIServer starts two electors at once and expects
// exactly one to lead, and to keep leading, until it stops; the other then
// takes over at once with a higher token.
func TestOneLeaderWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	a, b := newElector(t, cs, "a", nil), newElector(t, cs, "b", nil)
	stops := map[*leader.LeaseElector]func(){a: start(t, a), b: start(t, b)}
	testenv.Eventually(t, 5*time.Second, func() bool {
		_, aok := a.Leading()
		_, bok := b.Leading()
		return aok || bok
	})
	winner, loser := a, b
	if _, ok := b.Leading(); ok {
		winner, loser = b, a
	}
	first, firstLease := await(t, winner, time.Second)
	for range 10 { // over several renewals and more than a lease duration
		<-time.After(every)
		_, wok := winner.Leading()
		_, lok := loser.Leading()
		if !wok || lok {
			t.Fatalf("Leading() = %v for the winner, %v for the loser; want exactly the winner", wok, lok)
		}
	}
	stopped := time.Now()
	stops[winner]()
	wantEnded(t, first, time.Second)
	_, l := await(t, loser, ttl+5*time.Second)
	t.Logf("handover took %v (ttl %v)", time.Since(stopped), ttl)
	if l.Token <= firstLease.Token || l.Holder == firstLease.Holder {
		t.Errorf("successor's lease = %+v, want another holder with a token above %d", l, firstLease.Token)
	}
}

// TestRenewFailsWithFakeAPIServer makes the leader's writes fail and
// expects its term to end before its lease could have expired for the
// follower, which then takes over.
func TestRenewFailsWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	failing := failUpdatesBy(cs, "a")
	a, b := newElector(t, cs, "a", nil), newElector(t, cs, "b", nil)
	start(t, a)
	termA, la := await(t, a, 5*time.Second)
	start(t, b)
	<-time.After(2 * every)

	failing.Store(true)
	var endedAt atomic.Pointer[time.Time]
	context.AfterFunc(termA, func() {
		now := time.Now()
		endedAt.Store(&now)
	})
	wantEnded(t, termA, ttl+time.Second)
	if _, ok := a.Leading(); ok {
		t.Errorf("a.Leading() after failed renewals = true")
	}
	held := getLease(t, cs) // a's last renewal: b waits a lease duration (1s) from seeing it
	if holderOf(held) != "a" {
		t.Fatalf("lease holder when a's term ended = %q, want a", holderOf(held))
	}
	_, lb := await(t, b, 5*time.Second)
	if lb.Holder != "b" || lb.Token <= la.Token {
		t.Errorf("b's lease = %+v, want a token above %d", lb, la.Token)
	}
	// a's term ended before its last renewal's lease ran out, and b took
	// over only after that (all clocks here are the same clock).
	renewed := held.Spec.RenewTime.Time
	expired := renewed.Add(time.Duration(*held.Spec.LeaseDurationSeconds) * time.Second)
	testenv.Eventually(t, time.Second, func() bool { return endedAt.Load() != nil })
	if ended := *endedAt.Load(); !ended.Before(expired) {
		t.Errorf("a's term ended at %v, want before its lease expired at %v", ended, expired)
	}
	if lb.Acquired.Before(expired) {
		t.Errorf("b acquired the lease at %v, before a's expired at %v", lb.Acquired, expired)
	}
}

// TestFollowerWaitsWithFakeAPIServer gives the leader a clock an hour
// behind: its renewTimes look long expired, but the follower counts from
// when it saw the record change, so it never takes over while the leader
// renews.
func TestFollowerWaitsWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	a, b := newElector(t, cs, "a", behind), newElector(t, cs, "b", nil)
	start(t, a)
	termA, la := await(t, a, 5*time.Second)
	start(t, b)
	for range 15 { // over several lease durations (1s, ttl rounded up)
		<-time.After(every)
		if _, ok := b.Leading(); ok {
			t.Fatalf("b leads while a holds and renews the lease")
		}
	}
	if termA.Err() != nil {
		t.Errorf("a's term ended while a renewed: %v", context.Cause(termA))
	}
	if got := getLease(t, cs); holderOf(got) != "a" || *got.Spec.LeaseTransitions != int32(la.Token) {
		t.Errorf("lease spec = %+v, want still held by a with transitions %d", got.Spec, la.Token)
	}
}

// TestTokenGrowsWithFakeAPIServer hands the lease a → b → a (a new
// elector, as after a restart) and expects a higher token each time.
func TestTokenGrowsWithFakeAPIServer(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	var last int64
	for i, holder := range []string{"a", "b", "a"} {
		e := newElector(t, cs, holder, nil)
		stop := start(t, e)
		term, l := await(t, e, 5*time.Second)
		if l.Holder != holder || l.Token <= last {
			t.Errorf("term %d: lease = %+v, want %s's with a token above %d", i, l, holder, last)
		}
		last = l.Token
		stop()
		wantEnded(t, term, time.Second)
	}
}

func TestNewBadConfig(t *testing.T) {
	cs := kubefake.NewAPIServer(t)
	for _, cfg := range []kube.Config{
		{},
		{Namespace: ns},
		{Holder: "r1"},
		{Namespace: "Not_A_Namespace", Holder: "r1"},
		{Namespace: ns, Name: "not a name", Holder: "r1"},
		{Namespace: ns, Holder: "has space"},
		{Namespace: ns, Holder: "r1", TTL: time.Second, RenewEvery: time.Second},
		{Namespace: ns, Holder: "r1", TTL: time.Second, RenewEvery: -time.Second},
		{Namespace: ns, Holder: "r1", TTL: -time.Second},
	} {
		if _, err := kube.New(cfg, cs); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(%+v) = %v, want invalid argument", cfg, err)
		}
	}
	if _, err := kube.New(kube.Config{Namespace: ns, Holder: "r1"}, nil); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("New(nil client) = %v, want invalid argument", err)
	}
}
