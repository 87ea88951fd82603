package controlplane

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
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
}

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
	for _, c := range []prometheus.Collector{m.requests, m.duration, newSandboxesCollector(st)} {
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
