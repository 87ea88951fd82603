package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"space/internal/errkind"
	"space/internal/workertls"
)

// embeddedWorkerAPI is the embedded worker's API as the other replicas
// reach it.
type embeddedWorkerAPI struct {
	ln  net.Listener // TLS
	url string       // what is advertised
}

// listenWorkerAPI opens the embedded worker's API listener if cfg asks
// for one or the store is PostgreSQL (other replicas may share it), and
// returns nil otherwise.
func listenWorkerAPI(cfg Config, token string) (*embeddedWorkerAPI, error) {
	shared := strings.HasPrefix(cfg.StoreURL, "postgres://") || strings.HasPrefix(cfg.StoreURL, "postgresql://")
	if cfg.WorkerListen == "" && !shared {
		return nil, nil
	}
	if cfg.WorkerAdvertise != "" {
		if u, err := url.Parse(cfg.WorkerAdvertise); err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("worker advertise %q: want https://host:port (the worker API serves TLS): %w", cfg.WorkerAdvertise, errkind.InvalidArgument)
		}
	}
	tlsCfg, err := workertls.Server(token)
	if err != nil {
		return nil, fmt.Errorf("embedded worker TLS: %v: %w", err, errkind.InvalidArgument)
	}
	addr := cfg.WorkerListen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("embedded worker API: listen: %w", err)
	}
	a := &embeddedWorkerAPI{ln: tls.NewListener(l, tlsCfg), url: cfg.WorkerAdvertise}
	if a.url == "" {
		a.url = "https://" + l.Addr().String()
		if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil && ap.Addr().IsLoopback() && cfg.Log != nil {
			cfg.Log.Warn("the embedded worker is reachable by replicas on this host only; give --worker-listen and --worker-advertise for others", "address", a.url)
		}
	}
	return a, nil
}

// serve serves h on the listener until ctx ends.
func (a *embeddedWorkerAPI) serve(ctx context.Context, h http.Handler, log *slog.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	if err := srv.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
		log.Error("embedded worker API", "err", err)
	}
}
