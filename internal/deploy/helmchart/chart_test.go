package helmchart

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"space/internal/errkind"
)

// rel is the release every test renders; its name lacks the chart's, so
// resources are named prod-space-*.
var rel = Release{Name: "prod", Namespace: "sandboxes"}

// chartDir is the chart's directory in this repository.
func chartDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "deploy", "helm", "space"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return dir
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := Load(chartDir(t))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return ch
}

// ciValues reads the chart's ci/NAME-values.yaml.
func ciValues(t *testing.T, name string) map[string]any {
	t.Helper()
	v, err := common.ReadValuesFile(filepath.Join(chartDir(t), "ci", name+"-values.yaml"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return v
}

// variants are the values the chart is linted and rendered with: its
// defaults, and each file in its ci directory.
func variants(t *testing.T) map[string]map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("setup: no ci values files (%v)", err)
	}
	v := map[string]map[string]any{"defaults": nil}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), "-values.yaml")
		v[name] = ciValues(t, name)
	}
	return v
}

func render(t *testing.T, values map[string]any) *Rendered {
	t.Helper()
	r, err := Render(loadChart(t), values, rel)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return r
}

// object returns the rendered object of type T named name, or the zero T
// and false.
func object[T interface {
	runtime.Object
	metav1.Object
}](r *Rendered, name string) (T, bool) {
	for _, o := range r.Objects {
		if v, ok := o.(T); ok && v.GetName() == name {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// must is object for an object that must be there.
func must[T interface {
	runtime.Object
	metav1.Object
}](t *testing.T, r *Rendered, name string) T {
	t.Helper()
	v, ok := object[T](r, name)
	if !ok {
		t.Fatalf("rendered no %T named %q; got %s", v, name, kinds(r))
	}
	return v
}

// kinds lists the rendered objects as Kind/name.
func kinds(r *Rendered) string {
	var s []string
	for _, o := range r.Objects {
		m := o.(metav1.Object)
		s = append(s, o.GetObjectKind().GroupVersionKind().Kind+"/"+m.GetName())
	}
	return strings.Join(s, ", ")
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("pod has no container %q", name)
	return corev1.Container{}
}

func volume(t *testing.T, spec corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("pod has no volume %q", name)
	return corev1.Volume{}
}

func mount(t *testing.T, c corev1.Container, name string) corev1.VolumeMount {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("container %s has no mount of %q", c.Name, name)
	return corev1.VolumeMount{}
}

func env(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// flag returns the value of --name=V in args.
func flag(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestLint(t *testing.T) {
	for name, values := range variants(t) {
		t.Run(name, func(t *testing.T) {
			for _, m := range Lint(chartDir(t), values, rel.Namespace) {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %v", m)
				} else {
					t.Logf("lint: %v", m)
				}
			}
		})
	}
}

// TestRenderDecodes renders every variant and checks each manifest
// decodes strictly as its API type and carries the standard labels.
func TestRenderDecodes(t *testing.T) {
	for name, values := range variants(t) {
		t.Run(name, func(t *testing.T) {
			r := render(t, values)
			if len(r.Objects) == 0 {
				t.Fatal("Render made no objects")
			}
			for _, o := range r.Objects {
				m := o.(metav1.Object)
				l := m.GetLabels()
				for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart"} {
					if l[k] == "" {
						t.Errorf("%T %s: no label %s (labels %v)", o, m.GetName(), k, l)
					}
				}
				if l["app.kubernetes.io/instance"] != rel.Name {
					t.Errorf("%T %s: instance label %q, want %q", o, m.GetName(), l["app.kubernetes.io/instance"], rel.Name)
				}
			}
			for _, o := range r.Objects {
				var spec *corev1.PodSpec
				switch o := o.(type) {
				case *appsv1.Deployment:
					spec = &o.Spec.Template.Spec
				case *appsv1.DaemonSet:
					spec = &o.Spec.Template.Spec
				}
				if spec != nil && (spec.EnableServiceLinks == nil || *spec.EnableServiceLinks) {
					t.Errorf("%T %s: service links on: a release named space would set SPACE_* variables", o, o.(metav1.Object).GetName())
				}
			}
			if r.Notes == "" {
				t.Error("NOTES.txt rendered to nothing")
			}
		})
	}
}

func TestDefaultsWorker(t *testing.T) {
	r := render(t, nil)
	ds := must[*appsv1.DaemonSet](t, r, "prod-space-worker")
	spec := ds.Spec.Template.Spec
	c := container(t, spec, "worker")

	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("worker securityContext = %+v, want privileged", c.SecurityContext)
	}
	if !spec.HostPID {
		t.Error("worker hostPID = false, want true")
	}
	if spec.HostNetwork {
		t.Error("worker hostNetwork = true, want false")
	}
	// The default workerDiscovery kubernetes: see discovery_test.go.
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken || spec.ServiceAccountName != "prod-space-worker" {
		t.Errorf("worker pods: account %q, token mounted %v; want prod-space-worker's token mounted", spec.ServiceAccountName, spec.AutomountServiceAccountToken)
	}
	if got, want := ds.Spec.UpdateStrategy.Type, appsv1.RollingUpdateDaemonSetStrategyType; got != want {
		t.Errorf("updateStrategy = %s, want %s", got, want)
	}
	if got, want := spec.NodeSelector, map[string]string{"space/vm-host": "true"}; !cmp.Equal(got, want) {
		t.Errorf("nodeSelector = %v, want %v", got, want)
	}

	charDev := corev1.HostPathCharDev
	for vol, path := range map[string]string{"kvm": "/dev/kvm", "tun": "/dev/net/tun"} {
		v := volume(t, spec, vol)
		want := &corev1.HostPathVolumeSource{Path: path, Type: &charDev}
		if diff := cmp.Diff(want, v.HostPath); diff != "" {
			t.Errorf("volume %s (-want +got):\n%s", vol, diff)
		}
		if got := mount(t, c, vol).MountPath; got != path {
			t.Errorf("mount of %s at %s, want %s", vol, got, path)
		}
	}
	bidi := corev1.MountPropagationBidirectional
	for vol, hostPath := range map[string]string{"data": "/var/lib/space", "netns": "/run/netns"} {
		if got := volume(t, spec, vol).HostPath; got == nil || got.Path != hostPath {
			t.Errorf("volume %s = %+v, want hostPath %s", vol, got, hostPath)
		}
		if got := mount(t, c, vol).MountPropagation; got == nil || *got != bidi {
			t.Errorf("mount of %s: propagation %v, want Bidirectional", vol, got)
		}
	}
	for vol, hostPath := range map[string]string{"chunks": "/var/lib/space-chunks", "cache": "/var/cache/space", "shm": "/dev/shm"} {
		if got := volume(t, spec, vol).HostPath; got == nil || got.Path != hostPath {
			t.Errorf("volume %s = %+v, want hostPath %s", vol, got, hostPath)
		}
	}

	want := map[string]string{
		"discovery":      "kubernetes",
		"kube-namespace": "sandboxes",
		"advertise":      "https://$(POD_IP):7071",
		"token-file":     "/etc/space/secrets/worker-token",
		"id":             "$(NODE_NAME)",
		"data-dir":       "/var/lib/space",
		"chunks":         "/var/lib/space-chunks",
		"cache":          "/var/cache/space",
		"listen":         ":7071",
		"vmm":            "auto",
		"cgroup-root":    "/host/sys/fs/cgroup",
	}
	if v, ok := flag(c.Args, "control-plane"); ok {
		t.Errorf("worker --control-plane = %q, want none: it is found through its Lease", v)
	}
	if c.Args[0] != "worker" {
		t.Errorf("worker args = %q, want the worker verb first", c.Args)
	}
	for f, v := range want {
		if got, _ := flag(c.Args, f); got != v {
			t.Errorf("worker --%s = %q, want %q (args %q)", f, got, v, c.Args)
		}
	}
	for _, f := range []string{"vcpus", "memory"} {
		if v, ok := flag(c.Args, f); ok {
			t.Errorf("worker --%s=%s, want it left to the worker's default", f, v)
		}
	}
	for name, field := range map[string]string{"POD_IP": "status.podIP", "NODE_NAME": "spec.nodeName"} {
		e, ok := env(c, name)
		if !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
			t.Errorf("worker env %s = %+v, want the downward API's %s", name, e, field)
		}
	}

	// The worker sees the token and nothing else of the cluster Secret.
	tok := volume(t, spec, "worker-token").Secret
	if tok == nil || tok.SecretName != "prod-space-cluster" {
		t.Fatalf("worker-token volume = %+v, want Secret prod-space-cluster", tok)
	}
	if diff := cmp.Diff([]corev1.KeyToPath{{Key: "worker-token", Path: "worker-token"}}, tok.Items); diff != "" {
		t.Errorf("worker-token items (-want +got):\n%s", diff)
	}
	if c.StartupProbe == nil || c.StartupProbe.TCPSocket == nil || c.LivenessProbe == nil || c.LivenessProbe.TCPSocket == nil {
		t.Errorf("worker probes: startup %+v, liveness %+v, want TCP probes", c.StartupProbe, c.LivenessProbe)
	}
	if c.Resources.Limits.Memory() != nil && !c.Resources.Limits.Memory().IsZero() {
		t.Errorf("worker memory limit %v: its VMs would count against it", c.Resources.Limits.Memory())
	}
}

func TestDefaultsServer(t *testing.T) {
	r := render(t, nil)
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("server replicas = %v, want 2", d.Spec.Replicas)
	}
	if got := d.Spec.Strategy.Type; got != appsv1.RollingUpdateDeploymentStrategyType {
		t.Errorf("server strategy = %s, want RollingUpdate", got)
	}
	spec := d.Spec.Template.Spec
	c := container(t, spec, "server")
	if c.Args[0] != "server" || !slices.Contains(c.Args, "--no-worker") {
		t.Errorf("server args = %q, want server --no-worker ...", c.Args)
	}
	for f, v := range map[string]string{
		"worker-token-file": "/etc/space/secrets/worker-token",
		"secrets-key":       "/etc/space/secrets/secrets-key",
		"admin-key-file":    "/etc/space/secrets/admin-key",
		"listen":            ":7070",
		"data-dir":          "/var/lib/space",
	} {
		if got, _ := flag(c.Args, f); got != v {
			t.Errorf("server --%s = %q, want %q (args %q)", f, got, v, c.Args)
		}
	}
	for _, f := range []string{"data-plane-url", "store", "chunks"} {
		if v, ok := flag(c.Args, f); ok {
			t.Errorf("server --%s=%s by default, want none", f, v)
		}
	}

	// The PostgreSQL URL comes from the Secret the operator makes.
	e, ok := env(c, "SPACE_STORE_URL")
	want := &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "prod-space-postgres"}, Key: "dsn"}
	if !ok || e.ValueFrom == nil || !cmp.Equal(e.ValueFrom.SecretKeyRef, want) {
		t.Errorf("server env SPACE_STORE_URL = %+v, want from %+v", e, want)
	}
	if _, ok := object[*corev1.Secret](r, "prod-space-postgres"); ok {
		t.Error("the chart made the PostgreSQL Secret without a dsn")
	}

	sec := volume(t, spec, "cluster-secret").Secret
	if sec == nil || sec.SecretName != "prod-space-cluster" || sec.DefaultMode == nil || *sec.DefaultMode != 0o400 {
		t.Errorf("cluster-secret volume = %+v, want Secret prod-space-cluster, mode 0400", sec)
	}
	if v := volume(t, spec, "data"); v.EmptyDir == nil {
		t.Errorf("data volume = %+v, want an emptyDir", v.VolumeSource)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/v1/health" || p.HTTPGet.Port != intstr.FromString("api") {
			t.Errorf("server %s probe = %+v, want GET /v1/health on api", name, p)
		}
	}
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Error("server pods get no service account token with the default rbac.create")
	}
	if got := spec.ServiceAccountName; got != "prod-space" {
		t.Errorf("server serviceAccountName = %q, want prod-space", got)
	}
	must[*corev1.ServiceAccount](t, r, "prod-space")

	svc := must[*corev1.Service](t, r, "prod-space-server")
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 7070 {
		t.Errorf("server Service ports = %+v, want 7070", svc.Spec.Ports)
	}
	if diff := cmp.Diff(d.Spec.Selector.MatchLabels, svc.Spec.Selector); diff != "" {
		t.Errorf("Service selector differs from the Deployment's (-deployment +service):\n%s", diff)
	}

	pdb := must[*policyv1.PodDisruptionBudget](t, r, "prod-space-server")
	if got := pdb.Spec.MinAvailable; got == nil || *got != intstr.FromInt32(1) {
		t.Errorf("PDB minAvailable = %v, want 1", got)
	}
	if diff := cmp.Diff(d.Spec.Selector, pdb.Spec.Selector); diff != "" {
		t.Errorf("PDB selector differs from the Deployment's (-deployment +pdb):\n%s", diff)
	}

	for _, o := range r.Objects {
		switch o.(type) {
		case *corev1.PersistentVolumeClaim:
			t.Errorf("rendered %T %s by default", o, o.(metav1.Object).GetName())
		}
	}
	if _, ok := object[*appsv1.Deployment](r, "prod-space-proxy"); ok {
		t.Error("rendered the proxy by default")
	}
}

