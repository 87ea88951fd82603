// Package monitoring reads SPACE's Prometheus alerting rules and Grafana
// dashboard, which the Helm chart ships (deploy/helm/space/files, linked
// from deploy/monitoring), checks them, and lists the metrics they read,
// so that a test can hold them to what the server and the worker export.
package monitoring

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"space/internal/errkind"
)

// The files, relative to the chart's directory.
const (
	AlertsFile    = "files/alerts.yaml"
	DashboardFile = "files/dashboard.json"
)

// RunbookPrefix is what every alert's runbook_url starts with: the
// operations guide's section named alert-NAME (lower case, as GitHub
// makes heading anchors).
const RunbookPrefix = "docs/operations.md#alert-"

// Severities are the severity labels an alert may carry.
var Severities = []string{"warning", "critical"}

// Rules is a Prometheus rules file.
type Rules struct {
	Groups []RuleGroup `yaml:"groups"`
}

// RuleGroup is a group of rules evaluated together.
type RuleGroup struct {
	Name  string `yaml:"name"`
	Rules []Rule `yaml:"rules"`
}

// Rule is an alerting rule; SPACE ships no recording rules.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// ParseRules parses a rules file strictly (an unknown key fails) and
// checks every rule: a name, an expression that passes CheckExpr, a `for`
// Prometheus reads, a severity of Severities, a summary, a description and
// a runbook_url of RunbookPrefix and the alert's name. Errors wrap
// errkind.InvalidArgument.
func ParseRules(b []byte) (*Rules, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var r Rules
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("parse rules: %w: %w", err, errkind.InvalidArgument)
	}
	if len(r.Groups) == 0 {
		return nil, fmt.Errorf("parse rules: no groups: %w", errkind.InvalidArgument)
	}
	seen := map[string]bool{}
	for _, g := range r.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			return nil, fmt.Errorf("rule group %q: a name and rules are required: %w", g.Name, errkind.InvalidArgument)
		}
		for _, rule := range g.Rules {
			if err := checkRule(rule); err != nil {
				return nil, fmt.Errorf("rule group %s: %w", g.Name, err)
			}
			if seen[rule.Alert] {
				return nil, fmt.Errorf("alert %s: defined twice: %w", rule.Alert, errkind.InvalidArgument)
			}
			seen[rule.Alert] = true
		}
	}
	return &r, nil
}

func checkRule(r Rule) error {
	if r.Alert == "" {
		return fmt.Errorf("a rule without an alert name: %w", errkind.InvalidArgument)
	}
	if err := CheckExpr(r.Expr); err != nil {
		return fmt.Errorf("alert %s: expr: %w", r.Alert, err)
	}
	if r.For != "" {
		if _, err := parseDuration(r.For); err != nil {
			return fmt.Errorf("alert %s: for %q: %w", r.Alert, r.For, err)
		}
	}
	if !slices.Contains(Severities, r.Labels["severity"]) {
		return fmt.Errorf("alert %s: severity %q, want one of %v: %w", r.Alert, r.Labels["severity"], Severities, errkind.InvalidArgument)
	}
	for _, k := range []string{"summary", "description", "runbook_url"} {
		if strings.TrimSpace(r.Annotations[k]) == "" {
			return fmt.Errorf("alert %s: no %s annotation: %w", r.Alert, k, errkind.InvalidArgument)
		}
	}
	if want := RunbookPrefix + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
		return fmt.Errorf("alert %s: runbook_url %q, want %q: %w", r.Alert, r.Annotations["runbook_url"], want, errkind.InvalidArgument)
	}
	return nil
}

// Alerts returns the alerts' names in file order.
func (r *Rules) Alerts() []string {
	var out []string
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			out = append(out, rule.Alert)
		}
	}
	return out
}

// Exprs returns the rules' expressions in file order.
func (r *Rules) Exprs() []string {
	var out []string
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			out = append(out, rule.Expr)
		}
	}
	return out
}

// Dashboard is what this package reads of a Grafana dashboard.
type Dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []Panel `json:"panels"`
}

// Panel is a dashboard panel, or a row holding panels.
type Panel struct {
	ID      int      `json:"id"`
	Type    string   `json:"type"`
	Title   string   `json:"title"`
	Targets []Target `json:"targets"`
	Panels  []Panel  `json:"panels"` // a collapsed row's
}

