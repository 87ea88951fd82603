package controlplane

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"space/internal/sandbox"
	"space/internal/store"
)

// Route labels of requests that match no route template.
const (
	routeOther     = "other"     // no route: the 404 answer
	routeDataPlane = "dataplane" // a data-plane token's request (package dataplane)
)

// apiBuckets bound the API's request durations: most answers take
// milliseconds, a create or restore seconds, and a stream (exec, watch,
// attach) lasts as long as it is open.
var apiBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// metrics are the control plane's Prometheus metrics. Their labels are
// bounded: a route is a template of routes() (or routeOther,
// routeDataPlane), never a request's path, so no sandbox ID appears.
type metrics struct {
	requests *prometheus.CounterVec   // route, method, code
	duration *prometheus.HistogramVec // route, method

	ops               *prometheus.HistogramVec // op, outcome
	placementRefusals *prometheus.CounterVec   // reason
	quotaRefusals     *prometheus.CounterVec   // limit
	leaderChanges     prometheus.Counter
	claimsLost        prometheus.Counter
	workersLost       prometheus.Counter
	recoveries        *prometheus.CounterVec // outcome
	lostWork          prometheus.Histogram
	reconciles        *prometheus.CounterVec // outcome
}

// Sandbox operations (space_sandbox_operation_seconds' op label).
const (
	opCreate     = "create"
	opRestore    = "restore"
	opFork       = "fork"
	opSuspend    = "suspend"
	opResume     = "resume"
	opSnapshot   = "snapshot"
	opCheckpoint = "checkpoint"
	opDelete     = "delete"
	opPause      = "pause"
)

// Why a placement found no worker (space_placement_refusals_total's
// reason label).
const (
	refusedNoWorker   = "no_worker"   // no worker answered its probe
	refusedNoCapacity = "no_capacity" // none has the vCPUs, memory or disk free
	refusedDiskSize   = "disk_size"   // the disk asked for is larger than any worker's
	refusedVMM        = "vmm_mismatch"
)

// Outcomes of a worker's lost sandbox (space_recoveries_total).
const (
	recoveryRecovered    = "recovered"
	recoveryFailed       = "failed"
	recoveryNoCheckpoint = "no_checkpoint"
)

// lostWorkBuckets bound the work a recovery loses: the time from the
// checkpoint restored to the worker's last lease, about a checkpoint
// interval (minutes by default) plus up to RecoverAfter.
var lostWorkBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600}

// newMetrics makes the control plane's metrics and registers them, with
// the collector of space_sandboxes that asks st at scrape time, on reg.
func newMetrics(reg prometheus.Registerer, st sandboxCounter) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_api_requests_total",
			Help: "API requests answered, by route template, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_api_request_duration_seconds",
			Help:    "Time from an API request's arrival to the end of its answer (of a stream: while it was open), by route template and method.",
			Buckets: apiBuckets,
		}, []string{"route", "method"}),
	}
	m.ops = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "space_sandbox_operation_seconds",
		Help:    "Time the control plane took for a sandbox operation (create, restore, fork, suspend, resume, snapshot, checkpoint, delete, pause), by outcome (ok, error).",
		Buckets: apiBuckets,
	}, []string{"op", "outcome"})
	m.placementRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_placement_refusals_total",
		Help: "Placements that found no worker for a sandbox, by reason (no_worker, no_capacity, disk_size, vmm_mismatch).",
	}, []string{"reason"})
	m.quotaRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_quota_refusals_total",
		Help: "Creates, resumes and snapshots refused for a team's quota, by the limit hit (sandboxes, vcpus, memory, snapshot_bytes).",
	}, []string{"limit"})
	m.leaderChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_leader_changes_total",
		Help: "Times this replica gained or lost the leadership of the background work.",
	})
	m.claimsLost = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_claims_lost_total",
		Help: "Claims of this replica that may have expired unrenewed: their operations' writes fail.",
	})
	m.workersLost = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_workers_lost_total",
		Help: "Workers this replica, leading, declared lost and fenced, taking their running sandboxes away.",
	})
	m.recoveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_recoveries_total",
		Help: "Sandboxes of lost workers settled by this replica, by outcome (recovered, failed, no_checkpoint).",
	}, []string{"outcome"})
	m.lostWork = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "space_recovery_lost_work_seconds",
		Help:    "Work a recovered sandbox lost: from the checkpoint it was restored from to the last time its lost worker was heard from.",
		Buckets: lostWorkBuckets,
	})
	m.reconciles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "space_reconcile_runs_total",
		Help: "Reconciles this replica ran, by outcome (ok, error).",
	}, []string{"outcome"})
	// Every label value up front: a series exists, at 0, before its first
	// event, so rate() and alerts see the first one.
	for _, op := range []string{opCreate, opRestore, opFork, opSuspend, opResume, opSnapshot, opCheckpoint, opDelete, opPause} {
		m.ops.WithLabelValues(op, "ok")
		m.ops.WithLabelValues(op, "error")
	}
	for _, r := range []string{refusedNoWorker, refusedNoCapacity, refusedDiskSize, refusedVMM} {
		m.placementRefusals.WithLabelValues(r)
	}
	for _, l := range []store.QuotaLimit{store.LimitSandboxes, store.LimitVCPUs, store.LimitMemory, store.LimitSnapshotBytes} {
		m.quotaRefusals.WithLabelValues(string(l))
	}
	for _, o := range []string{recoveryRecovered, recoveryFailed, recoveryNoCheckpoint} {
		m.recoveries.WithLabelValues(o)
	}
	m.reconciles.WithLabelValues("ok")
	m.reconciles.WithLabelValues("error")
	for _, c := range []prometheus.Collector{m.requests, m.duration, newSandboxesCollector(st),
		m.ops, m.placementRefusals, m.quotaRefusals, m.leaderChanges, m.claimsLost, m.workersLost, m.recoveries, m.lostWork, m.reconciles} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// instrument counts and times h's requests as route (a template, or a