// TestClusterSecretGenerated checks the Secret the chart makes: a token
// the worker protocol takes, a secrets key of the size the server reads and
// an admin key, kept on uninstall.
func TestClusterSecretGenerated(t *testing.T) {
	s := must[*corev1.Secret](t, render(t, nil), "prod-space-cluster")
	if got := len(s.Data["worker-token"]); got != 64 {
		t.Errorf("worker-token has %d bytes, want 64", got)
	}
	if got := len(s.Data["secrets-key"]); got != 32 {
		t.Errorf("secrets-key has %d bytes, want 32", got)
	}
	// The admin key is one the server accepts (controlplane.BootstrapKey).
	if k := string(s.Data["admin-key"]); len(k) != 51 || !strings.HasPrefix(k, "sk_") || strings.ToLower(k) != k {
		t.Errorf("admin-key = %q, want sk_ and 48 lower-case characters", k)
	}
	if got := s.Annotations["helm.sh/resource-policy"]; got != "keep" {
		t.Errorf("resource-policy = %q, want keep", got)
	}
	other := must[*corev1.Secret](t, render(t, nil), "prod-space-cluster")
	if string(other.Data["secrets-key"]) == string(s.Data["secrets-key"]) {
		t.Error("two renders without a cluster made the same secrets key")
	}
}

