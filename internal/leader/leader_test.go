package leader_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"space/internal/errkind"
	"space/internal/leader"
	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/store/sqlite"
	"space/internal/testenv"
	"space/internal/testenv/pgtest"
)

const (
	ttl   = 600 * time.Millisecond
	every = 200 * time.Millisecond
)

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

func newElector(t *testing.T, holder string, leases leader.Leases) *leader.LeaseElector {
	t.Helper()
	e, err := leader.New(leader.Config{Holder: holder, TTL: ttl, RenewEvery: every}, leases)
	if err != nil {
		t.Fatalf("setup: New(%s): %v", holder, err)
	}
	return e
}

func openSQLite(t *testing.T) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
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

func TestLeadAndStop(t *testing.T) {
	s := openSQLite(t)
	e := newElector(t, "r1", s)
	if _, ok := e.Leading(); ok {
		t.Errorf("Leading() before Run = true")
	}
	stop := start(t, e)
	term, l := await(t, e, 5*time.Second)
	if l.Name != "leader" || l.Holder != "r1" || l.Token <= 0 {
		t.Errorf("Await() lease = %+v, want r1's lease on leader", l)
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
	// The leader's lease fences writes.
	if _, err := s.Fenced(l).CreateSandbox(t.Context(), store.Sandbox{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Fenced(leader).CreateSandbox(bad) = %v, want ErrInvalid (the fence passes)", err)
	}

	stop()
	wantEnded(t, term, time.Second)
	if _, ok := e.Leading(); ok {
		t.Errorf("Leading() after stop = true")
	}
	if ls, err := s.ListLeases(t.Context(), "leader"); err != nil || len(ls) != 0 {
		t.Errorf("ListLeases(leader) after stop = %+v, %v; want released", ls, err)
	}
}

func TestOneLeader(t *testing.T) {
	s := openSQLite(t)
	a, b := newElector(t, "a", s), newElector(t, "b", s)
	stopA := start(t, a)
	_, la := await(t, a, 5*time.Second)
	start(t, b)
	// b campaigns a few times and loses each.
	for range 3 {
		<-time.After(every)
		if _, ok := b.Leading(); ok {
			t.Fatalf("b leads while a does")
		}
	}
	stopA() // released: b takes over at its next campaign
	_, lb := await(t, b, 5*time.Second)
	if lb.Holder != "b" || lb.Token <= la.Token {
		t.Errorf("b's lease = %+v, want a token above %d", lb, la.Token)
	}
}

// failing wraps leases; its renewals fail with renewErr when set, and its
// releases do nothing when noRelease is set (a killed process).
type failing struct {
	leader.Leases
	renewErr  atomic.Pointer[error]
	noRelease atomic.Bool
}

func (f *failing) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	if err := f.renewErr.Load(); err != nil {
		return store.Lease{}, *err
	}
	return f.Leases.RenewLease(ctx, l, ttl)
}

func (f *failing) ReleaseLease(ctx context.Context, l store.Lease) error {
	if f.noRelease.Load() {
		return nil
	}
	return f.Leases.ReleaseLease(ctx, l)
}

func TestLeaseLost(t *testing.T) {
	f := &failing{Leases: openSQLite(t)}
	e := newElector(t, "r1", f)
	start(t, e)
	term, _ := await(t, e, 5*time.Second)
	lost := fmt.Errorf("renew: %w", store.ErrLeaseLost)
	f.renewErr.Store(&lost)
	wantEnded(t, term, 2*every+time.Second)
	if !errors.Is(context.Cause(term), store.ErrLeaseLost) {
		t.Errorf("term cause = %v, want ErrLeaseLost", context.Cause(term))
	}
}

func TestRenewFailsUntilExpiry(t *testing.T) {
	f := &failing{Leases: openSQLite(t)}
	e := newElector(t, "r1", f)
	start(t, e)
	term, _ := await(t, e, 5*time.Second)
	began := time.Now()
	down := fmt.Errorf("database down: %w", errkind.Unavailable)
	f.renewErr.Store(&down)
	wantEnded(t, term, ttl+time.Second)
	// Not before the last renewal's lease ran out, minus a renew interval.
	if d := time.Since(began); d < ttl-every-50*time.Millisecond {
		t.Errorf("term ended %v after renewals began failing, want about ttl %v", d, ttl)
	}
	if _, ok := e.Leading(); ok {
		t.Errorf("Leading() after failed renewals = true")
	}
}

func TestNewBadConfig(t *testing.T) {
	s := openSQLite(t)
	for _, cfg := range []leader.Config{
		{},
		{Holder: "has space"},
		{Holder: "r1", TTL: time.Second, RenewEvery: time.Second},
		{Holder: "r1", TTL: time.Second, RenewEvery: -time.Second},
		{Holder: "r1", TTL: -time.Second},
	} {
		if _, err := leader.New(cfg, s); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(%+v) = %v, want invalid argument", cfg, err)
		}
	}
}

// TestFailoverPostgres runs two replicas' electors on one PostgreSQL,
// each with its own pool, kills the leader (no release) and expects the
// other to lead within ttl plus a renew interval, with a higher token that
// fences the old leader's writes off.
func TestFailoverPostgres(t *testing.T) {
	dsn := pgtest.Start(t)
	open := func() *postgres.Store {
		s, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	sa, sb := open(), open()
	fa := &failing{Leases: sa}
	a, b := newElector(t, "replica-a", fa), newElector(t, "replica-b", sb)
	stopA := start(t, a)
	_, la := await(t, a, 5*time.Second)
	start(t, b)
	<-time.After(2 * every)
	if _, ok := b.Leading(); ok {
		t.Fatalf("b leads while a does")
	}

	fa.noRelease.Store(true)
	stopA()
	killed := time.Now()
	_, lb := await(t, b, ttl+every+5*time.Second)
	took := time.Since(killed)
	t.Logf("failover took %v (ttl %v, renew every %v)", took, ttl, every)
	if took > ttl+every+500*time.Millisecond {
		t.Errorf("failover took %v, want within ttl+renew %v", took, ttl+every)
	}
	if lb.Token <= la.Token {
		t.Errorf("new leader's token %d, want above %d", lb.Token, la.Token)
	}
	if _, err := sa.CreateTeam(t.Context(), store.Team{ID: "t1"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	_, err := sa.Fenced(la).CreateSandbox(t.Context(), store.Sandbox{ID: store.NewSandboxID(), TeamID: "t1",
		Template: "base", State: store.StateCreating, Spec: []byte(`{}`)})
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("old leader's Fenced().CreateSandbox() = %v, want ErrLeaseLost", err)
	}
}
