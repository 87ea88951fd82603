package worker

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"space/internal/egress"
	"space/internal/sandbox"
)

// createBuckets bound a create's duration: a pool hit takes milliseconds,
// a restore under KVM a fraction of a second, a cold boot under TCG up to
// the boot timeout.
var createBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// pauseBuckets bound how long a guest stays paused for a snapshot: a
// diff on reflink storage takes milliseconds, a full memory file of a
// large guest seconds.
var pauseBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// sizeBuckets bound what one snapshot stores: from nothing new (a
// diff of an idle guest) to a full memory file and disk of GiBs.
var sizeBuckets = prometheus.ExponentialBuckets(64<<10, 4, 11) // 64 KiB .. 64 GiB

// rttBuckets bound an agent's answer to a health probe: under a
// millisecond on an idle host, up to the probe's timeout on a busy one.
var rttBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// metrics are the worker's Prometheus metrics; no label carries a
// sandbox ID, except the families of the opt-in per-sandbox collector
// (Config.MetricsPerSandbox).
type metrics struct {
	create      *prometheus.HistogramVec // outcome, started_by
	boot        prometheus.Histogram
	restore     *prometheus.HistogramVec // from
	poolHits    prometheus.Counter
	poolMisses  prometheus.Counter
	pause       prometheus.Histogram
	stored      prometheus.Histogram
	agentRTT    prometheus.Histogram
	dataIn      map[string]prometheus.Counter // by data-plane path
	dataOut     map[string]prometheus.Counter
	dataPlaneIO *prometheus.CounterVec // path, direction
	egress      *egress.Metrics        // the sandboxes' gateways'
}

// Data-plane paths (space_worker_dataplane_bytes_total's path label).
const (
	pathExec     = "exec"
	pathFiles    = "files"
	pathTerminal = "terminal"
	pathPorts    = "ports"
)