func TestPostgresThreeReplicas(t *testing.T) {
	r := render(t, ciValues(t, "postgres-3-replicas"))
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("server replicas = %v, want 3", d.Spec.Replicas)
	}
	s := must[*corev1.Secret](t, r, "prod-space-postgres")
	if got, want := string(s.Data["dsn"]), "postgres://space:secret@db.example:5432/space?sslmode=require"; got != want {
		t.Errorf("postgres Secret dsn = %q, want %q", got, want)
	}
	if d.Spec.Template.Annotations["checksum/postgres"] == "" {
		t.Error("no checksum/postgres annotation: a new URL would not roll the replicas")
	}
	c := container(t, d.Spec.Template.Spec, "server")
	if e, _ := env(c, "SPACE_STORE_URL"); e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Name != "prod-space-postgres" {
		t.Errorf("SPACE_STORE_URL = %+v, want from Secret prod-space-postgres", e)
	}
	for _, a := range c.Args {
		if strings.Contains(a, "secret@") {
			t.Errorf("server args carry the PostgreSQL password: %q", a)
		}
	}
	must[*policyv1.PodDisruptionBudget](t, r, "prod-space-server")
}

func TestPDBOnlyWithReplicas(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   bool
	}{
		{"defaults", nil, true},
		{"one replica", map[string]any{"server": map[string]any{"replicas": 1}}, false},
		{"sqlite", ciValues(t, "sqlite"), false},
		{"disabled", map[string]any{"server": map[string]any{"pdb": map[string]any{"enabled": false}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got := object[*policyv1.PodDisruptionBudget](render(t, tc.values), "prod-space-server")
			if got != tc.want {
				t.Errorf("PodDisruptionBudget rendered = %t, want %t", got, tc.want)
			}
		})
	}
}