// fixed name) and method; method "" labels each request by its own
// method (bounded by methodLabel). The request's ResponseWriter is
// wrapped in a statusRecorder, which keeps hijacking, flushing and
// http.ResponseController working.
func (m *metrics) instrument(route, method string, h http.Handler) http.HandlerFunc {
	var observe prometheus.Observer // fixed when method is
	if method != "" {
		observe = m.duration.WithLabelValues(route, method)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		meth, obs := method, observe
		if meth == "" {
			meth = methodLabel(r.Method)
			obs = m.duration.WithLabelValues(route, meth)
		}
		obs.Observe(time.Since(start).Seconds())
		m.requests.WithLabelValues(route, meth, strconv.Itoa(rec.status())).Inc()
	}
}

// methodLabel is method if it is one of HTTP's, else "other": a client
// chooses the method of a request that matches no route.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

// statusRecorder is a ResponseWriter that notes the status of the answer.
// It unwraps (for http.ResponseController) and hijacks and flushes through
// the writer it wraps, so a WebSocket upgrade or a stream works through it.
type statusRecorder struct {
	http.ResponseWriter
	code     int  // the final status written, or 0
	hijacked bool // the connection was taken over
}

// status is the status the client got: a hijacked connection is an
// upgrade (101) unless the handler said otherwise; a handler that wrote
// nothing answered 200.
func (w *statusRecorder) status() int {
	switch {
	case w.code != 0:
		return w.code
	case w.hijacked:
		return http.StatusSwitchingProtocols
	}
	return http.StatusOK
}

func (w *statusRecorder) WriteHeader(code int) {
	// An informational status (100, 103) comes before the final one;
	// 101 is final.
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom keeps the wrapped writer's io.ReaderFrom (sendfile) in use.
func (w *statusRecorder) ReadFrom(r io.Reader) (int64, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return io.Copy(w.ResponseWriter, r)
}

// Unwrap lets http.ResponseController reach the wrapped writer.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher for handlers that assert it.
func (w *statusRecorder) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush() // a writer that cannot flush buffers the answer
}

