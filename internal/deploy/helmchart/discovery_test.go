package helmchart

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestWorkerDiscoveryOnLeases checks the default workerDiscovery
// kubernetes: the workers publish Leases with an account of their own
// allowed exactly what the publisher does, the control plane watches
// them, and neither needs the control plane's Service.
func TestWorkerDiscoveryOnLeases(t *testing.T) {
	r := render(t, nil)
	server := container(t, must[*appsv1.Deployment](t, r, "prod-space-server").Spec.Template.Spec, "server")
	for f, want := range map[string]string{"worker-discovery": "kubernetes", "kube-namespace": "sandboxes"} {
		if v, ok := flag(server.Args, f); !ok || v != want {
			t.Errorf("server --%s = %q, %v; want %s", f, v, ok, want)
		}
	}
	role := must[*rbacv1.Role](t, r, "prod-space")
	if !hasRule(role.Rules, "coordination.k8s.io", "leases", "get", "list", "watch") {
		t.Errorf("control plane's Role %+v does not allow get/list/watch on leases", role.Rules)
	}

	spec := must[*appsv1.DaemonSet](t, r, "prod-space-worker").Spec.Template.Spec
	if spec.ServiceAccountName != "prod-space-worker" || spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Errorf("worker pods: account %q, token %v; want prod-space-worker's, mounted", spec.ServiceAccountName, spec.AutomountServiceAccountToken)
	}
	must[*corev1.ServiceAccount](t, r, "prod-space-worker")
	wrole := must[*rbacv1.Role](t, r, "prod-space-worker")
	want := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "update", "delete"}}}
	if diff := cmp.Diff(want, wrole.Rules); diff != "" {
		t.Errorf("workers' Role rules (-want +got):\n%s", diff)
	}
	rb := must[*rbacv1.RoleBinding](t, r, "prod-space-worker")
	wantSub := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prod-space-worker", Namespace: rel.Namespace}}
	if diff := cmp.Diff(wantSub, rb.Subjects); diff != "" || rb.RoleRef.Name != "prod-space-worker" {
		t.Errorf("workers' RoleBinding: role %q, subjects (-want +got):\n%s", rb.RoleRef.Name, diff)
	}
}

// TestWorkerDiscoveryToken checks workerDiscovery token: the workers
// register at the control plane's Service with no account token, and
// nothing of the Lease discovery is rendered.
func TestWorkerDiscoveryToken(t *testing.T) {
	r := render(t, map[string]any{"workerDiscovery": "token"})
	spec := must[*appsv1.DaemonSet](t, r, "prod-space-worker").Spec.Template.Spec
	c := container(t, spec, "worker")
	if v, _ := flag(c.Args, "control-plane"); v != "http://prod-space-server.sandboxes.svc:7070" {
		t.Errorf("worker --control-plane = %q, want the control plane's Service", v)
	}
	for _, f := range []string{"discovery", "kube-namespace"} {
		if v, ok := flag(c.Args, f); ok {
			t.Errorf("worker --%s = %q, want none", f, v)
		}
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("worker pods get a service account token with workerDiscovery token")
	}
	server := container(t, must[*appsv1.Deployment](t, r, "prod-space-server").Spec.Template.Spec, "server")
	if v, ok := flag(server.Args, "worker-discovery"); ok {
		t.Errorf("server --worker-discovery = %q, want the server's default (token)", v)
	}
	for _, name := range []string{"prod-space-worker"} {
		if _, ok := object[*rbacv1.Role](r, name); ok {
			t.Errorf("rendered Role %s with workerDiscovery token", name)
		}
		if _, ok := object[*corev1.ServiceAccount](r, name); ok {
			t.Errorf("rendered ServiceAccount %s with workerDiscovery token", name)
		}
	}
}

// TestWorkerDiscoveryRefused checks workerDiscovery kubernetes without
// rbac.create is refused saying why, and an unknown mode by the schema.
func TestWorkerDiscoveryRefused(t *testing.T) {
	_, err := Render(loadChart(t), map[string]any{"rbac": map[string]any{"create": false}}, rel)
	if err == nil || !strings.Contains(err.Error(), "workerDiscovery kubernetes needs rbac.create") {
		t.Errorf("workerDiscovery kubernetes without rbac = %v, want refused: needs rbac.create", err)
	}
	if _, err := Render(loadChart(t), map[string]any{"workerDiscovery": "dns"}, rel); err == nil {
		t.Errorf("workerDiscovery dns rendered, want refused by the schema")
	}
	if _, err := Render(loadChart(t), map[string]any{"workerDiscovery": "token", "rbac": map[string]any{"create": false}}, rel); err != nil {
		t.Errorf("workerDiscovery token without rbac = %v, want rendered", err)
	}
}

// hasRule reports whether rules grant verbs on resource of group.
func hasRule(rules []rbacv1.PolicyRule, group, resource string, verbs ...string) bool {
	for _, r := range rules {
		if !cmp.Equal(r.APIGroups, []string{group}) || !cmp.Equal(r.Resources, []string{resource}) {
			continue
		}
		have := map[string]bool{}
		for _, v := range r.Verbs {
			have[v] = true
		}
		ok := true
		for _, v := range verbs {
			ok = ok && have[v]
		}
		if ok {
			return true
		}
	}
	return false
}
