package egress

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the egress gateways' Prometheus metrics, shared by every
// gateway of a worker (Config.Metrics). Their labels are bounded enums:
// a decision's reason is free text, so it is not one. A nil *Metrics
// records nothing.
type Metrics struct {
	decisions *prometheus.CounterVec // verdict, proto, mode
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
			Help: "Egress decisions of the sandboxes' gateways, by verdict (allowed, denied), protocol (tcp, http, dns, udp, icmp, ipv6, ip, other) and how a connection was served (https, http, tls-passthrough, tcp, ip; none for the others).",
		}, []string{"verdict", "proto", "mode"}),
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
	for _, v := range []string{"allowed", "denied"} {
		for _, p := range []string{"tcp", "http", "dns", "udp", "icmp"} {
			m.decisions.WithLabelValues(v, p, "none")
		}
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
// event once, an event standing for Count of them as that many).
func (m *Metrics) decided(ev Event) {
	if m == nil || ev.Proto == "audit" {
		return
	}
	verdict := "denied"
	if ev.Allowed {
		verdict = "allowed"
	}
	n := float64(max(ev.Count, 1))
	m.decisions.WithLabelValues(verdict, protoLabel(ev.Proto), modeLabel(ev.Mode)).Add(n)
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
