package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newRegistry returns the registry of a process's metrics, holding the Go
// runtime's and the process's own collectors; the components register
// theirs on it.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// metricsListener serves a registry's metrics at /metrics on a listener
// of its own, never on the API's: a scraper presents no API key, and the
// API's port is often public while the operator binds this one to a
// private address.
type metricsListener struct {
	ln  net.Listener
	srv *http.Server
	url string // http://ADDR/metrics
}

// listenMetrics listens on addr for the metrics of reg; addr "" = no
// listener (nil).
func listenMetrics(addr string, reg *prometheus.Registry, log *slog.Logger) (*metricsListener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		EnableOpenMetrics: true,
		// A collector that fails (the store is down) costs its own
		// series, not the scrape: the rest still says what happens.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// promhttp_metric_handler_errors_total counts those failures.
		Registry: reg,
		// Scrapes are cheap but not free: past 4 at once, a scraper
		// is answered 503 (the store is asked once per scrape).
		MaxRequestsInFlight: 4,
		Timeout:             30 * time.Second,
	}))
	return &metricsListener{
		ln:  ln,
		url: loopbackURL(ln.Addr()) + "/metrics",
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 10 * time.Second,
			WriteTimeout:      time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
	}, nil
}

// serve serves until ctx ends, then closes the listener.
func (m *metricsListener) serve(ctx context.Context, log *slog.Logger) {
	done := make(chan error, 1)
	go func() { done <- m.srv.Serve(m.ln) }()
	select {
	case <-ctx.Done():
		m.srv.Close()
		<-done
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("serve metrics", "err", err)
		}
	}
}

// chunkMetrics are the metrics of the chunk store's garbage collection,
// which the server runs (collectChunks).
type chunkMetrics struct {
	freed  prometheus.Counter
	stored prometheus.Gauge
}

func newChunkMetrics(reg prometheus.Registerer) (*chunkMetrics, error) {
	m := &chunkMetrics{
		freed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "space_chunkstore_gc_freed_bytes_total",
			Help: "Bytes of chunks no snapshot uses that this server's garbage collection deleted from the chunk store.",
		}),
		stored: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "space_chunkstore_bytes",
			Help: "Bytes of chunks in the chunk store after this server's latest garbage collection (0 before its first).",
		}),
	}
	for _, c := range []prometheus.Collector{m.freed, m.stored} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}
