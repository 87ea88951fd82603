package controlplane

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"space/internal/leader"
	"space/internal/leader/kube"
	"space/internal/store/sqlite"
)

// TestLeaderOnLeaseWithFakeAPIServer checks the control plane leads its
// background work under a Kubernetes Lease when given that elector (a
// fake API server here; a real one runs in the k8s tier), holding it as
// its replica's holder.
func TestLeaderOnLeaseWithFakeAPIServer(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer st.Close()
	api := fake.NewSimpleClientset()
	s, err := New(Config{Store: st, Templates: []string{"default"}, ReplicaID: "cp-k",
		Elector: func(holder string) (leader.Elector, error) {
			return kube.New(kube.Config{Namespace: "space", Holder: holder, TTL: time.Second}, api)
		}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !s.Leading() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !s.Leading() {
		t.Fatalf("not leading on the Lease after 10s")
	}
	l, err := api.CoordinationV1().Leases("space").Get(t.Context(), "space-leader", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || !sameReplica(*l.Spec.HolderIdentity, "cp-k") {
		t.Errorf("the Lease = %+v, %v; want held by replica cp-k", l, err)
	}
	cancel()
	<-done
	if s.Leading() {
		t.Errorf("still leading after Run ended")
	}
}