// Hijack implements http.Hijacker for handlers that assert it; it fails
// with http.ErrNotSupported if the wrapped writer cannot hijack.
func (w *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

// sandboxCounter is the store's count of sandboxes by state.
type sandboxCounter interface {
	CountSandboxes(ctx context.Context) (map[store.SandboxState]int, error)
}

// sandboxesCollector reports space_sandboxes{state} from the store at
// scrape time: the store is the truth every replica shares (this
// process keeps no view of all sandboxes), and one aggregate query
// costs the same however many sandboxes there are.
type sandboxesCollector struct {
	st   sandboxCounter
	desc *prometheus.Desc
}

// scrapeTimeout bounds the store query of one scrape.
const scrapeTimeout = 5 * time.Second

func newSandboxesCollector(st sandboxCounter) *sandboxesCollector {
	return &sandboxesCollector{st: st, desc: prometheus.NewDesc("space_sandboxes",
		"Sandboxes of every team recorded in the store, by state (deleted tombstones are not counted). Every control-plane replica sharing a store reports the same numbers.",
		[]string{"state"}, nil)}
}

func (c *sandboxesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *sandboxesCollector) Collect(ch chan<- prometheus.Metric) {
	// A scrape carries no context; its HTTP request's does not reach here.
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	counts, err := c.st.CountSandboxes(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	// Every state, zeros too, so a series does not vanish when its last
	// sandbox leaves the state.
	for _, s := range sandbox.States {
		if s == sandbox.Deleted {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
}

// outcome is an operation's outcome label.
func outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// observeOp records operation op that started at start and ended with
// *err (a pointer, so that it can be deferred before err is set).
func (m *metrics) observeOp(op string, start time.Time, err *error) {
	m.ops.WithLabelValues(op, outcome(*err)).Observe(time.Since(start).Seconds())
}

// timeOp times h as operation op; its outcome is the answer's status
// (an error from 400 on). For handlers that answer from many places;
// an operation with one error return uses observeOp.
func (m *metrics) timeOp(op string, h http.HandlerFunc) http.HandlerFunc {
	ok, failed := m.ops.WithLabelValues(op, "ok"), m.ops.WithLabelValues(op, "error")
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		h(rec, r)
		obs := ok
		if rec.status() >= 400 {
			obs = failed
		}
		obs.Observe(time.Since(start).Seconds())
	}
}

// quotaRefused counts err if it is a quota refusal.
func (m *metrics) quotaRefused(err error) {
	var qe *store.QuotaError
	if errors.As(err, &qe) {
		m.quotaRefusals.WithLabelValues(string(qe.Limit)).Inc()
	}
}

// replicaState is what the gauges of one replica read at scrape time.
type replicaState interface {
	Leading() bool
	claimsHeld() int
	workerHealth() (healthy, unhealthy int)
}

// registerReplica registers, on reg, the gauges that read r at scrape
// time: space_leader, space_claims_held and space_workers.
func registerReplica(reg prometheus.Registerer, r replicaState) error {
	leader := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_leader",
		Help: "1 if this replica leads the background work (reaping, reconciling, checkpoints, leases and recovery), else 0.",
	}, func() float64 {
		if r.Leading() {
			return 1
		}
		return 0
	})
	claims := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "space_claims_held",
		Help: "Claims this replica holds: records an operation of it works on.",
	}, func() float64 { return float64(r.claimsHeld()) })
	for _, c := range []prometheus.Collector{leader, claims, &workersCollector{r: r, desc: prometheus.NewDesc("space_workers",
		"Workers this replica knows, by health: healthy (placement may use it) or unhealthy (not answering its probes, its heartbeat or lease stale).",
		[]string{"health"}, nil)}} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// workersCollector reports space_workers{health}: both values from one
// look at the workers.
type workersCollector struct {
	r    replicaState
	desc *prometheus.Desc
}

func (c *workersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *workersCollector) Collect(ch chan<- prometheus.Metric) {
	healthy, unhealthy := c.r.workerHealth()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(healthy), "healthy")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(unhealthy), "unhealthy")
}

// DefaultMetricsTeams is Config.MetricsTeams' default.
const DefaultMetricsTeams = 50

// teamCounter is the store's count of sandboxes by team and state.
type teamCounter interface {
	CountSandboxesByTeam(ctx context.Context) (map[string]map[store.SandboxState]int, error)
}

// teamOther is the team label of the teams past the first n.
const teamOther = "other"

// teamsCollector reports space_team_sandboxes{team,state} from one store
// query at scrape time: the n teams with the most sandboxes by name, the
// others summed as "other", so the series stay bounded (n+1 teams times
// the states) however many teams there are.
type teamsCollector struct {
	st   teamCounter
	n    int
	desc *prometheus.Desc
}

func newTeamsCollector(st teamCounter, n int) *teamsCollector {
	return &teamsCollector{st: st, n: n, desc: prometheus.NewDesc("space_team_sandboxes",
		"Sandboxes recorded in the store by team and state, for the teams with the most sandboxes (the others are summed in team \"other\"). Every replica sharing a store reports the same numbers.",
		[]string{"team", "state"}, nil)}
}

func (c *teamsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *teamsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	counts, err := c.st.CountSandboxesByTeam(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	type team struct {
		id    string
		total int
	}
	teams := make([]team, 0, len(counts))
	for id, byState := range counts {
		t := team{id: id}
		for _, n := range byState {
			t.total += n
		}
		teams = append(teams, t)
	}
	// Most sandboxes first; ties by ID, so the named set is stable.
	slices.SortFunc(teams, func(a, b team) int { return cmp.Or(b.total-a.total, strings.Compare(a.id, b.id)) })
	other, folded := map[store.SandboxState]int{}, false
	for i, t := range teams {
		if i < c.n && t.id != teamOther { // a team named "other" is summed with them
			c.emit(ch, t.id, counts[t.id])
			continue
		}
		folded = true
		for s, n := range counts[t.id] {
			other[s] += n
		}
	}
	if folded {
		c.emit(ch, teamOther, other)
	}
}

// emit sends team's count in every live state, zeros included.
func (c *teamsCollector) emit(ch chan<- prometheus.Metric, team string, byState map[store.SandboxState]int) {
	for _, s := range sandbox.States {
		if s == sandbox.Deleted {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(byState[s]), team, string(s))
	}
}
