// Package pgtest starts a throwaway PostgreSQL server for tests.
//
// One server is shared by every test of a test process that needs it at the
// same time; each Start call gets its own database. The server listens only
// on a unix socket in its temporary directory and stops (no process left
// behind) when the last test that called Start ends. Hold one Start in a
// parent test to keep a single server across its subtests.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"space/internal/testenv"
)

const (
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
	port         = 5432 // only names the socket file
)

var (
	mu sync.Mutex // held across server start and stop: Start callers wait for them anyway
	// +checklocks:mu
	srv *server // or nil when no test holds the server
	// +checklocks:mu
	refs int // tests holding srv
	// +checklocks:mu
	dbSeq int
)

type server struct {
	dir  string // temporary directory: data/ and the socket
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	// waitErr is cmd.Wait's result, readable after done is closed.
	waitErr error
}

// Start returns the DSN of a new, empty database on the shared server,
// starting the server if no running test holds it. The database is dropped,
// and the server stopped if t was its last user, when t ends. Without the
// server binaries Start reports the postgres tier unavailable.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := findBin()
	if err != nil {
		testenv.Unavailable(t, testenv.TierPostgres, err.Error())
	}
	cred, err := credential()
	if err != nil {
		testenv.Unavailable(t, testenv.TierPostgres, err.Error())
	}

	s, name, err := acquire(t, bin, cred)
	if err != nil {
		t.Fatalf("setup: start postgresql: %v", err)
	}
	t.Cleanup(release)

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	admin := s.dsn("postgres")
	if err := exec1(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("setup: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := exec1(ctx, admin, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.dsn(name)
}

// acquire returns the running server, starting it if needed, and a fresh
// database name. The caller must call release.
func acquire(t testing.TB, bin string, cred *syscall.Credential) (*server, string, error) {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if srv == nil {
		s, err := startServer(t, bin, cred)
		if err != nil {
			return nil, "", err
		}
		srv = s
	}
	refs++
	dbSeq++
	return srv, fmt.Sprintf("test_%d", dbSeq), nil
}

// release drops one reference and stops the server after the last one.
func release() {
	mu.Lock()
	defer mu.Unlock()
	refs--
	if refs > 0 {
		return
	}
	s := srv
	srv = nil
	// Failing to stop leaves a process behind; there is no test left to
	// fail, so say so loudly.
	if err := s.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stop postgresql in %s: %v\n", s.dir, err)
	}
}

func (s *server) dsn(db string) string {
	u := "postgres"
	if os.Geteuid() != 0 {
		if cu, err := user.Current(); err == nil {
			u = cu.Username
		}
	}
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", s.dir, port, u, db)
}

func exec1(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, sql)
	return errors.Join(err, conn.Close(ctx))
}

// findBin returns the newest /usr/lib/postgresql/*/bin holding initdb and
// postgres.
func findBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("postgresql server binaries not found (apt package postgresql)")
}

func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// credential returns who the server runs as: user postgres when we are root
// (initdb refuses root), else nil for ourselves.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root and no postgres user to run the server as: %v", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user postgres: %v", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func command(cred *syscall.Credential, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	return cmd
}

func startServer(t testing.TB, bin string, cred *syscall.Credential) (_ *server, err error) {
	t.Helper()
	begin := time.Now()
	// Not t.TempDir: the server outlives t when other tests hold it, and
	// the socket path must stay short (108 bytes).
	dir, err := os.MkdirTemp("", "pgtest")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, os.RemoveAll(dir))
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	initdb := command(cred, filepath.Join(bin, "initdb"), "-D", data, "-U", userName(cred),
		"--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, bytes.TrimSpace(out))
	}

	var log bytes.Buffer
	cmd := command(cred, filepath.Join(bin, "postgres"), "-D", data, "-k", dir, "-h", "", "-p", strconv.Itoa(port),
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off", "-c", "max_connections=200")
	cmd.Stdout, cmd.Stderr = &log, &log
	// Kill the server if this process dies without running cleanups.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	s := &server{dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()

	ready := s.dsn("postgres")
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		perr := exec1(pctx, ready, "SELECT 1")
		pcancel()
		if perr == nil {
			break
		}
		select {
		case <-s.done:
			return nil, errors.Join(fmt.Errorf("postgres exited: %v: %s", s.waitErr, bytes.TrimSpace(log.Bytes())), os.RemoveAll(dir))
		case <-ctx.Done():
			return nil, errors.Join(fmt.Errorf("postgres not ready after %v: %v", startTimeout, perr), s.stop())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Logf("pgtest: postgresql started in %v (%s)", time.Since(begin).Round(time.Millisecond), bin)
	return s, nil
}

func userName(cred *syscall.Credential) string {
	if cred != nil {
		return "postgres"
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "postgres"
}

// stop shuts the server down immediately (SIGQUIT), waits for it, SIGKILLs
// it after stopTimeout, and removes its directory.
func (s *server) stop() error {
	var errs []error
	if err := s.cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		errs = append(errs, fmt.Errorf("signal postgres: %w", err))
	}
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		errs = append(errs, fmt.Errorf("postgres did not exit within %v; killed", stopTimeout))
		_ = s.cmd.Process.Kill() // reported above
		<-s.done
	}
	errs = append(errs, os.RemoveAll(s.dir))
	return errors.Join(errs...)
}