func TestSQLite(t *testing.T) {
	r := render(t, ciValues(t, "sqlite"))
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("server replicas = %v, want 1", d.Spec.Replicas)
	}
	if got := d.Spec.Strategy.Type; got != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("server strategy = %s, want Recreate (one process may open SQLite)", got)
	}
	spec := d.Spec.Template.Spec
	if v := volume(t, spec, "data").PersistentVolumeClaim; v == nil || v.ClaimName != "prod-space-server" {
		t.Errorf("data volume = %+v, want the claim prod-space-server", v)
	}
	c := container(t, spec, "server")
	if e, ok := env(c, "SPACE_STORE_URL"); ok {
		t.Errorf("SQLite server has SPACE_STORE_URL %+v", e)
	}
	pvc := must[*corev1.PersistentVolumeClaim](t, r, "prod-space-server")
	if got := pvc.Spec.Resources.Requests.Storage().String(); got != "20Gi" {
		t.Errorf("claim size = %s, want 20Gi", got)
	}
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != "fast" {
		t.Errorf("claim storage class = %v, want fast", pvc.Spec.StorageClassName)
	}
	if _, ok := object[*corev1.Secret](r, "prod-space-postgres"); ok {
		t.Error("SQLite release made a PostgreSQL Secret")
	}
}

