// Package weedtest runs a real S3-compatible server for tests: SeaweedFS's
// weed, built from the Go module proxy.
//
// The binary is built once per version into the shared tool cache,
// <cache>/v1/tools/weed-<version>/weed (scripts/build-weed.sh, or Build),
// in a throwaway module so SPACE's go.mod never sees SeaweedFS's
// dependencies. A build takes many minutes, so Start builds it only where
// the s3 tier is required; elsewhere a missing binary skips the test with a
// hint to run the script.
//
// One server is shared by every test of a test process that needs it at the
// same time; each Start call gets its own bucket. The server listens on
// loopback ports chosen free, keeps its data in a temporary directory, and
// stops (no process left behind) when the last test that called Start
// ends. Hold one Start in a parent test to keep a single server across its
// subtests.
package weedtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"space/internal/cachedir"
	"space/internal/testenv"
)

const (
	// Module is SeaweedFS's Go module.
	Module = "github.com/seaweedfs/seaweedfs"
	// Version is the SeaweedFS module version the tests run.
	Version = "v0.0.0-20261109003541-7506e5f91cd6"

	accessKey = "spacetest"
	secretKey = "spacetest-secret-key"

	startTimeout = 90 * time.Second
	stopTimeout  = 3 * time.Second
)

// Server is a running S3 endpoint and a bucket of one test's own.
type Server struct {
	Endpoint  string // host:port, plain http
	AccessKey string
	SecretKey string
	Bucket    string // new and empty
}

var (
	mu sync.Mutex // held across server start and stop: Start callers wait for them anyway
	// +checklocks:mu
	srv *server // or nil when no test holds the server
	// +checklocks:mu
	refs int // tests holding srv
	// +checklocks:mu
	bucketSeq int
)

type server struct {
	dir      string   // temporary directory: data, config, log
	sockets  []string // unix sockets weed makes outside dir
	endpoint string
	client   *minio.Client
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd has been waited for
	// waitErr is cmd.Wait's result, readable after done is closed.
	waitErr error
}

// Start returns the S3 server shared by the running tests (starting it if
// needed) and a new bucket on it. The bucket's server is stopped when t
// and every other test holding it have ended. Without a weed binary Start
// reports the s3 tier unavailable.
func Start(t testing.TB) Server {
	t.Helper()
	bin := Binary(t)
	s, bucket, err := acquire(bin)
	if err != nil {
		t.Fatalf("setup: start weed: %v", err)
	}
	t.Cleanup(release)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("setup: create bucket %s: %v", bucket, err)
	}
	return Server{Endpoint: s.endpoint, AccessKey: accessKey, SecretKey: secretKey, Bucket: bucket}
}

// Binary returns the cached weed binary of Version. If it is not built, it
// builds it where the s3 tier is required, and otherwise reports the tier
// unavailable.
func Binary(t testing.TB) string {
	t.Helper()
	base := testenv.CacheDir(t)
	if p, ok := cached(base, Version); ok {
		return p
	}
	if !testenv.Required(testenv.TierS3) {
		testenv.Unavailable(t, testenv.TierS3, fmt.Sprintf(
			"weed %s is not in the tool cache: run scripts/build-weed.sh once (10-25 minutes on 2 cores)", Version))
	}
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Unavailable(t, testenv.TierS3, "weed is not in the tool cache and go is not on PATH to build it")
	}
	ctx := context.Background()
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, dl.Add(-30*time.Second))
			defer cancel()
		}
	}
	t.Logf("building weed %s into the tool cache (once per version; many minutes; scripts/build-weed.sh does it ahead)", Version)
	var out bytes.Buffer
	p, err := Build(ctx, base, Version, &out)
	if err != nil {
		testenv.Unavailable(t, testenv.TierS3, fmt.Sprintf("build weed: %v\n%s", err, tail(out.Bytes(), 4000)))
	}
	return p
}

func binPath(base, version string) (string, error) {
	d, err := cachedir.Open(base)
	if err != nil {
		return "", err
	}
	return filepath.Join(d.Path("tools", "weed-"+version), "weed"), nil
}

func cached(base, version string) (string, bool) {
	p, err := binPath(base, version)
	if err != nil {
		return "", false
	}
	fi, err := os.Stat(p)
	return p, err == nil && fi.Mode().IsRegular()
}

