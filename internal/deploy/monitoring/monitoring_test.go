package monitoring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

// repo is the repository's root.
func repo(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return dir
}

func chartDir(t *testing.T) string { return filepath.Join(repo(t), "deploy", "helm", "space") }

// documented returns the metric families docs/operations.md's tables
// list (a row starting with | `space_...` |): what the server and the
// worker export, each with a test that it moves. The rules and the
// dashboard may read only those.
func documented(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repo(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		name, ok := strings.CutPrefix(line, "| `space_")
		if !ok {
			continue
		}
		name, _, ok = strings.Cut(name, "`")
		if ok {
			out = append(out, "space_"+name)
		}
	}
	if len(out) < 30 {
		t.Fatalf("docs/operations.md lists %d space_ metrics, want its metric tables", len(out))
	}
	return out
}

// TestChartFiles checks the chart's rules and dashboard parse and pass
// the checks, read only documented metrics, and that the dashboard
// shows the ones an operator watches.
func TestChartFiles(t *testing.T) {
	rules, dash, err := Load(chartDir(t))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := []string{"SpaceWorkerLost", "SpacePoolExhausted", "SpaceStorageNearlyFull", "SpaceControlPlaneDown",
		"SpaceNoLeader", "SpaceLeaderFlapping", "SpaceCreateErrors", "SpaceCreateLatencyHigh", "SpaceAuditWriteErrors", "SpaceWebhookDisabled"}
	if diff := cmp.Diff(want, rules.Alerts()); diff != "" {
		t.Errorf("alerts (-want +got):\n%s", diff)
	}
	if n := len(dash.Exprs()); n < 20 {
		t.Errorf("dashboard has %d queries, want the panels of docs/operations.md", n)
	}
	got, err := ReferencedMetrics(chartDir(t))
	if err != nil {
		t.Fatalf("ReferencedMetrics: %v", err)
	}
	known := documented(t)
	for _, m := range got {
		if !slices.Contains(known, m) {
			t.Errorf("the rules or the dashboard read %s, which docs/operations.md does not list as exported", m)
		}
	}
	var shown []string
	for _, e := range dash.Exprs() {
		ms, _ := Metrics(e)
		shown = append(shown, ms...)
	}
	for _, m := range []string{
		"space_api_request_duration_seconds", "space_api_requests_total", "space_chunkstore_bytes",
		"space_claims_held", "space_claims_lost_total", "space_egress_bytes_total", "space_egress_decisions_total",
		"space_leader", "space_leader_changes_total", "space_placement_refusals_total", "space_quota_refusals_total",
		"space_recoveries_total", "space_sandbox_operation_seconds", "space_sandboxes",
		"space_worker_agent_rtt_seconds", "space_worker_boot_seconds", "space_worker_capacity",
		"space_worker_snapshot_stored_bytes", "space_worker_chunk_cache_bytes",
		"space_worker_committed", "space_worker_dataplane_bytes_total", "space_worker_pool_hits_total",
		"space_worker_pool_misses_total", "space_worker_pool_size", "space_worker_restore_seconds",
		"space_worker_snapshot_pause_seconds", "space_worker_vmm_pss_bytes", "space_worker_vms_running",
		"space_workers", "space_workers_lost_total",
	} {
		if !slices.Contains(shown, m) {
			t.Errorf("the dashboard shows no %s", m)
		}
	}
}

// TestMonitoringLinks checks deploy/monitoring holds the chart's files,
// so people without the chart read the same rules and dashboard.
func TestMonitoringLinks(t *testing.T) {
	for _, f := range []string{AlertsFile, DashboardFile} {
		chart, err := os.ReadFile(filepath.Join(chartDir(t), f))
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		plain, err := os.ReadFile(filepath.Join(repo(t), "deploy", "monitoring", filepath.Base(f)))
		if err != nil {
			t.Fatalf("deploy/monitoring: %v", err)
		}
		if !bytes.Equal(chart, plain) {
			t.Errorf("deploy/monitoring/%s differs from the chart's %s", filepath.Base(f), f)
		}
	}
}

// TestRunbooks checks every alert's runbook link names a section of
// docs/operations.md.
func TestRunbooks(t *testing.T) {
	rules, _, err := Load(chartDir(t))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	doc, err := os.ReadFile(filepath.Join(repo(t), "docs", "operations.md"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[strings.ToLower(strings.ReplaceAll(strings.TrimSpace(m[1]), " ", "-"))] = true
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			_, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "#")
			if !anchors[anchor] {
				t.Errorf("alert %s: docs/operations.md has no heading for #%s", r.Alert, anchor)
			}
		}
	}
}