func TestVMNodes(t *testing.T) {
	ds := must[*appsv1.DaemonSet](t, render(t, ciValues(t, "vm-nodes")), "prod-space-worker")
	spec := ds.Spec.Template.Spec
	want := map[string]string{"node.kubernetes.io/instance-type": "metal", "space/vm-host": "true"}
	if diff := cmp.Diff(want, spec.NodeSelector); diff != "" {
		t.Errorf("nodeSelector (-want +got):\n%s", diff)
	}
	wantTol := []corev1.Toleration{{Key: "space/vm-host", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	if diff := cmp.Diff(wantTol, spec.Tolerations); diff != "" {
		t.Errorf("tolerations (-want +got):\n%s", diff)
	}
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil {
		t.Errorf("affinity = %+v, want the node affinity", spec.Affinity)
	}
	if got := spec.PriorityClassName; got != "system-node-critical" {
		t.Errorf("priorityClassName = %q", got)
	}
	u := ds.Spec.UpdateStrategy
	one, zero := intstr.FromInt32(1), intstr.FromInt32(0)
	wantU := appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &one, MaxSurge: &zero}}
	if diff := cmp.Diff(wantU, u); diff != "" {
		t.Errorf("updateStrategy (-want +got):\n%s", diff)
	}
	c := container(t, spec, "worker")
	for f, v := range map[string]string{"vcpus": "64", "memory": "262144"} {
		if got, _ := flag(c.Args, f); got != v {
			t.Errorf("worker --%s = %q, want %q", f, got, v)
		}
	}
}

func TestSharedChunks(t *testing.T) {
	r := render(t, ciValues(t, "shared-chunks"))
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	ds := must[*appsv1.DaemonSet](t, r, "prod-space-worker")
	for what, spec := range map[string]corev1.PodSpec{"server": d.Spec.Template.Spec, "worker": ds.Spec.Template.Spec} {
		if v := volume(t, spec, "chunks").PersistentVolumeClaim; v == nil || v.ClaimName != "space-chunks" {
			t.Errorf("%s chunks volume = %+v, want the claim space-chunks", what, v)
		}
		if got, _ := flag(container(t, spec, what).Args, "chunks"); got != "/var/lib/space-chunks" {
			t.Errorf("%s --chunks = %q, want the shared volume", what, got)
		}
	}
	sc := container(t, d.Spec.Template.Spec, "server")
	if got, _ := flag(sc.Args, "data-plane-url"); got != "https://data.space.example" {
		t.Errorf("--data-plane-url = %q, want the value's", got)
	}
	if e, _ := env(sc, "SPACE_STORE_URL"); e.ValueFrom == nil || !cmp.Equal(e.ValueFrom.SecretKeyRef,
		&corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "space-db"}, Key: "url"}) {
		t.Errorf("SPACE_STORE_URL = %+v, want space-db's url", e)
	}
	// Existing Secrets: the chart makes neither, and every pod reads the named one.
	for _, o := range r.Objects {
		if s, ok := o.(*corev1.Secret); ok {
			t.Errorf("made Secret %s with existing secrets named", s.Name)
		}
	}
	for what, spec := range map[string]corev1.PodSpec{"server": d.Spec.Template.Spec, "worker": ds.Spec.Template.Spec} {
		for _, v := range spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName != "space-cluster" {
				t.Errorf("%s volume %s reads Secret %s, want space-cluster", what, v.Name, v.Secret.SecretName)
			}
		}
	}

	proxy := must[*appsv1.Deployment](t, r, "prod-space-proxy")
	pc := container(t, proxy.Spec.Template.Spec, "proxy")
	if pc.Args[0] != "proxy" {
		t.Errorf("proxy args = %q", pc.Args)
	}
	if got, _ := flag(pc.Args, "token-file"); got != "/etc/space/secrets/worker-token" {
		t.Errorf("proxy --token-file = %q", got)
	}
	must[*corev1.Service](t, r, "prod-space-proxy")

	role := must[*rbacv1.Role](t, r, "prod-space")
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update"}},
	}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("Role rules (-want +got):\n%s", diff)
	}
	rb := must[*rbacv1.RoleBinding](t, r, "prod-space")
	wantSub := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prod-space", Namespace: rel.Namespace}}
	if diff := cmp.Diff(wantSub, rb.Subjects); diff != "" {
		t.Errorf("RoleBinding subjects (-want +got):\n%s", diff)
	}
	if a := d.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || !*a {
		t.Error("with rbac.create the server gets no service account token")
	}
}

