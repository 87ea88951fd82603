package helmchart

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"space/internal/deploy/monitoring"
	"space/internal/errkind"
)

// metricsOn is values with every monitoring object on.
func metricsOn(extra map[string]any) map[string]any {
	m := map[string]any{
		"serviceMonitor":   map[string]any{"enabled": true, "interval": "15s", "labels": map[string]any{"release": "kps"}},
		"prometheusRule":   map[string]any{"enabled": true, "labels": map[string]any{"release": "kps"}},
		"grafanaDashboard": map[string]any{"enabled": true, "annotations": map[string]any{"grafana_folder": "SPACE"}},
	}
	for k, v := range extra {
		m[k] = v
	}
	return map[string]any{"metrics": m}
}

// port returns the container's port named name.
func port(c corev1.Container, name string) (corev1.ContainerPort, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

// TestMetricsDefaults checks every replica and worker serves metrics on a
// port of its own, each pod reachable through a headless Service, and the
// API's Service does not carry the port.
func TestMetricsDefaults(t *testing.T) {
	r := render(t, nil)
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	ds := must[*appsv1.DaemonSet](t, r, "prod-space-worker")
	for _, tc := range []struct {
		component string
		tmpl      corev1.PodTemplateSpec
		selector  map[string]string
		port      int32
	}{
		{"server", d.Spec.Template, d.Spec.Selector.MatchLabels, 9464},
		{"worker", ds.Spec.Template, ds.Spec.Selector.MatchLabels, 9465},
	} {
		c := container(t, tc.tmpl.Spec, tc.component)
		if got, want := mustFlag(t, c.Args, "metrics-listen"), ":"+itoa(tc.port); got != want {
			t.Errorf("%s --metrics-listen = %q, want %q", tc.component, got, want)
		}
		if p, ok := port(c, "metrics"); !ok || p.ContainerPort != tc.port {
			t.Errorf("%s container port metrics = %+v, want %d", tc.component, p, tc.port)
		}
		want := map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": itoa(tc.port), "prometheus.io/path": "/metrics"}
		for k, v := range want {
			if got := tc.tmpl.Annotations[k]; got != v {
				t.Errorf("%s pod annotation %s = %q, want %q", tc.component, k, got, v)
			}
		}
		svc := must[*corev1.Service](t, r, "prod-space-"+tc.component+"-metrics")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("%s metrics Service clusterIP = %q, want None (every pod scraped)", tc.component, svc.Spec.ClusterIP)
		}
		wantPorts := []corev1.ServicePort{{Name: "metrics", Port: tc.port, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP}}
		if diff := cmp.Diff(wantPorts, svc.Spec.Ports); diff != "" {
			t.Errorf("%s metrics Service ports (-want +got):\n%s", tc.component, diff)
		}
		if diff := cmp.Diff(tc.selector, svc.Spec.Selector); diff != "" {
			t.Errorf("%s metrics Service selector differs from the pods' (-pods +service):\n%s", tc.component, diff)
		}
		if got, want := svc.Labels["space/metrics"], "space-"+tc.component; got != want {
			t.Errorf("%s metrics Service label space/metrics = %q, want %q", tc.component, got, want)
		}
	}
	assertAPIServiceHidesMetrics(t, r, 9464, 9465)
	for _, o := range r.Objects {
		switch o := o.(type) {
		case *ServiceMonitor, *PrometheusRule:
			t.Errorf("rendered %T %s by default", o, o.(metav1.Object).GetName())
		case *corev1.ConfigMap:
			t.Errorf("rendered ConfigMap %s by default", o.Name)
		}
	}
}

// assertAPIServiceHidesMetrics checks the Services that are not metrics
// Services (the API's, the proxy's) expose no metrics port: by name, or
// by number (ports, the metrics ports of the values rendered).
func assertAPIServiceHidesMetrics(t *testing.T, r *Rendered, ports ...int32) {
	t.Helper()
	for _, o := range r.Objects {
		svc, ok := o.(*corev1.Service)
		if !ok || strings.HasSuffix(svc.Name, "-metrics") {
			continue
		}
		for _, p := range svc.Spec.Ports {
			bad := p.Name == "metrics" || p.TargetPort == intstr.FromString("metrics")
			for _, n := range ports {
				bad = bad || p.Port == n || p.TargetPort == intstr.FromInt32(n)
			}
			if bad {
				t.Errorf("Service %s exposes the metrics: %+v", svc.Name, p)
			}
		}
	}
}