func TestMetrics(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (namespace, le) (rate(space_sandbox_operation_seconds_bucket{op="create"}[5m]))) > 10`:              {"space_sandbox_operation_seconds"},
		`sum(rate(space_x_total[$__rate_interval])) / sum(rate(space_y_count{a=~"$ns"}[${__rate_interval}])) or up{job="space-worker"} == 0`: {"space_x_total", "space_y"},
		`a / on (instance) group_left (x) space_b_sum offset 5m`:                                                                             {"space_b"},
		`sum without (le) (space_c) by (x)`:                                                nil,
		`max by (state) (space_sandboxes) - -1 * 2e3 > bool 0 unless absent(space_leader)`: {"space_sandboxes", "space_leader"},
	} {
		got, err := Metrics(expr)
		if err != nil {
			if want != nil {
				t.Errorf("Metrics(%s): %v", expr, err)
			}
			continue
		}
		if want == nil {
			t.Errorf("Metrics(%s) = %v, want an error (by twice)", expr, got)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Metrics(%s) (-want +got):\n%s", expr, diff)
		}
	}
}

func TestCheckExprRejects(t *testing.T) {
	for _, expr := range []string{
		``,
		`sum(rate(space_a[5m])`,
		`sum(rate(space_a[5m])))`,
		`rates(space_a[5m])`,
		`space_a{job="x"`,
		`space_a{job=x}`,
		`space_a{job=="x"}`,
		`space_a{job=~"("}`,
		`rate(space_a[5x])`,
		`space_a and on (x) group_left space_b`,
		`rate(space_a[5m1h])`,
		`space_a space_b`,
		`space_a >`,
		`/ space_a`,
		`sum by (a b) (space_a)`,
		`sum by (a)`,
		`space_a{job="x}`,
		`space_a and or space_b`,
		`histogram_quantile(0.99, sum by (le) (rate(space_a_bucket[5m]))) 10`,
	} {
		if err := CheckExpr(expr); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("CheckExpr(%q) = %v, want InvalidArgument", expr, err)
		}
	}
}

func TestParseRulesRejects(t *testing.T) {
	good := `groups:
  - name: g
    rules:
      - alert: SpaceX
        expr: space_x > 0
        for: 5m
        labels: {severity: warning}
        annotations: {summary: s, description: d, runbook_url: "docs/operations.md#alert-spacex"}
`
	if _, err := ParseRules([]byte(good)); err != nil {
		t.Fatalf("ParseRules(good) = %v", err)
	}
	for name, edit := range map[string][2]string{
		"unknown key":      {"for: 5m", "fro: 5m"},
		"bad for":          {"for: 5m", "for: 5 minutes"},
		"no severity":      {"severity: warning", "sev: warning"},
		"unknown severity": {"severity: warning", "severity: page"},
		"no summary":       {"summary: s, ", ""},
		"wrong runbook":    {"#alert-spacex", "#alert-spacey"},
		"bad expr":         {"space_x > 0", "space_x >"},
		"no name":          {"alert: SpaceX", "alert: ''"},
	} {
		b := strings.Replace(good, edit[0], edit[1], 1)
		if _, err := ParseRules([]byte(b)); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("%s: ParseRules = %v, want InvalidArgument", name, err)
		}
	}
}

func TestParseDashboardRejects(t *testing.T) {
	for name, b := range map[string]string{
		"not JSON":       `{`,
		"no uid":         `{"title":"t","panels":[]}`,
		"duplicate id":   `{"uid":"u","title":"t","panels":[{"id":1,"type":"timeseries","title":"a","targets":[{"expr":"space_a"}]},{"id":1,"type":"timeseries","title":"b","targets":[{"expr":"space_a"}]}]}`,
		"no query":       `{"uid":"u","title":"t","panels":[{"id":1,"type":"timeseries","title":"a","targets":[]}]}`,
		"bad query":      `{"uid":"u","title":"t","panels":[{"id":1,"type":"timeseries","title":"a","targets":[{"expr":"rate(space_a)["}]}]}`,
		"bad row member": `{"uid":"u","title":"t","panels":[{"id":1,"type":"row","title":"r","panels":[{"id":2,"type":"timeseries","title":"a","targets":[{"expr":"foo("}]}]}]}`,
	} {
		if _, err := ParseDashboard([]byte(b)); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("%s: ParseDashboard = %v, want InvalidArgument", name, err)
		}
	}
}