// TestProxyDataPlaneURL checks the control plane sends clients to the
// proxies' Service when the proxy runs and no URL is given.
func TestProxyDataPlaneURL(t *testing.T) {
	r := render(t, map[string]any{"proxy": map[string]any{"enabled": true}})
	c := container(t, must[*appsv1.Deployment](t, r, "prod-space-server").Spec.Template.Spec, "server")
	if got, want := mustFlag(t, c.Args, "data-plane-url"), "http://prod-space-proxy.sandboxes.svc:7072"; got != want {
		t.Errorf("--data-plane-url = %q, want %q", got, want)
	}
}

func mustFlag(t *testing.T, args []string, name string) string {
	t.Helper()
	v, ok := flag(args, name)
	if !ok {
		t.Fatalf("no --%s in %q", name, args)
	}
	return v
}

// TestSchemaRejects checks values the binaries would refuse, or that
// would break the control plane, fail before anything renders, in Render
// and in helm lint alike.
func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
	}{
		{"sqlite with 3 replicas", map[string]any{"server": map[string]any{"replicas": 3, "store": map[string]any{"type": "sqlite"}}}},
		{"sqlite with the default replicas", map[string]any{"server": map[string]any{"store": map[string]any{"type": "sqlite"}}}},
		{"unknown vmm", map[string]any{"vmm": "bochs"}},
		{"unknown store", map[string]any{"server": map[string]any{"store": map[string]any{"type": "mysql"}}}},
		{"dsn not postgres", map[string]any{"server": map[string]any{"store": map[string]any{"postgres": map[string]any{"dsn": "mysql://x"}}}}},
		{"shared chunks without a claim", map[string]any{"chunkStore": map[string]any{"type": "sharedVolume"}}},
		{"s3 chunks without settings", map[string]any{"chunkStore": map[string]any{"type": "s3"}}},
		{"s3 chunks without a secret", map[string]any{"chunkStore": map[string]any{"type": "s3", "s3": map[string]any{"endpoint": "s3.example.com", "bucket": "snaps"}}}},
		{"s3 chunks without a bucket", map[string]any{"chunkStore": map[string]any{"type": "s3", "s3": map[string]any{"endpoint": "s3.example.com", "existingSecret": "c"}}}},
		{"s3 chunks without an endpoint", map[string]any{"chunkStore": map[string]any{"type": "s3", "s3": map[string]any{"bucket": "snaps", "existingSecret": "c"}}}},
		{"s3 endpoint with a scheme", map[string]any{"chunkStore": map[string]any{"type": "s3", "s3": map[string]any{"endpoint": "https://s3.example.com", "bucket": "snaps", "existingSecret": "c"}}}},
		{"s3 bad bucket name", map[string]any{"chunkStore": map[string]any{"type": "s3", "s3": map[string]any{"endpoint": "s3.example.com", "bucket": "Snaps_1", "existingSecret": "c"}}}},
		{"s3 prefix with dots", map[string]any{"chunkStore": map[string]any{"type": "s3", "s3": map[string]any{"endpoint": "s3.example.com", "bucket": "snaps", "prefix": "a/../b", "existingSecret": "c"}}}},
		{"unknown update strategy", map[string]any{"worker": map[string]any{"updateStrategy": map[string]any{"type": "Surge"}}}},
		{"misspelt value", map[string]any{"worker": map[string]any{"nodeSelectors": map[string]any{"a": "b"}}}},
		{"zero replicas", map[string]any{"server": map[string]any{"replicas": 0}}},
		{"relative host path", map[string]any{"worker": map[string]any{"hostPaths": map[string]any{"dataDir": "var/lib/space"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(loadChart(t), tc.values, rel)
			if !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Render(%v) = %v, want a schema error (InvalidArgument)", tc.values, err)
			}
			if !slices.ContainsFunc(Lint(chartDir(t), tc.values, rel.Namespace), func(m support.Message) bool { return m.Severity == support.ErrorSev }) {
				t.Errorf("Lint(%v) reported no error", tc.values)
			}
		})
	}
}

