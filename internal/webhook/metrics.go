package webhook

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the dispatcher's Prometheus metrics (Config.Metrics). A nil
// *Metrics records nothing.
type Metrics struct {
	attempts *prometheus.CounterVec // outcome
	duration prometheus.Histogram
	disabled prometheus.Counter
}

// NewMetrics makes the dispatcher's metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_webhook_deliveries_total",
			Help: "Webhook delivery attempts, by outcome: delivered (the receiver answered 2xx) or failed (any other answer, an error or a timeout; the event is tried again).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "space_webhook_delivery_seconds",
			Help:    "Time one webhook delivery attempt took, from dialing to the receiver's answer.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		disabled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_webhooks_disabled_total",
			Help: "Webhooks disabled after too many failed attempts in a row.",
		}),
	}
	m.attempts.WithLabelValues("delivered")
	m.attempts.WithLabelValues("failed")
	for _, c := range []prometheus.Collector{m.attempts, m.duration, m.disabled} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register webhook metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) attempted(delivered bool, took time.Duration) {
	if m == nil {
		return
	}
	outcome := "failed"
	if delivered {
		outcome = "delivered"
	}
	m.attempts.WithLabelValues(outcome).Inc()
	m.duration.Observe(took.Seconds())
}

func (m *Metrics) disabledOne() {
	if m != nil {
		m.disabled.Inc()
	}
}
