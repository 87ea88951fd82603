package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"space/internal/mcpserver"
)

func newMCPCmd(g *globals) *cobra.Command {
	var (
		httpAddr, tokenFile, label string
		idle                       time.Duration
	)
	c := &cobra.Command{
		Use:   "mcp [--http ADDR]",
		Short: "Serve SPACE's sandboxes as Model Context Protocol tools",
		Long: `Serve SPACE as an MCP server: on stdin and stdout (the default, for a
client that starts it), or over streamable HTTP on --http ADDR at /mcp.
Its tools create sandboxes, run commands and Python, JavaScript or shell
snippets in them, read, write and list files, and snapshot, fork, restore
and delete them. It reaches the API as the other verbs do (SPACE_API_URL
and SPACE_API_KEY, or the local server's data dir).

The sandboxes it creates carry the label space-mcp=LABEL and are the only
ones its tools act on. Each is deleted by the server once --idle passes
without a tool call that uses it, even if this process is gone.

Over HTTP every request must carry "Authorization: Bearer TOKEN" with the
token in --token-file; without one it listens on a loopback address only.`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, args []string) error {
			if idle < time.Minute {
				return usagef("--idle %v: want at least 1m", idle)
			}
			if httpAddr == "" && tokenFile != "" {
				return usagef("--token-file is for --http")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			srv, err := mcpserver.New(mcpserver.Config{Client: cl, Label: label, Idle: idle, Version: version()})
			if err != nil {
				return err
			}
			if httpAddr == "" {
				err := srv.Run(cmd.Context(), &mcp.IOTransport{Reader: io.NopCloser(g.stdin), Writer: nopWriteCloser{g.stdout}})
				if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
					return nil // the client went away
				}
				return err
			}
			return g.serveMCPHTTP(cmd.Context(), srv, httpAddr, tokenFile)
		},
	}
	f := c.Flags()
	f.StringVar(&httpAddr, "http", "", "serve streamable HTTP on `ADDR` (path /mcp) instead of stdio")
	f.StringVar(&tokenFile, "token-file", "", "with --http: the bearer token clients must send, read from `FILE`")
	f.StringVar(&label, "label", mcpserver.DefaultLabel, "value of the space-mcp label on the sandboxes it creates and acts on")
	f.DurationVar(&idle, "idle", mcpserver.DefaultIdle, "delete a sandbox after this long without a tool call")
	return c
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// serveMCPHTTP serves srv's streamable HTTP transport on addr until ctx
// ends.
func (g *globals) serveMCPHTTP(ctx context.Context, srv *mcp.Server, addr, tokenFile string) error {
	var token string
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); len(token) < 16 {
			return fmt.Errorf("--token-file %s: the token has %d characters, want at least 16", tokenFile, len(token))
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	if tcp, ok := ln.Addr().(*net.TCPAddr); token == "" && (!ok || !tcp.IP.IsLoopback()) {
		return fmt.Errorf("--http %s is not a loopback address: give --token-file so that only your clients reach the sandboxes", addr)
	}
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{SessionTimeout: time.Hour})
	if token != "" {
		h = requireBearer(token, h)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(g.stderr, "space mcp: serving streamable HTTP on http://%s/mcp\n", ln.Addr())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
	}()
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// requireBearer lets through only requests with the bearer token.
func requireBearer(token string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "a bearer token is required (space mcp --token-file)", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