func itoa(n int32) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestMetricsDisabled checks metrics.enabled false leaves out the flag,
// the ports, the Services and the ServiceMonitors that would scrape them.
func TestMetricsDisabled(t *testing.T) {
	r := render(t, metricsOn(map[string]any{"enabled": false, "scrapeAnnotations": true}))
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	ds := must[*appsv1.DaemonSet](t, r, "prod-space-worker")
	for component, tmpl := range map[string]corev1.PodTemplateSpec{"server": d.Spec.Template, "worker": ds.Spec.Template} {
		c := container(t, tmpl.Spec, component)
		if v, ok := flag(c.Args, "metrics-listen"); ok {
			t.Errorf("%s --metrics-listen=%s with metrics off", component, v)
		}
		if p, ok := port(c, "metrics"); ok {
			t.Errorf("%s has port %+v with metrics off", component, p)
		}
		if v, ok := tmpl.Annotations["prometheus.io/scrape"]; ok {
			t.Errorf("%s pods annotated prometheus.io/scrape=%s with metrics off", component, v)
		}
	}
	for _, o := range r.Objects {
		switch o := o.(type) {
		case *ServiceMonitor:
			t.Errorf("ServiceMonitor %s with metrics off", o.Name)
		case *corev1.Service:
			if strings.HasSuffix(o.Name, "-metrics") {
				t.Errorf("Service %s with metrics off", o.Name)
			}
		}
	}
	// Rules and the dashboard do not depend on this release's scrapes.
	must[*PrometheusRule](t, r, "prod-space")
	must[*corev1.ConfigMap](t, r, "prod-space-dashboard")
}

// TestScrapeAnnotationsOff checks the pods carry no prometheus.io
// annotations when asked, and keep their own.
func TestScrapeAnnotationsOff(t *testing.T) {
	r := render(t, map[string]any{
		"metrics": map[string]any{"scrapeAnnotations": false},
		"worker":  map[string]any{"podAnnotations": map[string]any{"a": "b"}},
	})
	ds := must[*appsv1.DaemonSet](t, r, "prod-space-worker")
	if diff := cmp.Diff(map[string]string{"a": "b"}, ds.Spec.Template.Annotations); diff != "" {
		t.Errorf("worker pod annotations (-want +got):\n%s", diff)
	}
	if a := must[*appsv1.Deployment](t, r, "prod-space-server").Spec.Template.Annotations; len(a) != 0 {
		t.Errorf("server pod annotations = %v, want none", a)
	}
}

// TestServiceMonitors checks each ServiceMonitor selects its component's
// metrics Service and only it, scrapes a port that Service names, and
// names the job the alerting rules expect.
func TestServiceMonitors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		values     map[string]any
		components []string
	}{
		{"defaults", metricsOn(nil), []string{"server", "worker"}},
		{"ci monitoring", ciValues(t, "monitoring"), []string{"server", "worker"}},
		{"no workers", func() map[string]any {
			v := metricsOn(nil)
			v["worker"] = map[string]any{"enabled": false}
			return v
		}(), []string{"server"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.values)
			var services []*corev1.Service
			var monitors []*ServiceMonitor
			for _, o := range r.Objects {
				switch o := o.(type) {
				case *corev1.Service:
					services = append(services, o)
				case *ServiceMonitor:
					monitors = append(monitors, o)
				}
			}
			if len(monitors) != len(tc.components) {
				t.Fatalf("rendered %d ServiceMonitors, want %d (%s)", len(monitors), len(tc.components), kinds(r))
			}
			for _, component := range tc.components {
				sm := must[*ServiceMonitor](t, r, "prod-space-"+component)
				if got := sm.Labels["release"]; got != "kps" && got != "kube-prometheus-stack" {
					t.Errorf("ServiceMonitor %s label release = %q, want the value's", sm.Name, got)
				}
				if diff := cmp.Diff([]string{rel.Namespace}, sm.Spec.NamespaceSelector.MatchNames); diff != "" {
					t.Errorf("ServiceMonitor %s namespaces (-want +got):\n%s", sm.Name, diff)
				}
				sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
				if err != nil {
					t.Fatalf("ServiceMonitor %s selector: %v", sm.Name, err)
				}
				var matched []*corev1.Service
				for _, s := range services {
					if sel.Matches(labels.Set(s.Labels)) {
						matched = append(matched, s)
					}
				}
				if len(matched) != 1 || matched[0].Name != "prod-space-"+component+"-metrics" {
					var names []string
					for _, s := range matched {
						names = append(names, s.Name)
					}
					t.Fatalf("ServiceMonitor %s selects Services %v, want prod-space-%s-metrics alone", sm.Name, names, component)
				}
				svc := matched[0]
				if len(sm.Spec.Endpoints) != 1 {
					t.Fatalf("ServiceMonitor %s endpoints = %+v, want 1", sm.Name, sm.Spec.Endpoints)
				}
				ep := sm.Spec.Endpoints[0]
				found := false
				for _, p := range svc.Spec.Ports {
					found = found || p.Name == ep.Port
				}
				if !found || ep.Path != "/metrics" || ep.Interval != "15s" {
					t.Errorf("ServiceMonitor %s endpoint %+v, want a port of %s's (%+v), /metrics, 15s", sm.Name, ep, svc.Name, svc.Spec.Ports)
				}
				if got, want := svc.Labels[sm.Spec.JobLabel], "space-"+component; got != want {
					t.Errorf("ServiceMonitor %s job (label %q of %s) = %q, want %q", sm.Name, sm.Spec.JobLabel, svc.Name, got, want)
				}
			}
			assertAPIServiceHidesMetrics(t, r, 9464, 9465, 9100, 9101)
		})
	}
}