// Target is one query of a panel.
type Target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// ParseDashboard parses a dashboard and checks it: a uid and a title,
// panel IDs unique, every panel but a row with a title and at least one
// query, and every query's expression passes CheckExpr. Errors wrap
// errkind.InvalidArgument.
func ParseDashboard(b []byte) (*Dashboard, error) {
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("parse dashboard: %w: %w", err, errkind.InvalidArgument)
	}
	if d.UID == "" || d.Title == "" {
		return nil, fmt.Errorf("dashboard: a uid and a title are required: %w", errkind.InvalidArgument)
	}
	ids := map[int]bool{}
	var check func([]Panel) error
	check = func(ps []Panel) error {
		for _, p := range ps {
			if ids[p.ID] {
				return fmt.Errorf("dashboard panel %q: id %d used twice: %w", p.Title, p.ID, errkind.InvalidArgument)
			}
			ids[p.ID] = true
			if p.Title == "" {
				return fmt.Errorf("dashboard panel %d: no title: %w", p.ID, errkind.InvalidArgument)
			}
			if p.Type == "row" {
				if err := check(p.Panels); err != nil {
					return err
				}
				continue
			}
			if len(p.Targets) == 0 {
				return fmt.Errorf("dashboard panel %q: no query: %w", p.Title, errkind.InvalidArgument)
			}
			for _, t := range p.Targets {
				if err := CheckExpr(t.Expr); err != nil {
					return fmt.Errorf("dashboard panel %q, query %s: %w", p.Title, t.RefID, err)
				}
			}
		}
		return nil
	}
	if err := check(d.Panels); err != nil {
		return nil, err
	}
	return &d, nil
}

// Exprs returns the queries' expressions of every panel, rows' included.
func (d *Dashboard) Exprs() []string {
	var out []string
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, t.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// Load reads and checks the rules and the dashboard of the chart in
// chartDir.
func Load(chartDir string) (*Rules, *Dashboard, error) {
	rb, err := os.ReadFile(filepath.Join(chartDir, AlertsFile))
	if err != nil {
		return nil, nil, fmt.Errorf("load rules: %w", err)
	}
	rules, err := ParseRules(rb)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", AlertsFile, err)
	}
	db, err := os.ReadFile(filepath.Join(chartDir, DashboardFile))
	if err != nil {
		return nil, nil, fmt.Errorf("load dashboard: %w", err)
	}
	dash, err := ParseDashboard(db)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	return rules, dash, nil
}

// ReferencedMetrics returns the SPACE metric families (names starting
// space_) that the rules and the dashboard of the chart in chartDir read,
// sorted, each once: a histogram's _bucket, _count and _sum series count as
// its family's name, as the server's registry names it.
func ReferencedMetrics(chartDir string) ([]string, error) {
	rules, dash, err := Load(chartDir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range append(rules.Exprs(), dash.Exprs()...) {
		ms, err := Metrics(e)
		if err != nil {
			return nil, err
		}
		names = append(names, ms...)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Family returns the metric family a series name belongs to: name
// without a histogram's _bucket, _count or _sum.
func Family(name string) string {
	for _, s := range []string{"_bucket", "_count", "_sum"} {
		if f, ok := strings.CutSuffix(name, s); ok {
			return f
		}
	}
	return name
}

// parseDuration parses a Prometheus duration: units ms, s, m, h, d, w,
// y, largest first, e.g. 1h30m.
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("empty duration: %w", errkind.InvalidArgument)
	}
	units := []struct {
		name string
		d    time.Duration
	}{
		{"y", 365 * 24 * time.Hour}, {"w", 7 * 24 * time.Hour}, {"d", 24 * time.Hour},
		{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond},
	}
	var total time.Duration
	last := -1
	for rest := s; rest != ""; {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 {
			return 0, fmt.Errorf("duration %q: a number is missing: %w", s, errkind.InvalidArgument)
		}
		var n time.Duration
		for _, c := range rest[:i] {
			n = n*10 + time.Duration(c-'0')
		}
		rest = rest[i:]
		u := slices.IndexFunc(units, func(u struct {
			name string
			d    time.Duration
		}) bool {
			return strings.HasPrefix(rest, u.name) && !(u.name == "m" && strings.HasPrefix(rest, "ms"))
		})
		if u < 0 || u <= last {
			return 0, fmt.Errorf("duration %q: bad or misordered unit: %w", s, errkind.InvalidArgument)
		}
		last = u
		total += n * units[u].d
		rest = rest[len(units[u].name):]
	}
	return total, nil
}
