// Package metricstest reads Prometheus metrics back in tests as a
// scraper does: over HTTP, through the exposition format's parser.
package metricstest

import (
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are scraped metric families by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs url, a /metrics endpoint, in the Prometheus text format
// and parses the answer; it fails the test if either fails.
func Scrape(t testing.TB, url string) Families {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		t.Fatalf("scrape %s: %s: %s", url, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape %s: Content-Type %q, want text/plain", url, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: parse: %v", url, err)
	}
	return fams
}

// Value sums the samples of family name whose labels include labels
// (nil: every sample): a counter's or gauge's value, a histogram's
// count of observations. ok is false if no sample matched.
func (f Families) Value(name string, labels map[string]string) (v float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if !matches(m, labels) {
			continue
		}
		ok = true
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			v += m.Untyped.GetValue()
		}
	}
	return v, ok
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if want, ok := labels[lp.GetName()]; ok {
			if lp.GetValue() != want {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

// Labels returns every label of every sample as "name=value", so a
// test can check none carries what it must not (an ID).
func (f Families) Labels() []string {
	var out []string
	for _, fam := range f {
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				out = append(out, lp.GetName()+"="+lp.GetValue())
			}
		}
	}
	return out
}
