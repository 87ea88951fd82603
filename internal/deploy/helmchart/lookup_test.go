package helmchart

import (
	"fmt"
	"slices"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// cluster answers the chart's lookups from a fake API server holding
// objs, as helm upgrade's lookups would be answered by the cluster.
type cluster struct {
	client *dynamicfake.FakeDynamicClient
}

func newCluster(objs ...runtime.Object) cluster {
	return cluster{client: dynamicfake.NewSimpleDynamicClient(scheme, objs...)}
}

func (c cluster) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	switch {
	case apiVersion == "v1" && kind == "Secret":
		return c.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}), true, nil
	case apiVersion == "v1" && kind == "Node":
		return c.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}), false, nil
	}
	return nil, false, fmt.Errorf("lookup of %s %s: the test cluster has only Secrets and Nodes", apiVersion, kind)
}

// TestClusterSecretKeptOnUpgrade checks an upgrade keeps the worker token
// and the secrets key that the install made, rather than making new ones
// that would lock out every worker and every sealed secret.
func TestClusterSecretKeptOnUpgrade(t *testing.T) {
	old := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "prod-space-cluster", Namespace: rel.Namespace},
		Data: map[string][]byte{
			"worker-token": []byte("token-made-at-install-0123456789"),
			"secrets-key":  []byte("0123456789abcdef0123456789abcdef"),
		},
	}
	r, err := RenderWithLookup(loadChart(t), nil, rel, newCluster(old))
	if err != nil {
		t.Fatalf("RenderWithLookup: %v", err)
	}
	got := must[*corev1.Secret](t, r, "prod-space-cluster")
	for _, k := range []string{"worker-token", "secrets-key"} {
		if string(got.Data[k]) != string(old.Data[k]) {
			t.Errorf("upgrade: %s = %q, want the installed %q", k, got.Data[k], old.Data[k])
		}
	}

	// Another release's Secret is not this one's.
	fresh, err := RenderWithLookup(loadChart(t), nil, Release{Name: "other", Namespace: rel.Namespace}, newCluster(old))
	if err != nil {
		t.Fatalf("RenderWithLookup: %v", err)
	}
	s := must[*corev1.Secret](t, fresh, "other-space-cluster")
	if string(s.Data["secrets-key"]) == string(old.Data["secrets-key"]) {
		t.Error("a release took another release's secrets key")
	}
}

func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// TestPurgeOnUninstall checks that the release leaves a post-delete Job
// on each node its workers run on (and on no other), running space
// worker purge with the worker's host paths and flags, and none when
// purging is off.
func TestPurgeOnUninstall(t *testing.T) {
	vm := map[string]string{"space/vm-host": "true"}
	c := newCluster(node("vm-1", vm), node("vm-2", vm), node("plain", nil))
	r, err := RenderWithLookup(loadChart(t), nil, rel, c)
	if err != nil {
		t.Fatalf("RenderWithLookup: %v", err)
	}
	jobs := map[string][]string{} // node → args
	for _, o := range r.Objects {
		j, ok := o.(*batchv1.Job)
		if !ok {
			continue
		}
		if j.Annotations["helm.sh/hook"] != "post-delete" {
			t.Errorf("job %s: hook %q, want post-delete", j.Name, j.Annotations["helm.sh/hook"])
		}
		spec := j.Spec.Template.Spec
		ct := spec.Containers[0]
		jobs[spec.NodeName] = ct.Args
		if ct.SecurityContext == nil || ct.SecurityContext.Privileged == nil || !*ct.SecurityContext.Privileged || !spec.HostPID {
			t.Errorf("job %s: want privileged and in the host's PID namespace", j.Name)
		}
	}
	if len(jobs) != 2 || jobs["vm-1"] == nil || jobs["vm-2"] == nil {
		t.Fatalf("purge jobs on %v, want one on each VM node", jobs)
	}
	for _, want := range []string{"worker", "purge", "--data-dir=/var/lib/space", "--cgroup-root=/host/sys/fs/cgroup", "--remove-chunks"} {
		if !slices.Contains(jobs["vm-1"], want) {
			t.Errorf("purge job args %q lack %q", jobs["vm-1"], want)
		}
	}
	r, err = RenderWithLookup(loadChart(t), map[string]any{"worker": map[string]any{"purgeOnUninstall": false}}, rel, c)
	if err != nil {
		t.Fatalf("RenderWithLookup: %v", err)
	}
	for _, o := range r.Objects {
		if _, ok := o.(*batchv1.Job); ok {
			t.Errorf("a purge job with purgeOnUninstall false")
		}
	}
}
