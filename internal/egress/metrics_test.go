package egress

import (
	"crypto/x509"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"space/internal/metricstest"
	"space/internal/testenv"
)

// TestMetrics drives a gateway (DNS answered and refused, a name beyond
// the wildcard limit, an HTTPS request with a secret injected and
// scrubbed from the answer) and reads its metrics back through the
// exposition format.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatalf("NewMetrics() = %v", err)
	}
	ca, err := NewCA("sandbox test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, g, _, _ := setupWith(t, func(c *Config) {
		c.CA, c.Metrics = ca, m
		c.WildcardNames, c.WildcardNamesPerMinute = 1, 1
		c.Policy.Secrets = []Secret{{Name: "api-key", Placeholder: placeholder, Value: []byte(secretValue), Hosts: []string{"api.test"}}}
	}, "api.test", "*.wild.test")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	if _, rcode, _ := g.resolve(t, gatewayIP, "nope.test"); rcode != dns.RcodeNameError {
		t.Fatalf("setup: resolve nope.test: rcode %d, want NXDOMAIN", rcode)
	}
	g.resolve(t, gatewayIP, "a.wild.test")
	if _, rcode, _ := g.resolve(t, gatewayIP, "b.wild.test"); rcode != dns.RcodeRefused {
		t.Fatalf("setup: resolve b.wild.test past the wildcard limit: rcode %d, want REFUSED", rcode)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	got, err := request(g, api[0], roots, "api.test", "api.test", "/echo", "Authorization: Bearer "+placeholder+"\r\n", "{}")
	if err != nil || strings.Contains(got, secretValue) || !strings.Contains(got, placeholder) {
		t.Fatalf("setup: /echo through the gateway = %q, %v; want the secret scrubbed back to its placeholder", got, err)
	}
	// The connection's decision, bytes and injection count when it
	// closes, which the gateway sees after the guest did.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	testenv.Eventually(t, 10*time.Second, func() bool {
		v, _ := metricstest.Scrape(t, srv.URL).Value("space_egress_secrets_injected_total", nil)
		return v == 1
	})
	fams := metricstest.Scrape(t, srv.URL)
	for _, c := range []struct {
		name    string
		labels  map[string]string
		atLeast float64
	}{
		{"space_egress_decisions_total", map[string]string{"verdict": "allowed", "proto": "tcp", "mode": "https"}, 1},
		{"space_egress_decisions_total", map[string]string{"verdict": "denied", "proto": "dns"}, 2}, // nope.test, b.wild.test
		{"space_egress_decisions_total", map[string]string{"verdict": "denied", "proto": "dns", "reason": "not_allowed"}, 1},
		{"space_egress_decisions_total", map[string]string{"verdict": "denied", "proto": "dns", "reason": "wildcard_limit"}, 1},
		{"space_egress_decisions_total", map[string]string{"verdict": "allowed", "proto": "dns", "reason": "none"}, 2},
		{"space_egress_dns_lookups_total", nil, 4},
		{"space_egress_wildcard_limit_hits_total", nil, 1},
		{"space_egress_secrets_scrubbed_total", nil, 1},
		{"space_egress_bytes_total", map[string]string{"direction": "up"}, 100},
		{"space_egress_bytes_total", map[string]string{"direction": "down"}, 100},
	} {
		if v, ok := fams.Value(c.name, c.labels); !ok || v < c.atLeast {
			t.Errorf("%s%v = %v (present %v), want at least %v", c.name, c.labels, v, ok, c.atLeast)
		}
	}
	if v, ok := fams.Value("space_egress_connections_open", nil); !ok || v != 0 {
		t.Errorf("space_egress_connections_open after the connection closed = %v (present %v), want 0", v, ok)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint() = %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
