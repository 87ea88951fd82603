package pgtest

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// ListenTCP serves the database of dsn (from Start) on a TCP port of host,
// for clients that cannot reach the server's unix socket, such as pods on
// a test cluster's network, and returns a postgres:// URL for them. Each
// connection is relayed to the socket, so the server's trust
// authentication applies: the URL carries no password. The listener and
// every relayed connection close when t ends.
func ListenTCP(t testing.TB, dsn, host string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("setup: parse %q: %v", dsn, err)
	}
	if !strings.HasPrefix(cfg.Host, "/") {
		t.Fatalf("setup: ListenTCP(%q): want a DSN from Start (a unix socket)", dsn)
	}
	socket := filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("setup: listen for postgresql on %s: %v", host, err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				up, err := net.Dial("unix", socket)
				if err != nil {
					return
				}
				defer up.Close()
				track(c, true)
				track(up, true)
				defer track(c, false)
				defer track(up, false)
				done := make(chan struct{})
				go func() { io.Copy(up, c); up.(*net.UnixConn).CloseWrite(); close(done) }()
				io.Copy(c, up)
				c.(*net.TCPConn).CloseWrite()
				<-done
			})
		}
	})
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(cfg.User),
		Host:     ln.Addr().String(),
		Path:     "/" + cfg.Database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}
