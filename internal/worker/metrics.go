package worker

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"space/internal/sandbox"
)

// createBuckets bound a create's duration: a pool hit takes milliseconds,
// a restore under KVM a fraction of a second, a cold boot under TCG up to
// the boot timeout.
var createBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// metrics are the worker's Prometheus metrics; no label carries a
// sandbox ID.
type metrics struct {
	create *prometheus.HistogramVec // outcome, started_by
}

// newMetrics makes the worker's metrics and registers them on reg.
func (w *Worker) newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_worker_sandbox_create_seconds",
			Help:    "Time a create took on the worker until the sandbox's agent answered (or the create failed), by outcome (ok, error) and how its VM started (boot, warm, restore, pool; none when it failed).",
			Buckets: createBuckets,
		}, []string{"outcome", "started_by"}),
	}
	running := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_worker_vms_running",
		Help: "VMs the worker runs: sandboxes running or paused, pool members included.",
	}, func() float64 { return float64(w.vmsRunning()) })
	for _, c := range []prometheus.Collector{m.create, running} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// observeCreate records a create that started at start and returned inf
// and err.
func (m *metrics) observeCreate(start time.Time, inf Info, err error) {
	outcome, by := "ok", "none"
	if err != nil {
		outcome = "error"
	} else if inf.VM != nil {
		by = startedByLabel(inf.VM.StartedBy)
	}
	m.create.WithLabelValues(outcome, by).Observe(time.Since(start).Seconds())
}

// startedByLabel bounds api.VMInfo.StartedBy to its documented values.
func startedByLabel(by string) string {
	switch by {
	case "boot", "warm", "restore", "pool":
		return by
	}
	return "other"
}

// vmsRunning counts the sandboxes whose VM runs or is paused.
func (w *Worker) vmsRunning() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.sandboxes {
		s.mu.Lock()
		if s.rec.State == sandbox.Running || s.rec.State == sandbox.Paused {
			n++
		}
		s.mu.Unlock()
	}
	return n
}
