package kindconfig

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/chart/common"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"

	"space/internal/deploy/helmchart"
	"space/internal/errkind"
	"space/internal/hostimage"
)

// rel is the release up.sh installs: its name holds the chart's, so
// resources are named space-*.
var rel = helmchart.Release{Name: "space", Namespace: "space"}

// repoPath is a path in this repository.
func repoPath(t *testing.T, rel ...string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join(append([]string{"..", "..", ".."}, rel...)...))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return p
}

func loadCluster(t *testing.T) *v1alpha4.Cluster {
	t.Helper()
	c, err := Load(repoPath(t, "deploy", "kind", "cluster.yaml"))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

// kindValues are deploy/kind/values.yaml with the image tag up.sh sets
// from the archives.
func kindValues(t *testing.T) map[string]any {
	t.Helper()
	v, err := common.ReadValuesFile(repoPath(t, "deploy", "kind", "values.yaml"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	img, ok := v["image"].(map[string]any)
	if !ok {
		t.Fatalf("deploy/kind/values.yaml has no image map")
	}
	img["tag"] = "sha-81e78ab2b2f3"
	return v
}

// renderKind renders the chart as up.sh installs it.
func renderKind(t *testing.T) *helmchart.Rendered {
	t.Helper()
	ch, err := helmchart.Load(repoPath(t, "deploy", "helm", "space"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	r, err := helmchart.Render(ch, kindValues(t), rel)
	if err != nil {
		t.Fatalf("Render(deploy/kind/values.yaml): %v", err)
	}
	return r
}

func workerDaemonSet(t *testing.T, r *helmchart.Rendered) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range r.Objects {
		if ds, ok := o.(*appsv1.DaemonSet); ok && ds.Name == "space-worker" {
			return ds
		}
	}
	t.Fatalf("rendered no DaemonSet space-worker")
	return nil
}

// TestClusterRunsWorkers checks the Kind cluster has one control plane
// and VM nodes that the worker DaemonSet, rendered with the Kind values,
// selects, each with the host's devices and directories that the
// DaemonSet's hostPaths need from it.
func TestClusterRunsWorkers(t *testing.T) {
	c := loadCluster(t)
	var roles []v1alpha4.NodeRole
	for _, n := range c.Nodes {
		roles = append(roles, n.Role)
	}
	if diff := cmp.Diff([]v1alpha4.NodeRole{v1alpha4.ControlPlaneRole, v1alpha4.WorkerRole}, roles); diff != "" {
		t.Errorf("node roles (-want +got):\n%s", diff)
	}

	spec := workerDaemonSet(t, renderKind(t)).Spec.Template.Spec
	if got, want := spec.NodeSelector["space/vm-host"], "true"; got != want {
		t.Fatalf("worker nodeSelector space/vm-host = %q, want %q", got, want)
	}
	vmNodes := Selected(c, spec.NodeSelector)
	if len(vmNodes) == 0 {
		t.Fatalf("Selected(cluster.yaml, %v) = no node: no worker would run", spec.NodeSelector)
	}

	// Host path in the node → host path on the Docker host it must come
	// from ("" for any). Guest RAM is a file in the VMs' run directories
	// under /dev/shm, so the node's must be (in) the host's tmpfs.
	want := map[string]string{"/dev/kvm": "/dev/kvm", "/dev/net/tun": "/dev/net/tun", "/dev/shm": ""}
	for _, v := range spec.Volumes {
		hp := v.HostPath
		switch {
		case hp == nil:
		case hp.Type != nil && *hp.Type == corev1.HostPathCharDev:
			want[hp.Path] = hp.Path
		case v.Name == "cache":
			want[hp.Path] = ""
		}
	}
	for i, n := range vmNodes {
		if n.Role != v1alpha4.WorkerRole {
			t.Errorf("VM node %d has role %q: the control plane's taint keeps workers off it", i, n.Role)
		}
		for path, host := range want {
			m, ok := Mount(n, path)
			switch {
			case !ok:
				t.Errorf("VM node %d mounts nothing on %s", i, path)
			case host != "" && m.HostPath != host:
				t.Errorf("VM node %d mounts %s on %s, want the host's %s", i, m.HostPath, path, host)
			case m.Readonly:
				t.Errorf("VM node %d mounts %s read-only", i, path)
			}
		}
		if m, _ := Mount(n, "/dev/shm"); m.HostPath != "/dev/shm" && !strings.HasPrefix(m.HostPath, "/dev/shm/") {
			t.Errorf("VM node %d mounts %q on /dev/shm, want the host's /dev/shm or a directory in it", i, m.HostPath)
		}
	}
	for _, n := range c.Nodes {
		if n.Role == v1alpha4.ControlPlaneRole && len(Selected(&v1alpha4.Cluster{Nodes: []v1alpha4.Node{n}}, spec.NodeSelector)) > 0 {
			t.Errorf("the control-plane node carries the worker's labels %v", spec.NodeSelector)
		}
	}
}

// TestValuesRender checks the Kind values pass the chart's schema (Render
// checks it) and run every container from the worker image that up.sh
// loads into the nodes, without pulling it.
func TestValuesRender(t *testing.T) {
	r := renderKind(t)
	image := hostimage.DefaultRepository + "space-" + hostimage.Worker + ":sha-81e78ab2b2f3"
	var pods []corev1.PodSpec
	var replicas int32
	for _, o := range r.Objects {
		switch o := o.(type) {
		case *appsv1.Deployment:
			pods = append(pods, o.Spec.Template.Spec)
			if o.Name == "space-server" && o.Spec.Replicas != nil {
				replicas = *o.Spec.Replicas
			}
		case *appsv1.DaemonSet:
			pods = append(pods, o.Spec.Template.Spec)
		}
	}
	if len(pods) < 2 {
		t.Fatalf("rendered %d Deployments and DaemonSets, want the server and the worker", len(pods))
	}
	for _, p := range pods {
		for _, ctr := range p.Containers {
			if ctr.Image != image {
				t.Errorf("container %s runs %q, want %q", ctr.Name, ctr.Image, image)
			}
			if ctr.ImagePullPolicy != corev1.PullNever && ctr.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("container %s has imagePullPolicy %s: Kind's nodes have the image but no registry", ctr.Name, ctr.ImagePullPolicy)
			}
		}
	}
	if replicas != 1 {
		t.Errorf("space-server replicas = %d, want 1 (SQLite)", replicas)
	}
	var claims int
	for _, o := range r.Objects {
		if _, ok := o.(*corev1.PersistentVolumeClaim); ok {
			claims++
		}
	}
	if claims != 1 {
		t.Errorf("rendered %d PersistentVolumeClaims, want 1 (the SQLite data dir, on Kind's default StorageClass)", claims)
	}
}

// TestParseRejects checks configs kind would refuse fail here too, with
// an InvalidArgument error.
func TestParseRejects(t *testing.T) {
	const head = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n"
	for _, tc := range []struct{ name, yaml string }{
		{"unknown field", head + "nodes:\n  - role: worker\n    extraMount: []\n"},
		{"unknown top-level field", head + "node: []\n"},
		{"misspelt mount field", head + "nodes:\n  - role: worker\n    extraMounts:\n      - hostpath: /dev/kvm\n        containerPath: /dev/kvm\n"},
		{"other apiVersion", "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha3\n"},
		{"other kind", "kind: Config\napiVersion: kind.x-k8s.io/v1alpha4\n"},
		{"two documents", head + "---\n" + head},
		{"unknown role", head + "nodes:\n  - role: master\n"},
		{"relative container path", head + "nodes:\n  - role: worker\n    extraMounts:\n      - hostPath: /dev/kvm\n        containerPath: dev/kvm\n"},
		{"no host path", head + "nodes:\n  - role: worker\n    extraMounts:\n      - containerPath: /dev/kvm\n"},
		{"unknown propagation", head + "nodes:\n  - role: worker\n    extraMounts:\n      - hostPath: /a\n        containerPath: /a\n        propagation: Shared\n"},
		{"not YAML", "nodes: [\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Parse(%q) = %v, %v; want an InvalidArgument error", tc.yaml, c, err)
			}
		})
	}
}