// TestPrometheusRule checks the PrometheusRule carries every rule of
// files/alerts.yaml as it is there, runbook links made absolute when a
// base is given.
func TestPrometheusRule(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(t), monitoring.AlertsFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	file, err := monitoring.ParseRules(b)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, base := range []string{"", "https://git.example/space/blob/main/"} {
		t.Run("base="+base, func(t *testing.T) {
			r := render(t, metricsOn(map[string]any{"prometheusRule": map[string]any{"enabled": true, "runbookBaseURL": base}}))
			pr := must[*PrometheusRule](t, r, "prod-space")
			var want []RuleGroup
			for _, g := range file.Groups {
				wg := RuleGroup{Name: g.Name}
				for _, rule := range g.Rules {
					ann := map[string]string{}
					for k, v := range rule.Annotations {
						ann[k] = v
					}
					if base != "" {
						ann["runbook_url"] = strings.TrimSuffix(base, "/") + "/" + ann["runbook_url"]
					}
					wg.Rules = append(wg.Rules, Rule{Alert: rule.Alert, Expr: rule.Expr, For: rule.For, Labels: rule.Labels, Annotations: ann})
				}
				want = append(want, wg)
			}
			if diff := cmp.Diff(want, pr.Spec.Groups); diff != "" {
				t.Errorf("PrometheusRule groups differ from %s (-file +rule):\n%s", monitoring.AlertsFile, diff)
			}
		})
	}
}

// TestGrafanaDashboard checks the dashboard's ConfigMap: labelled for
// Grafana's sidecar, holding files/dashboard.json as it is, valid JSON.
func TestGrafanaDashboard(t *testing.T) {
	r := render(t, metricsOn(nil))
	cm := must[*corev1.ConfigMap](t, r, "prod-space-dashboard")
	if got := cm.Labels["grafana_dashboard"]; got != "1" {
		t.Errorf("dashboard ConfigMap label grafana_dashboard = %q, want 1", got)
	}
	if got := cm.Annotations["grafana_folder"]; got != "SPACE" {
		t.Errorf("dashboard ConfigMap annotation grafana_folder = %q, want the value's SPACE", got)
	}
	file, err := os.ReadFile(filepath.Join(chartDir(t), monitoring.DashboardFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	got := cm.Data["space.json"]
	if got != strings.TrimRight(string(file), "\n") {
		t.Errorf("ConfigMap space.json differs from %s", monitoring.DashboardFile)
	}
	if _, err := monitoring.ParseDashboard([]byte(got)); err != nil {
		t.Errorf("ConfigMap space.json: %v", err)
	}
}

// TestMetricsValuesRejected checks values that would break the metrics
// listener fail before anything is made.
func TestMetricsValuesRejected(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		schema bool // refused by the schema (else by the templates)
	}{
		{"port 0", map[string]any{"metrics": map[string]any{"serverPort": 0}}, true},
		{"bad interval", metricsOn(map[string]any{"serviceMonitor": map[string]any{"enabled": true, "interval": "30 seconds"}}), true},
		{"runbook base not a URL", metricsOn(map[string]any{"prometheusRule": map[string]any{"enabled": true, "runbookBaseURL": "git.example"}}), true},
		{"misspelt", map[string]any{"metrics": map[string]any{"servicemonitor": map[string]any{}}}, true},
		{"server port on the API's", map[string]any{"metrics": map[string]any{"serverPort": 7070}}, false},
		{"worker port on the worker's", map[string]any{"metrics": map[string]any{"workerPort": 7071}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(loadChart(t), tc.values, rel)
			if err == nil {
				t.Fatalf("Render(%v) succeeded", tc.values)
			}
			if tc.schema && !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Render(%v) = %v, want a schema error (InvalidArgument)", tc.values, err)
			}
		})
	}
}