// TestREADMEListsEveryValue checks the chart's README has a row for
// every value in values.yaml.
func TestREADMEListsEveryValue(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(chartDir(t), "README.md"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var paths []string
	leaves("", loadChart(t).Values, &paths)
	for _, p := range paths {
		if !strings.Contains(string(readme), "| `"+p+"` |") {
			t.Errorf("README.md has no row for `%s`", p)
		}
	}
}

// leaves appends the dotted paths of v's values that are not maps with
// keys (an empty map is a value of its own) to out.
func leaves(prefix string, v map[string]any, out *[]string) {
	for k, x := range v {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if m, ok := x.(map[string]any); ok && len(m) > 0 && !freeForm[p] {
			leaves(p, m, out)
			continue
		}
		*out = append(*out, p)
	}
}

// freeForm are maps whose keys are the user's (the README lists the map).
var freeForm = map[string]bool{
	"server.resources": true, "worker.resources": true, "proxy.resources": true, "worker.nodeSelector": true,
}

// TestNotes checks NOTES.txt tells what is missing: the PostgreSQL Secret
// when the chart makes none, and how to label the VM nodes.
func TestNotes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		values   map[string]any
		want     []string
		dontWant []string
	}{
		{"defaults", nil,
			[]string{"create secret generic prod-space-postgres", "--from-literal=dsn=", "kubectl label node NODE space/vm-host=true\n", "admin.key",
				"svc/prod-space-server-metrics port 9464\n", "svc/prod-space-worker-metrics port 9465\n", "metrics.serviceMonitor.enabled"},
			nil},
		{"monitoring", ciValues(t, "monitoring"),
			[]string{"svc/prod-space-server-metrics port 9100\n"},
			[]string{"metrics.serviceMonitor.enabled"}},
		{"metrics off", map[string]any{"metrics": map[string]any{"enabled": false}},
			nil,
			[]string{"Prometheus metrics"}},
		{"postgres-3-replicas", ciValues(t, "postgres-3-replicas"),
			[]string{"3 replica(s)"},
			[]string{"create secret generic", "secret@"}},
		{"sqlite", ciValues(t, "sqlite"),
			[]string{"claim prod-space-server"},
			[]string{"create secret generic"}},
		{"vm-nodes", ciValues(t, "vm-nodes"),
			[]string{"kubectl label node NODE node.kubernetes.io/instance-type=metal space/vm-host=true\n"},
			[]string{"OnDelete"}},
		{"no node selector", map[string]any{"worker": map[string]any{"nodeSelector": nil}},
			[]string{"run on every node."},
			[]string{"kubectl label"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notes := render(t, tc.values).Notes
			for _, s := range tc.want {
				if !strings.Contains(notes, s) {
					t.Errorf("NOTES.txt lacks %q:\n%s", s, notes)
				}
			}
			for _, s := range tc.dontWant {
				if strings.Contains(notes, s) {
					t.Errorf("NOTES.txt has %q:\n%s", s, notes)
				}
			}
		})
	}
}

// TestNullRemovesDefaults checks a null in the values removes a default
// map, as helm's users do to run workers on every node or drop limits.
func TestNullRemovesDefaults(t *testing.T) {
	r := render(t, map[string]any{
		"worker": map[string]any{"nodeSelector": nil, "resources": nil},
		"server": map[string]any{"resources": nil},
	})
	ds := must[*appsv1.DaemonSet](t, r, "prod-space-worker")
	if sel := ds.Spec.Template.Spec.NodeSelector; len(sel) != 0 {
		t.Errorf("worker nodeSelector = %v, want none", sel)
	}
	if res := container(t, ds.Spec.Template.Spec, "worker").Resources; !cmp.Equal(res, corev1.ResourceRequirements{}) {
		t.Errorf("worker resources = %v, want none", res)
	}
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	if res := container(t, d.Spec.Template.Spec, "server").Resources; !cmp.Equal(res, corev1.ResourceRequirements{}) {
		t.Errorf("server resources = %v, want none", res)
	}
}
