package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"space/internal/controlplane"
	"space/internal/e2b"
	"space/internal/errkind"
)

// E2B configures the E2B-compatible API (package e2b) on a listener of
// its own.
type E2B struct {
	// Listen is its address, e.g. ":443" or "127.0.0.1:3000". Required.
	Listen string
	// Domain is the domain of sandbox hosts (PORT-ID.DOMAIN, and
	// api.DOMAIN for the API: what E2B_DOMAIN names); "" = none, and
	// clients reach sandboxes through E2B_SANDBOX_URL and its headers.
	Domain string
	// TLSCert and TLSKey are PEM files of the listener's certificate
	// (for *.DOMAIN); both empty = plain HTTP.
	TLSCert, TLSKey string
}

// e2bSecret derives the facade's token secret from the worker token,
// which every replica shares.
func e2bSecret(workerToken string) []byte {
	sum := sha256.Sum256([]byte("space e2b facade secret v1\x00" + workerToken))
	return sum[:]
}

// startE2B listens for the E2B API (cfg.E2B) in front of the API at
// apiURL, and serves it until ctx ends. It returns the listener's URL.
func startE2B(ctx context.Context, cfg E2B, apiURL, workerToken string, cp *controlplane.Server, log *slog.Logger) (string, func() error, error) {
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return "", nil, fmt.Errorf("e2b: give both a TLS certificate and its key, or neither: %w", errkind.InvalidArgument)
	}
	h, err := e2b.New(e2b.Config{API: apiURL, Sandboxes: cp, Secret: e2bSecret(workerToken), Domain: cfg.Domain, Log: log})
	if err != nil {
		return "", nil, err
	}
	var tlsCfg *tls.Config
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return "", nil, fmt.Errorf("e2b: TLS certificate: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return "", nil, fmt.Errorf("e2b: listen: %w", err)
	}
	scheme := "http"
	if tlsCfg != nil {
		ln, scheme = tls.NewListener(ln, tlsCfg), "https"
	}
	srv := &http.Server{
		Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	wait := func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return scheme + "://" + ln.Addr().String(), wait, nil
}
