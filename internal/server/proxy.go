package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"space/api"
	"space/internal/controlplane"
	"space/internal/errkind"
	"space/internal/httpapi"
)

// DefaultProxyListen is where `space proxy` listens unless told otherwise.
const DefaultProxyListen = "127.0.0.1:7072"

// ProxyConfig configures a data-plane proxy process.
type ProxyConfig struct {
	// Token is the cluster's worker token (the control plane's
	// worker.token): it opens data-plane tokens and reaches workers.
	// Required.
	Token string
	// Listen is the proxy's address; "" = DefaultProxyListen.
	Listen string
	// Version is reported by the health route.
	Version string
	// Progress, Log and Ready are as in Config.
	Progress io.Writer
	Log      *slog.Logger
	Ready    func(url string)
}

// RunProxy serves the data plane (exec, processes, files, ports) of the
// sandboxes on standalone workers until ctx ends: a request carries a
// sandbox's data-plane token, which names its worker, and goes to that
// worker. It keeps no state and needs no database, so any number of them
// can run, and a control-plane replica's restart cuts none of their
// streams.
func RunProxy(ctx context.Context, cfg ProxyConfig) error {
	if cfg.Token == "" {
		return fmt.Errorf("proxy: the worker token is required: %w", errkind.InvalidArgument)
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultProxyListen
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	plane, err := controlplane.NewDataPlane(cfg.Token, controlplane.NewRemotes(cfg.Token))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, api.Health{Status: "ok", Version: cfg.Version})
	})
	mux.Handle("/", plane)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	url := "http://" + ln.Addr().String()
	fmt.Fprintf(progress, "space: data-plane proxy serving on %s\n", url)
	if cfg.Ready != nil {
		cfg.Ready(url)
	}
	return serve(ctx, ln, mux, func(ctx context.Context) error { <-ctx.Done(); return nil }, cfg.Log)
}
