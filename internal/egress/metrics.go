package egress

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// A denial classes why a decision refused, as a bounded label: the
// egress log's reason says it in full, in free text.
type denial string

// The classes of refusals.
const (
	refusedNetworkOff     denial = "network_off"     // the sandbox has no network
	refusedNotAllowed     denial = "not_allowed"     // no rule allows the name, address or port
	refusedByIP           denial = "by_ip"           // a connection to an address no address rule covers
	refusedSpecialAddress denial = "special_address" // loopback, private, link-local, metadata, the host's own
	refusedTooMany        denial = "too_many"        // the connection or ping limit
	refusedNotRouted      denial = "not_routed"      // a protocol or packet the gateway does not route
	refusedWildcardLimit  denial = "wildcard_limit"  // more names under wildcard rules than allowed
	refusedSecretEcho     denial = "secret_echo"     // TRACE/TRACK to a host secrets go to
	refusedTooLarge       denial = "too_large"       // a request too large to inject secrets into
	// refusedFailed: allowed by the policy, then failed: the upstream
	// (dial, resolve, TLS, HTTP), or the guest's first message named
	// another host or spoke no protocol the rule serves.
	refusedFailed denial = "failed"
)

// Metrics are the egress gateways' Prometheus metrics, shared by every
// gateway of a worker (Config.Metrics). Their labels are bounded enums:
// a decision's reason is a denial class ("none" when allowed). A nil
// *Metrics records nothing.
type Metrics struct {
	decisions *prometheus.CounterVec // verdict, proto, mode, reason
	bytes     *prometheus.CounterVec // direction
	open      prometheus.Gauge
	dns       prometheus.Counter
	wildcard  prometheus.Counter
	injected  prometheus.Counter
	scrubbed  prometheus.Counter
}

// NewMetrics makes the gateways' metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_egress_decisions_total",
			Help: "Egress decisions of the sandboxes' gateways, by verdict (allowed, denied), protocol (tcp, http, dns, udp, icmp, ipv6, ip, other), how a connection was served (https, http, tls-passthrough, tcp, ip; none for the others) and the class of a refusal's reason (network_off, not_allowed, by_ip, special_address, too_many, not_routed, wildcard_limit, secret_echo, too_large, failed; none when allowed).",
		}, []string{"verdict", "proto", "mode", "reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_egress_bytes_total",
			Help: "Bytes the sandboxes' allowed connections moved, by direction (up: guest to upstream, down: upstream to guest), counted when each connection closes.",
		}, []string{"direction"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "space_egress_connections_open",
			Help: "Connections of the sandboxes' guests the gateways serve now.",
		}),
		dns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_egress_dns_lookups_total",
			Help: "DNS queries of the sandboxes' guests the gateways answered or refused.",
		}),
		wildcard: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_egress_wildcard_limit_hits_total",
			Help: "DNS queries refused because a sandbox asked for more distinct names under wildcard rules than it may.",
		}),
		injected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_egress_secrets_injected_total",
			Help: "Connections whose requests had secrets injected by the gateway, counted when each closes.",
		}),
		scrubbed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_egress_secrets_scrubbed_total",
			Help: "Secret values the gateways replaced by their placeholders in responses (headers and bodies) before the guest saw them.",
		}),
	}
	for _, p := range []string{"tcp", "http", "dns", "udp", "icmp"} {
		m.decisions.WithLabelValues("allowed", p, "none", "none")
		m.decisions.WithLabelValues("denied", p, "none", string(refusedNotAllowed))
	}
	m.bytes.WithLabelValues("up")
	m.bytes.WithLabelValues("down")
	for _, c := range []prometheus.Collector{m.decisions, m.bytes, m.open, m.dns, m.wildcard, m.injected, m.scrubbed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register egress metrics: %w", err)
		}
	}
	return m, nil
}

// decided records a decision (before the audit's aggregation: each
// event once, an event standing for Count of them as that many); why
// classes a refusal.
func (m *Metrics) decided(ev Event, why denial) {
	if m == nil || ev.Proto == "audit" {
		return
	}
	verdict, reason := "denied", string(why)
	if ev.Allowed {
		verdict, reason = "allowed", "none"
	}
	n := float64(max(ev.Count, 1))
	m.decisions.WithLabelValues(verdict, protoLabel(ev.Proto), modeLabel(ev.Mode), reason).Add(n)
	if ev.Proto == "dns" {
		m.dns.Add(n)
	}
	if ev.BytesOut > 0 {
		m.bytes.WithLabelValues("up").Add(float64(ev.BytesOut))
	}
	if ev.BytesIn > 0 {
		m.bytes.WithLabelValues("down").Add(float64(ev.BytesIn))
	}
	if ev.Injected {
		m.injected.Inc()
	}
}

func protoLabel(p string) string {
	switch p {
	case "tcp", "http", "dns", "udp", "icmp", "ipv6", "ip":
		return p
	}
	return "other"
}

func modeLabel(m string) string {
	switch m {
	case ModeHTTPS, ModeHTTP, ModePassthrough, ModeTCP, ModeAddr:
		return m
	case "":
		return "none"
	}
	return "other"
}

func (m *Metrics) opened() {
	if m != nil {
		m.open.Inc()
	}
}

func (m *Metrics) closed() {
	if m != nil {
		m.open.Dec()
	}
}

func (m *Metrics) wildcardHit() {
	if m != nil {
		m.wildcard.Inc()
	}
}

func (m *Metrics) scrub(n int) {
	if m != nil && n > 0 {
		m.scrubbed.Add(float64(n))
	}
}
