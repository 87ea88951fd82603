package postgres_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"space/internal/errkind"
	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/testenv"
	"space/internal/testenv/pgtest"
)

// replicas opens n stores on dsn, each with its own pool: n control plane
// replicas sharing one database.
func replicas(t *testing.T, dsn string, n int) []*postgres.Store {
	t.Helper()
	ss := make([]*postgres.Store, n)
	for i := range ss {
		s, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("setup: open replica %d: %v", i, err)
		}
		t.Cleanup(func() { s.Close() })
		ss[i] = s
	}
	return ss
}

func TestQuotaAcrossReplicas(t *testing.T) {
	ctx := t.Context()
	rs := replicas(t, pgtest.Start(t), 4)
	for _, team := range []string{"t1", "t2"} {
		if _, err := rs[0].CreateTeam(ctx, store.Team{ID: team}); err != nil {
			t.Fatalf("setup: CreateTeam(%s): %v", team, err)
		}
	}
	const n, limit = 200, 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ok      = map[string]int{}
		refused int
		other   []error
	)
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			// Most go to t1; t2's creates run alongside and must not be
			// held up or counted against t1.
			team := "t1"
			if i%10 == 0 {
				team = "t2"
			}
			sb := store.Sandbox{ID: store.NewSandboxID(), TeamID: team, Template: "base", State: store.StateCreating,
				Spec: json.RawMessage(`{"vcpus":1,"memory_mib":256}`), VCPUs: 1, MemoryMiB: 256}
			_, err := rs[i%len(rs)].CreateSandboxWithinQuota(ctx, sb, store.Quota{Sandboxes: limit, VCPUs: 1000})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok[team]++
			case errors.Is(err, errkind.ResourceExhausted):
				refused++
			default:
				other = append(other, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d quota-checked creates over %d replicas in %v", n, len(rs), time.Since(start))
	if ok["t1"] != limit || ok["t2"] != n/10 || refused != n-n/10-limit || len(other) > 0 {
		t.Errorf("creates: %v ok, %d refused, errors %v; want t1 %d, t2 %d", ok, refused, other, limit, n/10)
	}
	for i, r := range rs {
		u, err := r.TeamUsage(ctx, "t1")
		if err != nil || u != (store.Usage{Sandboxes: limit, VCPUs: limit, MemoryMiB: 256 * limit}) {
			t.Errorf("replica %d: TeamUsage(t1) = %+v, %v; want %d sandboxes", i, u, err, limit)
		}
	}
}

func TestLeaseTakeoverAcrossReplicas(t *testing.T) {
	ctx := t.Context()
	rs := replicas(t, pgtest.Start(t), 2)
	a, b := rs[0], rs[1]
	if _, err := a.CreateTeam(ctx, store.Team{ID: "t1"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	sb, err := a.CreateSandbox(ctx, store.Sandbox{ID: store.NewSandboxID(), TeamID: "t1", Template: "base",
		State: store.StateCreating, Spec: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	name := "sandbox/" + sb.ID
	old, err := a.AcquireLease(ctx, name, "replica-a", 200*time.Millisecond)
	if err != nil {
		t.Fatalf("replica a: AcquireLease() = %v", err)
	}
	if _, err := b.AcquireLease(ctx, name, "replica-b", time.Minute); !errors.Is(err, errkind.Conflict) {
		t.Fatalf("replica b: AcquireLease() while a holds it = %v, want conflict", err)
	}
	// a stalls past its expiry; b takes the sandbox over.
	var nl store.Lease
	testenv.Eventually(t, 10*time.Second, func() bool {
		nl, err = b.AcquireLease(ctx, name, "replica-b", time.Minute)
		return err == nil
	})
	if nl.Token <= old.Token {
		t.Errorf("takeover token %d, want above %d", nl.Token, old.Token)
	}
	sb.State = store.StateFailed
	if _, err := a.Fenced(old).UpdateSandbox(ctx, sb); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("replica a: Fenced(old).UpdateSandbox() = %v, want ErrLeaseLost", err)
	}
	if _, err := a.RenewLease(ctx, old, time.Minute); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("replica a: RenewLease(old) = %v, want ErrLeaseLost", err)
	}
	sb.State = store.StateRunning
	got, err := b.Fenced(nl).UpdateSandbox(ctx, sb)
	if err != nil || got.State != store.StateRunning || got.Version != 2 {
		t.Errorf("replica b: Fenced(new).UpdateSandbox() = %+v, %v; want running at version 2", got, err)
	}
}

func TestResumeQuotaAcrossReplicas(t *testing.T) {
	ctx := t.Context()
	rs := replicas(t, pgtest.Start(t), 4)
	// Each team has room for one more sandbox, and four candidates start
	// together for it, each through another replica: two resumes of
	// suspended sandboxes and two creates.
	const teams = 30
	q := store.Quota{Sandboxes: 2}
	newSandbox := func(team string, state store.SandboxState) store.Sandbox {
		return store.Sandbox{ID: store.NewSandboxID(), TeamID: team, Template: "base", State: state,
			Spec: json.RawMessage(`{}`), VCPUs: 1, MemoryMiB: 256}
	}
	var ops []func(r *postgres.Store) error
	for i := range teams {
		team := fmt.Sprintf("t%d", i)
		if _, err := rs[0].CreateTeam(ctx, store.Team{ID: team}); err != nil {
			t.Fatalf("setup: CreateTeam(%s): %v", team, err)
		}
		for _, st := range []store.SandboxState{store.StateRunning, store.StateSuspended, store.StateSuspended} {
			sb, err := rs[0].CreateSandbox(ctx, newSandbox(team, st))
			if err != nil {
				t.Fatalf("setup: CreateSandbox() = %v", err)
			}
			if st == store.StateSuspended {
				sb.State = store.StateCreating
				ops = append(ops, func(r *postgres.Store) error { _, err := r.UpdateSandboxWithinQuota(ctx, sb, q); return err })
			}
		}
		for range 2 {
			ops = append(ops, func(r *postgres.Store) error {
				_, err := r.CreateSandboxWithinQuota(ctx, newSandbox(team, store.StateCreating), q)
				return err
			})
		}
	}
	var (
		wg          sync.WaitGroup
		begin       = make(chan struct{})
		mu          sync.Mutex
		ok, refused int
		other       []error
	)
	for i, op := range ops {
		wg.Go(func() {
			<-begin
			err := op(rs[i%len(rs)])
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errkind.ResourceExhausted):
				refused++
			default:
				other = append(other, err)
			}
		})
	}
	start := time.Now()
	close(begin)
	wg.Wait()
	t.Logf("%d quota-checked resumes and creates over %d replicas in %v", len(ops), len(rs), time.Since(start))
	if ok != teams || len(other) > 0 {
		t.Errorf("resumes and creates: %d ok, %d refused, errors %v; want %d ok, one per team", ok, refused, other, teams)
	}
	for i := range teams {
		team := fmt.Sprintf("t%d", i)
		if u, err := rs[i%len(rs)].TeamUsage(ctx, team); err != nil || u.Sandboxes != 2 {
			t.Errorf("TeamUsage(%s) = %+v, %v; want 2 sandboxes", team, u, err)
		}
	}
}