// TestParseDefaults checks Parse defaults as kind does: no nodes is one
// control plane, a node without a role is a control plane.
func TestParseDefaults(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []v1alpha4.NodeRole
	}{
		{"no nodes", "", []v1alpha4.NodeRole{v1alpha4.ControlPlaneRole}},
		{"no role", "nodes:\n  - labels: {a: b}\n  - role: worker\n", []v1alpha4.NodeRole{v1alpha4.ControlPlaneRole, v1alpha4.WorkerRole}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n" + tc.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			var got []v1alpha4.NodeRole
			for _, n := range c.Nodes {
				got = append(got, n.Role)
				if n.Image == "" {
					t.Errorf("node %q has no image after defaulting", n.Role)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("roles (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSelected(t *testing.T) {
	c := &v1alpha4.Cluster{Nodes: []v1alpha4.Node{
		{Role: v1alpha4.ControlPlaneRole},
		{Role: v1alpha4.WorkerRole, Labels: map[string]string{"space/vm-host": "true", "pool": "metal"}},
		{Role: v1alpha4.WorkerRole, Labels: map[string]string{"space/vm-host": "false"}},
	}}
	for _, tc := range []struct {
		name     string
		selector map[string]string
		want     int
	}{
		{"no selector", nil, 3},
		{"one label", map[string]string{"space/vm-host": "true"}, 1},
		{"two labels", map[string]string{"space/vm-host": "true", "pool": "metal"}, 1},
		{"no match", map[string]string{"space/vm-host": "true", "pool": "vm"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := len(Selected(c, tc.selector)); got != tc.want {
				t.Errorf("len(Selected(%v)) = %d, want %d", tc.selector, got, tc.want)
			}
		})
	}
}

// TestErrorsNamePath checks Load names the file in its errors.
func TestErrorsNamePath(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "missing.yaml"))
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load(missing) = %v, want an error naming the file", err)
	}
}