// Build returns the weed binary of version in the tool cache under base
// (base/v1/tools/weed-<version>/weed), building it first if it is not
// there. It builds in a throwaway module (GOFLAGS=-mod=mod, GOWORK=off,
// CGO_ENABLED=0) with the go command on PATH, writing the go command's
// output to log. Concurrent callers, in any process, wait for one build.
func Build(ctx context.Context, base, version string, log io.Writer) (string, error) {
	d, err := cachedir.Open(base)
	if err != nil {
		return "", err
	}
	dir, err := d.Ensure(ctx, "tools", "weed-"+version, func(ctx context.Context, tmp string) error {
		mod := filepath.Join(filepath.Dir(tmp), "mod")
		for _, p := range []string{mod, tmp} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		}
		env := append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off", "CGO_ENABLED=0")
		for _, args := range [][]string{
			{"mod", "init", "weedbuild"},
			{"get", Module + "@" + version},
			{"build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(tmp, "weed"), Module + "/weed"},
		} {
			cmd := exec.CommandContext(ctx, "go", args...)
			cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = mod, env, log, log
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("go %s: %w", args[0], err)
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "weed"), nil
}

// acquire returns the running server, starting it if needed, and a fresh
// bucket name. The caller must call release.
func acquire(bin string) (*server, string, error) {
	mu.Lock()
	defer mu.Unlock()
	if srv == nil {
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			var s *server
			if s, err = startServer(bin); err == nil {
				srv = s
				break
			}
			if !errors.Is(err, errExited) {
				break // only a port taken meanwhile is worth another try
			}
		}
		if err != nil {
			return nil, "", err
		}
	}
	refs++
	bucketSeq++
	return srv, fmt.Sprintf("test-%d-%d", os.Getpid(), bucketSeq), nil
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
	s.stop() // failing to stop leaves nothing behind: stop kills
}

var errExited = errors.New("weed exited during startup")

func startServer(bin string) (_ *server, err error) {
	dir, err := os.MkdirTemp("", "space-weed-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	cfg := fmt.Sprintf(`{"identities": [{"name": "space-test",
		"credentials": [{"accessKey": %q, "secretKey": %q}],
		"actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}`, accessKey, secretKey)
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		return nil, err
	}
	ports, err := freePorts(8)
	if err != nil {
		return nil, err
	}
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	args := []string{"-logtostderr", "server", // logs go to weed.log, not files in /tmp
		"-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port=" + p(0), "-master.port.grpc=" + p(1), "-master.telemetry=false",
		"-master.volumeSizeLimitMB=64",
		"-volume.port=" + p(2), "-volume.port.grpc=" + p(3), "-volume.max=0", "-volume.preStopSeconds=0",
		"-filer", "-filer.port=" + p(4), "-filer.port.grpc=" + p(5),
		"-filer.localSocket=" + filepath.Join(dir, "filer.sock"),
		"-s3", "-s3.port=" + p(6), "-s3.port.grpc=" + p(7),
		"-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.config=" + filepath.Join(dir, "s3.json"),
	}
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed with the test process, whatever way it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{dir: dir, endpoint: "127.0.0.1:" + p(6), cmd: cmd, done: make(chan struct{})}
	// weed always puts its gRPC sockets in /tmp; a graceful stop removes
	// them, and stop removes them after a kill.
	for i, svc := range map[int]string{1: "master", 3: "volume", 5: "filer", 7: "s3"} {
		s.sockets = append(s.sockets, fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", svc, ports[i]))
	}
	go func() { // owned by s: stop waits for done
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	s.client, err = minio.New(s.endpoint, &minio.Options{Creds: credentials.NewStaticV4(accessKey, secretKey, ""), MaxRetries: 1})
	if err != nil {
		s.stop()
		return nil, err
	}
	if err := s.waitReady(); err != nil {
		log := s.log()
		s.stop()
		return nil, fmt.Errorf("%w\nweed log (tail):\n%s", err, log)
	}
	return s, nil
}

// waitReady waits until the S3 API answers an authenticated request, which
// needs the master, a volume server and the filer up too.
func (s *server) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var last error
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.client.ListBuckets(rctx)
		rcancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-s.done:
			return fmt.Errorf("%w: %v", errExited, s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("s3 endpoint %s not ready within %v: %v", s.endpoint, startTimeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop terminates weed (SIGTERM, then SIGKILL: its data is thrown away, so
// a slow graceful shutdown is not worth waiting for) and removes its files.
func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		s.cmd.Process.Kill()
		<-s.done
	}
	for _, p := range s.sockets {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(p)
		}
	}
	os.RemoveAll(s.dir)
}

func (s *server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "weed.log"))
	return tail(b, 4000)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (held together, so they differ).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
