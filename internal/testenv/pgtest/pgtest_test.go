package pgtest

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStart(t *testing.T) {
	var pid int
	var dir string
	t.Run("server", func(t *testing.T) {
		a, b := Start(t), Start(t)
		if a == b {
			t.Errorf("Start() twice = %q both times, want distinct databases", a)
		}
		for _, dsn := range []string{a, b} {
			conn, err := pgx.Connect(t.Context(), dsn)
			if err != nil {
				t.Fatalf("connect %s: %v", dsn, err)
			}
			var one int
			if err := conn.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Errorf("SELECT 1 on %s = %d, %v", dsn, one, err)
			}
			conn.Close(t.Context())
		}
		mu.Lock()
		pid, dir = srv.cmd.Process.Pid, srv.dir
		mu.Unlock()
	})
	if pid == 0 {
		return // skipped or failed above
	}
	// The subtest's cleanup stopped the server: no process, no directory.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postgres pid %d after last cleanup: kill(0) = %v, want ESRCH", pid, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server directory %s after last cleanup: %v, want not exist", dir, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if srv != nil || refs != 0 {
		t.Errorf("after last cleanup: srv = %v, refs = %d; want nil, 0", srv, refs)
	}
}

// TestListenTCP reaches a database through the TCP relay, as a pod would.
func TestListenTCP(t *testing.T) {
	url := ListenTCP(t, Start(t), "127.0.0.1")
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(t.Context())
	var db string
	if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil || db == "" {
		t.Errorf("current_database() over TCP = %q, %v", db, err)
	}
}
