package controlplane

import (
	"context"
	"testing"
	"time"

	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/testenv/pgtest"
)

// TestOneLeader runs two replicas on one PostgreSQL database: exactly
// one leads; when it stops, the other takes over within the lease's ttl
// and its renewal, and settles at once a create that a dead replica left
// half done, once that replica's claim has expired.
func TestOneLeader(t *testing.T) {
	dsn := pgtest.Start(t)
	const ttl = 600 * time.Millisecond
	var servers []*Server
	var stores []store.Store
	for _, id := range []string{"cp-a", "cp-b"} {
		st, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		s, err := New(Config{Store: st, Templates: []string{"default"}, ReplicaID: id, LeaderTTL: ttl, ReconcileInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		s.AddWorker(&instantWorker{})
		servers, stores = append(servers, s), append(stores, st)
	}
	if _, err := stores[0].CreateTeam(t.Context(), store.Team{ID: "t1", Name: "t1"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	cancels := make([]context.CancelFunc, 2)
	done := make([]chan struct{}, 2)
	for i, s := range servers {
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i], done[i] = cancel, make(chan struct{})
		go func() { defer close(done[i]); s.Run(ctx) }()
	}
	t.Cleanup(func() {
		for i := range servers {
			cancels[i]()
			<-done[i]
		}
	})
	leaders := func() []int {
		var out []int
		for i, s := range servers {
			if s.Leading() {
				out = append(out, i)
			}
		}
		return out
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(leaders()) != 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ls := leaders()
	if len(ls) != 1 {
		t.Fatalf("leaders of two replicas = %v, want one", ls)
	}
	first := ls[0]
	other := 1 - first

	// A replica that died mid-create left a record and its claim.
	sb := creatingRecord(t, stores[0])
	if _, err := stores[0].AcquireLease(t.Context(), "claim/"+sb.ID+"/cp-dead/x", "cp-dead/x", 2*ttl); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t0 := time.Now()
	cancels[first]()
	<-done[first]
	for !servers[other].Leading() && time.Since(t0) < 5*ttl {
		time.Sleep(10 * time.Millisecond)
	}
	if !servers[other].Leading() {
		t.Fatalf("replica %d leads %v after the leader stopped, want within %v", other, time.Since(t0), 4*ttl/3)
	}
	t.Logf("leadership moved in %v", time.Since(t0).Round(time.Millisecond))
	var got store.Sandbox
	for time.Since(t0) < 10*ttl {
		got, _ = stores[other].Sandbox(t.Context(), "t1", sb.ID)
		if got.State == sandbox.Running {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.State != sandbox.Running {
		t.Errorf("a dead replica's interrupted create under the new leader: %s, want settled running", got.State)
	}
}
