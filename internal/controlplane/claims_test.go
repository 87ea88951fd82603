package controlplane

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/store/sqlite"
)

// claimsServer returns a server on a fresh SQLite store with the instant
// worker, as replica, and a team t1.
func claimsServer(t *testing.T, replica string) (*Server, store.Store) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Templates: []string{"default"}, ReplicaID: replica})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	s.AddWorker(&instantWorker{})
	if _, err := st.CreateTeam(t.Context(), store.Team{ID: "t1", Name: "t1"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return s, st
}

func claimLeases(t *testing.T, st store.Store) []store.Lease {
	t.Helper()
	ls, err := st.ListLeases(t.Context(), claimPrefix)
	if err != nil {
		t.Fatalf("ListLeases = %v", err)
	}
	return ls
}

// TestClaimIsShared checks that operations of one replica on one record
// share one lease in the store, which goes with the last of them, and
// that concurrent claims of many records each get theirs.
func TestClaimIsShared(t *testing.T) {
	s, st := claimsServer(t, "cp-a")
	ctx := t.Context()
	_, r1, err := s.claim(ctx, "sbx_1")
	if err != nil {
		t.Fatalf("claim = %v", err)
	}
	_, r2, err := s.claim(ctx, "sbx_1")
	if err != nil {
		t.Fatalf("second claim = %v", err)
	}
	ls := claimLeases(t, st)
	if len(ls) != 1 || ls[0].Name != "claim/sbx_1/"+s.claims.holder || !sameReplica(ls[0].Holder, "cp-a") {
		t.Fatalf("leases with two claims of sbx_1 = %+v, want one of cp-a's", ls)
	}
	r1()
	if ls := claimLeases(t, st); len(ls) != 1 {
		t.Errorf("leases after one of two releases = %+v, want the claim kept", ls)
	}
	r2()
	if ls := claimLeases(t, st); len(ls) != 0 {
		t.Errorf("leases after both releases = %+v, want none", ls)
	}

	var wg sync.WaitGroup
	releases := make(chan func(), 40)
	for i := range 40 {
		wg.Go(func() {
			_, r, err := s.claim(ctx, []string{"sbx_a", "sbx_b", "sbx_c", "sbx_d"}[i%4])
			if err != nil {
				t.Errorf("claim = %v", err)
				return
			}
			releases <- r
		})
	}
	wg.Wait()
	close(releases)
	if ls := claimLeases(t, st); len(ls) != 4 {
		t.Errorf("leases with 40 claims of 4 records = %d, want 4", len(ls))
	}
	for r := range releases {
		r()
	}
	if ls := claimLeases(t, st); len(ls) != 0 {
		t.Errorf("leases after all releases = %+v, want none", ls)
	}
}

// creatingRecord stores a sandbox of t1 being created on the instant
// worker, as a create that stopped between its steps leaves it.
func creatingRecord(t *testing.T, st store.Store) store.Sandbox {
	t.Helper()
	sb, err := st.CreateSandbox(t.Context(), store.Sandbox{
		ID: store.NewSandboxID(), TeamID: "t1", Template: "default", State: sandbox.Creating,
		WorkerID: "instant", Spec: []byte(`{"template":"default","vcpus":1,"memory_mib":512}`),
		Expires: time.Now().Add(time.Hour),
	})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return sb
}

// TestReconcileLeavesOthersClaims checks that a record another replica
// claims is left alone by reconcile until that claim expires, and then
// settled (the dead claim removed).
func TestReconcileLeavesOthersClaims(t *testing.T) {
	s, st := claimsServer(t, "cp-a")
	ctx := t.Context()
	sb := creatingRecord(t, st)
	// Replica b claims it, for a little while.
	if _, err := st.AcquireLease(ctx, "claim/"+sb.ID+"/cp-b/x", "cp-b/x", 300*time.Millisecond); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := s.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	if got, _ := st.Sandbox(ctx, "t1", sb.ID); got.State != sandbox.Creating {
		t.Fatalf("a record replica b claims after a's reconcile: %s, want left creating", got.State)
	}
	time.Sleep(400 * time.Millisecond)
	if err := s.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	if got, _ := st.Sandbox(ctx, "t1", sb.ID); got.State != sandbox.Running {
		t.Errorf("a record whose claim expired after reconcile: %s, want running (the worker has it)", got.State)
	}
	if ls := claimLeases(t, st); len(ls) != 0 {
		t.Errorf("claims after reconcile = %+v, want the dead one removed", ls)
	}
}

// TestReconcileTakesEarlierLifesClaims checks that a restarted replica
// does not wait for the claims its earlier process left: they are dead.
func TestReconcileTakesEarlierLifesClaims(t *testing.T) {
	s, st := claimsServer(t, "cp-a")
	ctx := t.Context()
	sb := creatingRecord(t, st)
	if _, err := st.AcquireLease(ctx, "claim/"+sb.ID+"/cp-a/earlier", "cp-a/earlier", time.Hour); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := s.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	if got, _ := st.Sandbox(ctx, "t1", sb.ID); got.State != sandbox.Running {
		t.Errorf("a record an earlier life of this replica claimed, after reconcile: %s, want running", got.State)
	}
	if ls := claimLeases(t, st); len(ls) != 0 {
		t.Errorf("claims after reconcile = %+v, want the earlier life's removed", ls)
	}
}

// TestLostClaimFencesWrites checks that once a claim may have expired
// unrenewed, the writes made under it fail and change nothing, and that
// a new claim of the record works.
func TestLostClaimFencesWrites(t *testing.T) {
	s, st := claimsServer(t, "cp-a")
	s.claims.ttl, s.claims.every = 200*time.Millisecond, time.Hour // never renewed in time
	ctx := t.Context()
	sb := creatingRecord(t, st)
	cctx, release, err := s.claim(ctx, sb.ID)
	if err != nil {
		t.Fatalf("claim = %v", err)
	}
	defer release()
	time.Sleep(300 * time.Millisecond)
	if _, err := s.transition(cctx, sb, sandbox.Running, nil); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("a write under an expired claim = %v, want ErrLeaseLost", err)
	}
	if got, _ := st.Sandbox(ctx, "t1", sb.ID); got.State != sandbox.Creating || got.Version != sb.Version {
		t.Errorf("record after a fenced write = %s v%d, want unchanged", got.State, got.Version)
	}
	nctx, nrelease, err := s.claim(ctx, sb.ID)
	if err != nil {
		t.Fatalf("claim after the loss = %v", err)
	}
	defer nrelease()
	if _, err := s.transition(nctx, sb, sandbox.Running, nil); err != nil {
		t.Errorf("a write under a new claim = %v, want it written", err)
	}
}

// TestSettleSkipsLocalWork checks that reconcile does not act on a
// record this replica's own operation works on.
func TestSettleSkipsLocalWork(t *testing.T) {
	s, st := claimsServer(t, "cp-a")
	ctx := t.Context()
	sb := creatingRecord(t, st)
	_, release, err := s.claim(ctx, sb.ID)
	if err != nil {
		t.Fatalf("claim = %v", err)
	}
	ran := false
	if err := s.settle(ctx, sb.ID, func(context.Context) error { ran = true; return nil }); err != nil || ran {
		t.Errorf("settle of a record claimed here = %v, ran %v; want skipped", err, ran)
	}
	release()
	if err := s.settle(ctx, sb.ID, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("settle of an unclaimed record = %v, ran %v; want it run", err, ran)
	}
}
