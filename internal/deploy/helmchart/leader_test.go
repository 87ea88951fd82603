package helmchart

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestLeaderElectionOnLease checks server.leaderElection kubernetes
// passes --leader-election kubernetes with the account's token mounted,
// and is refused without the RBAC that lets the replicas update the
// Lease.
func TestLeaderElectionOnLease(t *testing.T) {
	r := render(t, map[string]any{"server": map[string]any{"leaderElection": "kubernetes"}, "rbac": map[string]any{"create": true}})
	spec := must[*appsv1.Deployment](t, r, "prod-space-server").Spec.Template.Spec
	if v, ok := flag(container(t, spec, "server").Args, "leader-election"); !ok || v != "kubernetes" {
		t.Errorf("--leader-election = %q, %v; want kubernetes", v, ok)
	}
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Errorf("the account's token is not mounted: the replicas cannot reach the API server")
	}
	if v, ok := flag(container(t, must[*appsv1.Deployment](t, render(t, nil), "prod-space-server").Spec.Template.Spec, "server").Args, "leader-election"); ok {
		t.Errorf("default --leader-election = %q, want the server's default (store)", v)
	}
	_, err := Render(loadChart(t), map[string]any{"server": map[string]any{"leaderElection": "kubernetes"}, "workerDiscovery": "token", "rbac": map[string]any{"create": false}}, rel)
	if err == nil || !strings.Contains(err.Error(), "needs rbac.create") {
		t.Errorf("leaderElection kubernetes without rbac = %v, want refused: needs rbac.create", err)
	}
}