// newMetrics makes the worker's metrics and registers them on reg.
func (w *Worker) newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_worker_sandbox_create_seconds",
			Help:    "Time a create took on the worker until the sandbox's agent answered (or the create failed), by outcome (ok, error) and how its VM started (boot, warm, restore, pool; none when it failed).",
			Buckets: createBuckets,
		}, []string{"outcome", "started_by"}),
		boot: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "space_worker_boot_seconds",
			Help:    "Time from a cold boot's start to the guest agent's first answer.",
			Buckets: createBuckets,
		}),
		restore: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_worker_restore_seconds",
			Help:    "Time from a restore's start to the guest agent's first answer, by what was restored (snapshot, warm: the template's warm snapshot).",
			Buckets: createBuckets,
		}, []string{"from"}),
		poolHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_worker_pool_hits_total",
			Help: "Creates served by a ready pool member.",
		}),
		poolMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_worker_pool_misses_total",
			Help: "Creates of a shape the worker keeps a pool of that found no ready member (and booted or restored instead).",
		}),
		pause: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "space_worker_snapshot_pause_seconds",
			Help:    "How long a guest was paused while its snapshot (a snapshot, checkpoint, suspend or fork) was saved.",
			Buckets: pauseBuckets,
		}),
		stored: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "space_worker_snapshot_stored_bytes",
			Help:    "Bytes a snapshot added to storage: new chunks for a chunked one, its files' blocks for one kept on the worker's disk.",
			Buckets: sizeBuckets,
		}),
		agentRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "space_worker_agent_rtt_seconds",
			Help:    "Round trip of the heartbeat's health probe of a running sandbox's agent.",
			Buckets: rttBuckets,
		}),
		dataPlaneIO: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_worker_dataplane_bytes_total",
			Help: "Bytes the worker's data plane moved, by path (exec, files, terminal, ports) and direction (in: from the client, out: to it).",
		}, []string{"path", "direction"}),
		dataIn:  map[string]prometheus.Counter{},
		dataOut: map[string]prometheus.Counter{},
	}
	var err error
	if m.egress, err = egress.NewMetrics(reg); err != nil {
		return nil, err
	}
	for _, p := range []string{pathExec, pathFiles, pathTerminal, pathPorts} {
		m.dataIn[p] = m.dataPlaneIO.WithLabelValues(p, "in")
		m.dataOut[p] = m.dataPlaneIO.WithLabelValues(p, "out")
	}
	for _, from := range []string{"snapshot", "warm"} {
		m.restore.WithLabelValues(from)
	}
	running := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_worker_vms_running",
		Help: "VMs the worker runs: sandboxes running or paused, pool members included.",
	}, func() float64 { return float64(w.vmsRunning()) })
	pool := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_worker_pool_size",
		Help: "Pool members the worker has, ready or being made, of every shape.",
	}, func() float64 { return float64(w.poolSize()) })
	pss := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_worker_vmm_pss_bytes",
		Help: "Proportional set size of the worker's VMM processes, summed, as last sampled (every 10 s).",
	}, func() float64 { return float64(w.vmmPSS()) })
	cs := []prometheus.Collector{m.create, running, m.boot, m.restore, m.poolHits, m.poolMisses, pool, m.pause, m.stored,
		m.agentRTT, m.dataPlaneIO, pss, newCapacityCollector(w)}
	// A chunk store behind a local cache (S3): what the cache holds.
	if w.cfg.Chunks != nil {
		if c, ok := w.cfg.Chunks.Backend().(interface{ Size() int64 }); ok {
			cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "space_worker_chunk_cache_bytes",
				Help: "Bytes of chunks the worker's local cache of its chunk store (S3) holds.",
			}, func() float64 { return float64(c.Size()) }))
		}
	}
	if w.cfg.MetricsPerSandbox {
		cs = append(cs, newPerSandboxCollector(w))
	}
	for _, c := range cs {
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

// observeStart records how long a VM started by startedBy took to boot
// or restore.
func (m *metrics) observeStart(startedBy string, took time.Duration) {
	switch startedBy {
	case "boot":
		m.boot.Observe(took.Seconds())
	case "restore":
		m.restore.WithLabelValues("snapshot").Observe(took.Seconds())
	case "warm":
		m.restore.WithLabelValues("warm").Observe(took.Seconds())
	}
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

// poolSize counts the pool members, ready or on their way.
func (w *Worker) poolSize() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.sandboxes {
		s.mu.Lock()
		if s.rec.Pool != "" && s.rec.State != sandbox.Failed {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// vmmPSS sums the VMM processes' PSS as last sampled (memory.go).
func (w *Worker) vmmPSS() int64 {
	var sum int64
	for _, s := range w.all() {
		s.mu.Lock()
		if s.vm != nil {
			sum += s.pss
		}
		s.mu.Unlock()
	}
	return sum
}

// capacityCollector reports space_worker_capacity and
// space_worker_committed by resource from one look at the worker's
// status: what it offers, and what its sandboxes (pool members
// included) hold of it.
type capacityCollector struct {
	w                   *Worker
	capacity, committed *prometheus.Desc
}

func newCapacityCollector(w *Worker) *capacityCollector {
	return &capacityCollector{w: w,
		capacity: prometheus.NewDesc("space_worker_capacity",
			"What the worker offers sandboxes, by resource (vcpu, memory_bytes, disk_bytes: its storage less the reserve).", []string{"resource"}, nil),
		committed: prometheus.NewDesc("space_worker_committed",
			"What the worker's sandboxes, pool members included, hold of its capacity, by resource (vcpu, memory_bytes: each sandbox's charge, disk_bytes: used and promised).", []string{"resource"}, nil),
	}
}

func (c *capacityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.capacity
	ch <- c.committed
}

func (c *capacityCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.w.status(true)
	for _, v := range []struct {
		res           string
		offers, holds int64
	}{
		{"vcpu", int64(st.VCPUs), int64(st.UsedVCPUs)},
		{"memory_bytes", st.MemoryMiB << 20, st.UsedMemoryMiB << 20},
		{"disk_bytes", st.DiskMiB << 20, (st.DiskMiB - st.FreeDiskMiB) << 20},
	} {
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(v.offers), v.res)
		ch <- prometheus.MustNewConstMetric(c.committed, prometheus.GaugeValue, float64(v.holds), v.res)
	}
}

// perSandboxCollector reports the opt-in per-sandbox families
// (Config.MetricsPerSandbox): the only ones labelled by sandbox ID, so
// their series grow and churn with the sandboxes.
type perSandboxCollector struct {
	w        *Worker
	pss, cpu *prometheus.Desc
}

func newPerSandboxCollector(w *Worker) *perSandboxCollector {
	return &perSandboxCollector{w: w,
		pss: prometheus.NewDesc("space_worker_sandbox_memory_pss_bytes",
			"Proportional set size of a sandbox's VMM process, as last sampled (every 10 s). Opt-in (--metrics-per-sandbox): one series per sandbox.", []string{"sandbox"}, nil),
		cpu: prometheus.NewDesc("space_worker_sandbox_vcpus",
			"vCPUs a sandbox's VM has. Opt-in (--metrics-per-sandbox): one series per sandbox.", []string{"sandbox"}, nil),
	}
}

func (c *perSandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pss
	ch <- c.cpu
}

func (c *perSandboxCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.w.all() {
		s.mu.Lock()
		id, internal, vm, pss, vcpus := s.rec.ID, s.rec.Internal || s.rec.Pool != "", s.vm, s.pss, s.rec.Spec.VCPUs
		s.mu.Unlock()
		if internal || vm == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.pss, prometheus.GaugeValue, float64(pss), id)
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.GaugeValue, float64(vcpus), id)
	}
}
