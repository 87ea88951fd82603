package helmchart

import (
	"fmt"
	"testing"

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
	if apiVersion != "v1" || kind != "Secret" {
		return nil, false, fmt.Errorf("lookup of %s %s: the test cluster has only Secrets", apiVersion, kind)
	}
	return c.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}), true, nil
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
