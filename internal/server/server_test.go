package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/cgroup"
	"space/internal/storage"
	"space/internal/testenv"
	"space/internal/worker"
)

// testServer is a server process run in this test process.
type testServer struct {
	url, key string
	dataDir  string
	workerID string
	client   *client.Client
	stop     func()
}

// startServer runs a server on a fresh data dir (or dataDir, reused) and
// returns once it serves. VMs left by a test are deleted at cleanup.
func startServer(t *testing.T, dataDir, workerID string) *testServer {
	t.Helper()
	return startServerWith(t, Config{DataDir: dataDir, WorkerID: workerID})
}

// startServerB is startServer for benchmarks; sandboxes are deleted at
// the end.
func startServerB(b *testing.B, cfg Config) *testServer {
	b.Helper()
	ts := startServerTB(b, cfg)
	ts.deleteAllOnCleanup(b)
	return ts
}

func startServerWith(t *testing.T, cfg Config) *testServer {
	t.Helper()
	ts := startServerTB(t, cfg)
	return ts
}

func startServerTB(t testing.TB, cfg Config) *testServer {
	t.Helper()
	dataDir, workerID := cfg.DataDir, cfg.WorkerID
	guesttest.Images(t)
	agent := guesttest.Agent(t)
	if dataDir == "" {
		dataDir = newDataDir(t)
	}
	if workerID == "" {
		workerID = newWorkerID(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		cfg.DataDir, cfg.WorkerID, cfg.Listen, cfg.CacheBase, cfg.AgentPath = dataDir, workerID, "127.0.0.1:0", guesttest.CacheBase(), agent
		cfg.Version, cfg.Ready = "test", func(u string) { ready <- u }
		if os.Getenv("SPACE_TEST_LOG") != "" && cfg.Log == nil { // the server's events on stderr
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
		done <- Run(ctx, cfg)
	}()
	var url string
	select {
	case url = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("setup: server: %v", err)
	case <-time.After(5 * time.Minute):
		cancel()
		t.Fatalf("setup: server not ready in 5m")
	}
	key, err := os.ReadFile(filepath.Join(dataDir, AdminKeyFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	c, err := client.New(url, strings.TrimSpace(string(key)))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var once sync.Once
	ts := &testServer{url: url, key: strings.TrimSpace(string(key)), dataDir: dataDir, workerID: workerID, client: c}
	ts.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		})
	}
	t.Cleanup(ts.stop)
	return ts
}

// poolReady reports whether the server's worker has a pool member ready.
func (ts *testServer) poolReady() bool {
	sandboxes := filepath.Join(ts.dataDir, "worker", "sandboxes")
	entries, _ := os.ReadDir(sandboxes)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(sandboxes, e.Name(), "record.json"))
		if strings.Contains(string(b), `"pool": "default/`) && strings.Contains(string(b), `"state": "running"`) {
			return true
		}
	}
	return false
}

// deleteAllOnCleanup deletes the sandboxes the admin key's team has when
// the test ends, before the server stops.
func (ts *testServer) deleteAllOnCleanup(t testing.TB) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		all, err := ts.client.Sandboxes(ctx, client.ListOptions{})
		if err != nil {
			t.Errorf("cleanup: list: %v", err)
			return
		}
		for _, sb := range all {
			if err := ts.client.DeleteSandbox(ctx, sb.ID); err != nil {
				t.Errorf("cleanup: delete %s: %v", sb.ID, err)
			}
		}
	})
}

// newDataDir returns a data directory for a server or worker, and
// unmounts the worker storage a server mounts in it (a loop-mounted XFS
// image on this host) once the test is over: after the cleanups
// registered later, newWorkerID's killing of leftover VMs among them. One
// still running would keep it busy: it is then detached lazily.
func newDataDir(t testing.TB) string {
	dataDir := t.TempDir()
	t.Cleanup(func() {
		if err := storage.Unmount(context.Background(), filepath.Join(dataDir, "worker")); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return dataDir
}

func newWorkerID(t testing.TB) string {
	var b [4]byte
	rand.Read(b[:])
	id := "t" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		// Servers leave VMs running when they stop; a test that failed
		// before deleting its sandboxes must not leave them behind.
		if h, err := cgroup.Detect(); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := h.Destroy(ctx, "space-"+id); err != nil {
				t.Errorf("cleanup: worker cgroup: %v", err)
			}
		}
		os.RemoveAll("/dev/shm/space-" + id)
	})
	return id
}

func execOut(t testing.TB, c *client.Client, id string, req api.Exec) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	exit, err := c.Exec(t.Context(), id, req, &stdout, &stderr)
	if err != nil {
		t.Fatalf("Exec(%v) = %v", req.Command, err)
	}
	return stdout.String(), stderr.String(), exit.Code
}

func sh(cmd string) api.Exec { return api.Exec{Command: []string{"/bin/sh", "-c", cmd}} }

// startCounter starts, detached in sandbox id, a shell loop that counts
// up in /tmp/count five times a second, and waits for its first count.
func startCounter(t testing.TB, c *client.Client, id string) api.Process {
	t.Helper()
	p, err := c.StartDetached(t.Context(), id, api.Exec{Detach: true,
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"})
	if err != nil {
		t.Fatalf("StartDetached(counter) = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return readCounter(t, c, id) > 0 })
	return p
}

// readCounter returns the count startCounter's loop wrote in sandbox id
// (0 before its first).
func readCounter(t testing.TB, c *client.Client, id string) int {
	t.Helper()
	var out bytes.Buffer
	if _, err := c.Exec(t.Context(), id, sh("cat /tmp/count 2>/dev/null || echo 0"), &out, io.Discard); err != nil {
		t.Fatalf("read counter: %v", err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(out.String()))
	return n
}

func TestSandboxLifecycle(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256, Env: map[string]string{"GREETING": "hi"}, Labels: map[string]string{"suite": "e2e"}})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	if sb.State != "running" || sb.VM == nil || sb.VM.Accel == "" || sb.MemoryMiB != 256 || sb.ExpiresAt == nil {
		t.Fatalf("CreateSandbox = %+v, want running with vm info, 256 MiB and an expiry", sb)
	}
	t.Logf("created %s on %s in %d ms (%s)", sb.ID, sb.Worker, sb.VM.BootMS, sb.VM.Accel)
	checkCgroup(t, ts.workerID, sb)

	stdout, stderr, code := execOut(t, c, sb.ID, sh(`echo "$GREETING $EXTRA"; echo oops >&2; exit 3`))
	if stdout != "hi there\n" && code != 3 {
		t.Errorf("exec = %q, %q, %d", stdout, stderr, code)
	}
	req := sh(`echo "$GREETING $EXTRA"; echo oops >&2; exit 3`)
	req.Env = map[string]string{"EXTRA": "there"}
	stdout, stderr, code = execOut(t, c, sb.ID, req)
	if stdout != "hi there\n" || stderr != "oops\n" || code != 3 {
		t.Errorf("exec = %q, %q, %d; want %q, %q, 3", stdout, stderr, code, "hi there\n", "oops\n")
	}
	// Raw bytes survive the stream.
	stdout, _, _ = execOut(t, c, sb.ID, sh(`printf '\000\377\n'`))
	if stdout != "\x00\xff\n" {
		t.Errorf("binary output = %q, want %q", stdout, "\x00\xff\n")
	}
	// One NIC, behind a gateway that allows nothing without a policy:
	// no name resolves.
	stdout, _, _ = execOut(t, c, sb.ID, sh(`ls /sys/class/net; getent hosts example.com || echo unresolved`))
	if stdout != "eth0\nlo\nunresolved\n" {
		t.Errorf("guest network devices and a lookup = %q, want eth0, lo and no answer", stdout)
	}
	// Users resolve in the guest.
	stdout, _, _ = execOut(t, c, sb.ID, api.Exec{Command: []string{"id", "-u"}, User: "nobody"})
	if stdout != "65534\n" {
		t.Errorf("id -u as nobody = %q", stdout)
	}

	// Files.
	if _, err := c.WriteFile(ctx, sb.ID, "/work/a.txt", strings.NewReader("content\n"), client.WriteOptions{Mode: 0o600, Mkdir: true}); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	var got bytes.Buffer
	mode, err := c.ReadFile(ctx, sb.ID, "/work/a.txt", &got)
	if err != nil || got.String() != "content\n" || mode.Perm() != 0o600 {
		t.Errorf("ReadFile = %q, %v, %v", got.String(), mode, err)
	}
	list, err := c.ListFiles(ctx, sb.ID, "/work")
	if err != nil || len(list.Entries) != 1 || list.Entries[0].Name != "a.txt" || list.Entries[0].Size != 8 {
		t.Errorf("ListFiles = %+v, %v", list, err)
	}
	if _, err := c.ReadFile(ctx, sb.ID, "/work/missing", io.Discard); !client.IsNotFound(err) {
		t.Errorf("ReadFile(missing) = %v, want not found", err)
	}

	all, err := c.Sandboxes(ctx, client.ListOptions{Labels: map[string]string{"suite": "e2e"}})
	if err != nil || len(all) != 1 || all[0].ID != sb.ID {
		t.Errorf("Sandboxes(label) = %v, %v", all, err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	if _, err := c.Sandbox(ctx, sb.ID); !client.IsNotFound(err) {
		t.Errorf("Sandbox after delete = %v, want not found", err)
	}
	assertNoLeftovers(t, ts)
}

// assertNoLeftovers checks the worker's run root and sandbox directories
// are empty and no process is left in its control groups.
func assertNoLeftovers(t *testing.T, ts *testServer) {
	t.Helper()
	for _, dir := range []string{"/dev/shm/space-" + ts.workerID, filepath.Join(ts.dataDir, "worker", "sandboxes")} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("read %s: %v", dir, err)
		}
		if len(entries) > 0 {
			t.Errorf("%s holds %d entries after every sandbox is gone", dir, len(entries))
		}
	}
	if pids := cgroupProcs(t, ts.workerID); len(pids) > 0 {
		t.Errorf("processes %v left in the worker's control groups", pids)
	}
}

func TestDetachAttach(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	p, err := c.StartDetached(ctx, sb.ID, api.Exec{Shell: "for i in 1 2 3; do echo $i; sleep 0.5; done; exit 7", Detach: true, Tag: "counter"})
	if err != nil {
		t.Fatalf("StartDetached = %v", err)
	}
	procs, err := c.Processes(ctx, sb.ID)
	if err != nil || len(procs) == 0 || procs[len(procs)-1].ID != p.ID || procs[len(procs)-1].Tag != "counter" || p.Tag != "counter" {
		t.Errorf("Processes = %+v, %v; want %d listed with tag counter", procs, err, p.ID)
	}
	if _, err := c.StartDetached(ctx, sb.ID, api.Exec{Shell: "true", Detach: true, Tag: "bad\ttag"}); !client.IsInvalid(err) {
		t.Errorf("StartDetached with a tab in its tag = %v, want invalid argument", err)
	}
	var out bytes.Buffer
	exit, err := c.Output(ctx, sb.ID, p.ID, &out, io.Discard)
	if err != nil || exit.Code != 7 || out.String() != "1\n2\n3\n" {
		t.Errorf("Output = %q, %+v, %v; want 1 2 3 and exit 7", out.String(), exit, err)
	}

	// A client that goes away does not kill its command; what it printed
	// meanwhile waits for the next attach.
	cctx, cancel := context.WithCancel(ctx)
	first := &notifyWriter{ch: make(chan struct{}, 1)}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(cctx, sb.ID, sh(`echo start; sleep 2; echo after; exit 5`), first, io.Discard)
		errc <- err
	}()
	select {
	case <-first.ch:
	case <-time.After(time.Minute):
		t.Fatalf("no output from exec")
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatalf("Exec with cancelled ctx = nil error")
	}
	procs, err = c.Processes(ctx, sb.ID)
	if err != nil || len(procs) == 0 {
		t.Fatalf("Processes = %v, %v", procs, err)
	}
	last := procs[len(procs)-1]
	out.Reset()
	exit, err = c.Attach(ctx, sb.ID, last.ID, client.StreamIO{Stdout: &out})
	if err != nil || exit.Code != 5 || !strings.Contains(out.String(), "after\n") {
		t.Errorf("Attach after disconnect = %q, %+v, %v; want \"after\" and exit 5", out.String(), exit, err)
	}

	// Stdin over the WebSocket.
	out.Reset()
	exit, err = c.ExecStream(ctx, sb.ID, api.Exec{Command: []string{"tr", "a-z", "A-Z"}}, client.StreamIO{Stdin: strings.NewReader("shout\n"), Stdout: &out})
	if err != nil || exit.Code != 0 || out.String() != "SHOUT\n" {
		t.Errorf("ExecStream(tr) = %q, %+v, %v", out.String(), exit, err)
	}
	// A terminal.
	out.Reset()
	exit, err = c.ExecStream(ctx, sb.ID, api.Exec{Command: []string{"stty", "size"}, TTY: &api.WinSize{Rows: 33, Cols: 99}}, client.StreamIO{Stdout: &out})
	if err != nil || exit.Code != 0 || strings.TrimSpace(out.String()) != "33 99" {
		t.Errorf("ExecStream(stty size) = %q, %+v, %v", out.String(), exit, err)
	}

	// Stdin and terminal sizes through their own routes, without
	// attaching: the attached stream keeps the output.
	for _, tty := range []bool{false, true} {
		req := api.Exec{Shell: `read a; echo "got $a"; read b; stty size; cat; echo end`}
		if tty {
			req.TTY = &api.WinSize{Rows: 10, Cols: 20}
		}
		started := make(chan api.Process, 1)
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			exit, err := c.ExecStream(ctx, sb.ID, req, client.StreamIO{Stdout: pw, KeepStdinOpen: true,
				Started: func(p api.Process) { started <- p }})
			if err == nil && exit.Code != 0 {
				err = fmt.Errorf("exit %+v", exit)
			}
			pw.CloseWithError(err)
			done <- err
		}()
		var p api.Process
		select {
		case p = <-started:
		case <-time.After(time.Minute):
			t.Fatalf("tty %v: no started event", tty)
		}
		if err := c.WriteStdin(ctx, sb.ID, p.ID, []byte("one\n"), false); err != nil {
			t.Fatalf("tty %v: WriteStdin = %v", tty, err)
		}
		err := c.ResizeProcess(ctx, sb.ID, p.ID, api.WinSize{Rows: 40, Cols: 120})
		if tty && err != nil || !tty && !client.IsConflict(err) {
			t.Errorf("tty %v: ResizeProcess = %v", tty, err)
		}
		if err := c.WriteStdin(ctx, sb.ID, p.ID, []byte("two\nlast\n"), !tty); err != nil {
			t.Fatalf("tty %v: WriteStdin(eof) = %v", tty, err)
		}
		if tty { // a terminal ends its input with ^D, read by cat at a line start
			if err := c.WriteStdin(ctx, sb.ID, p.ID, nil, true); err != nil {
				t.Fatalf("tty %v: WriteStdin(eof) = %v", tty, err)
			}
		}
		got, _ := io.ReadAll(pr)
		if err := <-done; err != nil {
			t.Errorf("tty %v: ExecStream = %v (output %q)", tty, err, got)
		}
		// stty fails to stderr without a terminal; a terminal echoes the
		// input in between the command's output, even inside a line the
		// shell's echo writes in two parts.
		text := string(got)
		if !tty && text != "got one\nlast\nend\n" ||
			tty && (!strings.Contains(text, "got one") || !strings.Contains(text, "40 120\r\n") || !strings.HasSuffix(text, "last\r\nend\r\n")) {
			t.Errorf("tty %v: output %q", tty, got)
		}
		if err := c.WriteStdin(ctx, sb.ID, p.ID, []byte("x"), false); !client.IsConflict(err) {
			t.Errorf("tty %v: WriteStdin after exit = %v, want a conflict", tty, err)
		}
	}

	testSharedFollowers(t, c, sb.ID)
}

// testSharedFollowers follows a command from an output stream and an
// attach alongside the exec that started it: each gets what was written
// after it joined, the attach's stdin reaches the command, and every one of
// them sees the exit.
func testSharedFollowers(t *testing.T, c *client.Client, id string) {
	ctx := t.Context()
	var lead, viaOutput, viaAttach syncBuffer
	started := make(chan api.Process, 1)
	ended := make(chan error, 3)
	check := func(name string, exit api.Exit, err error) {
		if err == nil && exit.Code != 0 {
			err = fmt.Errorf("exit %+v", exit)
		}
		if err != nil {
			err = fmt.Errorf("%s: %w", name, err)
		}
		ended <- err
	}
	go func() {
		exit, err := c.ExecStream(ctx, id, api.Exec{Command: []string{"cat"}}, client.StreamIO{Stdout: &lead, KeepStdinOpen: true,
			Started: func(p api.Process) { started <- p }})
		check("exec", exit, err)
	}()
	var p api.Process
	select {
	case p = <-started:
	case <-time.After(time.Minute):
		t.Fatalf("no started event")
	}
	go func() {
		exit, err := c.OutputShared(ctx, id, p.ID, &viaOutput, io.Discard)
		check("shared output", exit, err)
	}()
	// The output stream joins at some point: write until it saw a line.
	testenv.Eventually(t, time.Minute, func() bool {
		if err := c.WriteStdin(ctx, id, p.ID, []byte("ping\n"), false); err != nil {
			t.Fatalf("WriteStdin = %v", err)
		}
		return strings.Contains(viaOutput.String(), "ping\n")
	})
	go func() {
		exit, err := c.AttachShared(ctx, id, p.ID, client.StreamIO{Stdin: strings.NewReader("from attach\n"), Stdout: &viaAttach})
		check("shared attach", exit, err)
	}()
	for range 3 {
		select {
		case err := <-ended:
			if err != nil {
				t.Errorf("%v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("a follower did not end once the attach closed stdin")
		}
	}
	all, out := lead.String(), viaOutput.String()
	if !strings.HasSuffix(all, "ping\nfrom attach\n") || !strings.HasSuffix(all, out) || !strings.HasPrefix(out, "ping\n") || viaAttach.String() != "from attach\n" {
		t.Errorf("exec got %q, shared output %q, shared attach %q; want the output a suffix of the exec's, the attach only its own line", all, out, viaAttach.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	// +checklocks:mu
	b bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type notifyWriter struct {
	ch chan struct{}
}

func (n *notifyWriter) Write(p []byte) (int, error) {
	select {
	case n.ch <- struct{}{}:
	default:
	}
	return len(p), nil
}

func TestTeamIsolation(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	k, err := ts.client.CreateAPIKey(ctx, api.CreateAPIKey{Name: "other", Team: "other"})
	if err != nil {
		t.Fatalf("CreateAPIKey = %v", err)
	}
	other, _ := client.New(ts.url, k.Secret)
	checks := map[string]error{}
	_, checks["get"] = other.Sandbox(ctx, sb.ID)
	checks["delete"] = other.DeleteSandbox(ctx, sb.ID)
	_, checks["exec"] = other.Exec(ctx, sb.ID, sh("true"), io.Discard, io.Discard)
	_, checks["detach"] = other.StartDetached(ctx, sb.ID, api.Exec{Shell: "true", Detach: true})
	_, checks["processes"] = other.Processes(ctx, sb.ID)
	_, checks["read file"] = other.ReadFile(ctx, sb.ID, "/etc/hostname", io.Discard)
	_, checks["write file"] = other.WriteFile(ctx, sb.ID, "/tmp/x", strings.NewReader("x"), client.WriteOptions{})
	_, checks["list files"] = other.ListFiles(ctx, sb.ID, "/")
	checks["signal"] = other.Signal(ctx, sb.ID, 1, 9)
	_, checks["attach"] = other.Attach(ctx, sb.ID, 1, client.StreamIO{})
	for name, err := range checks {
		if !client.IsNotFound(err) {
			t.Errorf("other team's %s = %v, want not found", name, err)
		}
	}
	if all, err := other.Sandboxes(ctx, client.ListOptions{}); err != nil || len(all) != 0 {
		t.Errorf("other team's list = %v, %v; want empty", all, err)
	}
	// A non-admin key cannot make keys for another team.
	if _, err := other.CreateAPIKey(ctx, api.CreateAPIKey{Team: DefaultTeamForTest}); err == nil {
		t.Errorf("non-admin CreateAPIKey(team default) = nil error")
	}
	// The sandbox is untouched.
	if got, err := ts.client.Sandbox(ctx, sb.ID); err != nil || got.State != "running" {
		t.Errorf("owner's Sandbox = %+v, %v", got, err)
	}
}

// DefaultTeamForTest is the first admin key's team.
const DefaultTeamForTest = "default"

func TestConcurrentSandboxes(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	const n = 5
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
			if err != nil {
				errs[i] = err
				return
			}
			var out bytes.Buffer
			exit, err := ts.client.Exec(ctx, sb.ID, sh(fmt.Sprintf("echo %d", i)), &out, io.Discard)
			if err == nil && (exit.Code != 0 || out.String() != fmt.Sprintf("%d\n", i)) {
				err = fmt.Errorf("exec = %q, %+v", out.String(), exit)
			}
			errs[i] = errors.Join(err, ts.client.DeleteSandbox(ctx, sb.ID))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("sandbox %d: %v", i, err)
		}
	}
	assertNoLeftovers(t, ts)
}

// rawCall sends a request with the admin key and returns status and body.
func rawCall(t testing.TB, ts *testServer, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, ts.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+ts.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestTimeoutExpires checks a sandbox is removed, VM and files, once its
// timeout passes.
func TestTimeoutExpires(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	sb, err := ts.client.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 192, TimeoutSeconds: 2})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	testenv.Eventually(t, time.Minute, func() bool {
		_, err := ts.client.Sandbox(t.Context(), sb.ID)
		return client.IsNotFound(err)
	})
	assertNoLeftovers(t, ts)
	if sb.VM != nil {
		testenv.Eventually(t, 10*time.Second, func() bool { return syscall.Kill(sb.VM.PID, 0) != nil })
	}
}

// TestVMDeathMarksFailed kills a sandbox's VMM behind the worker's back:
// the sandbox turns failed (not silently broken), refuses exec with a
// clear error, and deletes cleanly.
func TestVMDeathMarksFailed(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServerWith(t, Config{ReconcileInterval: time.Second})
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	if err := syscall.Kill(sb.VM.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill vmm: %v", err)
	}
	testenv.Eventually(t, time.Minute, func() bool {
		got, err := ts.client.Sandbox(ctx, sb.ID)
		return err == nil && got.State == "failed"
	})
	_, err = ts.client.Exec(ctx, sb.ID, sh("true"), io.Discard, io.Discard)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != api.CodeFailedPrecondition {
		t.Errorf("Exec in failed sandbox = %v, want failed_precondition", err)
	}
	if err := ts.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	assertNoLeftovers(t, ts)
}

// TestPauseResume checks a paused sandbox makes no progress, refuses the
// data plane, and continues on resume.
func TestPauseResume(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	c := ts.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	if _, err := c.StartDetached(ctx, sb.ID, api.Exec{Detach: true,
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"}); err != nil {
		t.Fatalf("StartDetached = %v", err)
	}
	count := func() int {
		var out strings.Builder
		if _, err := c.ReadFile(ctx, sb.ID, "/tmp/count", &out); err != nil {
			return 0
		}
		n, _ := strconv.Atoi(strings.TrimSpace(out.String()))
		return n
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count() > 3 })
	before := count()
	got, err := c.PauseSandbox(ctx, sb.ID)
	if err != nil || got.State != "paused" {
		t.Fatalf("PauseSandbox = %+v, %v", got, err)
	}
	var ce *client.Error
	if _, err := c.Exec(ctx, sb.ID, sh("true"), io.Discard, io.Discard); !errors.As(err, &ce) || ce.Status != http.StatusConflict {
		t.Errorf("Exec while paused = %v, want 409", err)
	}
	pause := time.NewTimer(2 * time.Second) // the guest would count to 20 meanwhile
	<-pause.C
	if got, err := c.ResumeSandbox(ctx, sb.ID); err != nil || got.State != "running" {
		t.Fatalf("ResumeSandbox = %+v, %v", got, err)
	}
	after := count()
	if after-before > 5 {
		t.Errorf("counter went %d -> %d across a 2 s pause; want (almost) no progress", before, after)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count() > after+3 })
	t.Logf("counter %d before pause, %d right after resume", before, after)
}

// checkCgroup checks the sandbox's VMM runs in its own control group with
// the memory limit its size asks for.
func checkCgroup(t *testing.T, workerID string, sb api.Sandbox) {
	t.Helper()
	h, err := cgroup.Detect()
	if err != nil {
		return // no cgroups here: the worker runs without limits
	}
	name := "space-" + workerID + "/" + sb.ID
	g, err := h.Open(name)
	if err != nil {
		t.Errorf("sandbox cgroup %s: %v", name, err)
		return
	}
	pids, err := g.Procs()
	if err != nil || !slices.Contains(pids, sb.VM.PID) {
		t.Errorf("cgroup %s holds %v (%v), want the vmm pid %d", name, pids, err, sb.VM.PID)
	}
	file := filepath.Join("/sys/fs/cgroup/memory", name, "memory.limit_in_bytes")
	if h.Version() == 2 {
		file = filepath.Join("/sys/fs/cgroup", name, "memory.max")
	}
	b, err := os.ReadFile(file)
	want := strconv.FormatInt((sb.MemoryMiB+384)<<20, 10)
	if err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("%s = %q (%v), want %s (guest memory + VMM overhead)", file, b, err, want)
	}
}

// TestWarmCreate checks the first sandbox of a shape boots and is captured
// as the warm template, and the next ones restore it (faster), unless
// asked to boot cold.
func TestWarmCreate(t *testing.T) {
	release := guesttest.AcquireAllSlots(t)
	defer release()
	ts := startServerWith(t, Config{Prewarm: true})
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	c := ts.client
	// The server warms the default shape by itself.
	testenv.Eventually(t, 3*time.Minute, func() bool {
		m, _ := filepath.Glob(filepath.Join(ts.dataDir, "worker", "warm", "default-1c-512m-4096d-*", "info.json"))
		return len(m) == 1
	})
	if sb, err := c.CreateSandbox(ctx, api.CreateSandbox{}); err != nil || sb.VM.StartedBy != "warm" {
		t.Fatalf("first default CreateSandbox after prewarm = %+v, %v; want warm", sb, err)
	} else if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(ts.dataDir, "worker", "sandboxes")); len(entries) != 0 {
		t.Errorf("the prewarm sandbox is left: %v", entries)
	}
	shape := api.CreateSandbox{MemoryMiB: 192, DiskMiB: 1024}
	first, err := c.CreateSandbox(ctx, shape)
	if err != nil || first.VM.StartedBy != "boot" {
		t.Fatalf("first CreateSandbox = %+v, %v; want a boot", first, err)
	}
	execOut(t, c, first.ID, sh("echo first > /root/mine"))
	second, err := c.CreateSandbox(ctx, shape)
	if err != nil || second.VM.StartedBy != "warm" {
		t.Fatalf("second CreateSandbox = %+v, %v; want warm", second, err)
	}
	cold := shape
	cold.ColdBoot = true
	third, err := c.CreateSandbox(ctx, cold)
	if err != nil || third.VM.StartedBy != "boot" {
		t.Fatalf("cold CreateSandbox = %+v, %v; want a boot", third, err)
	}
	t.Logf("boot %d ms, warm %d ms, cold boot %d ms", first.VM.BootMS, second.VM.BootMS, third.VM.BootMS)
	// The warm sandbox is a fresh one: nothing of the first sandbox's, a
	// working exec and file system, and its own random stream.
	if out, _, _ := execOut(t, c, second.ID, sh("cat /root/mine 2>/dev/null || echo absent; hostname")); out != "absent\n"+worker.Hostname(second.ID)+"\n" {
		t.Errorf("warm sandbox = %q, want a fresh sandbox", out)
	}
	rnd := "head -c 16 /dev/urandom | od -An -tx1"
	fourth, err := c.CreateSandbox(ctx, shape)
	if err != nil || fourth.VM.StartedBy != "warm" {
		t.Fatalf("fourth CreateSandbox = %+v, %v", fourth, err)
	}
	r2, _, _ := execOut(t, c, second.ID, sh(rnd))
	r4, _, _ := execOut(t, c, fourth.ID, sh(rnd))
	if r2 == r4 {
		t.Errorf("two warm sandboxes read the same random bytes %q", r2)
	}
	// Each is a machine of its own: machine-id and boot_id differ between
	// the sandbox the warm template was captured from, its restores and a
	// cold boot; and the restores see nothing of the first sandbox's
	// identity (its name was not on the captured kernel command line).
	ids := map[string]string{}
	for _, sb := range []api.Sandbox{first, second, third, fourth} {
		out, _, _ := execOut(t, c, sb.ID, sh("cat /etc/machine-id /proc/sys/kernel/random/boot_id"))
		f := strings.Fields(out)
		if len(f) != 2 || len(f[0]) != 32 || len(f[1]) != 36 {
			t.Errorf("%s (%s): machine-id and boot_id %q, want 32 hex digits and a UUID", sb.ID, sb.VM.StartedBy, out)
			continue
		}
		for _, id := range f {
			if other, ok := ids[id]; ok {
				t.Errorf("%s (%s) and %s share the id %s", sb.ID, sb.VM.StartedBy, other, id)
			}
			ids[id] = sb.ID
		}
	}
	for _, sb := range []api.Sandbox{second, fourth} {
		if out, _, _ := execOut(t, c, sb.ID, sh("cat /proc/cmdline /etc/hostname; hostname")); strings.Contains(out, worker.Hostname(first.ID)) {
			t.Errorf("warm sandbox %s shows the name of %s, the sandbox its template was captured from: %q", sb.ID, first.ID, out)
		}
	}
	if out, _, _ := execOut(t, c, first.ID, sh("hostname; cat /etc/hostname")); out != strings.Repeat(worker.Hostname(first.ID)+"\n", 2) {
		t.Errorf("the captured sandbox's hostname = %q, want its own", out)
	}
}

// TestIdleSuspend checks a sandbox whose timeout suspends it: it keeps
// running while used past its timeout, is suspended once idle (and then
// does not expire), and resumes with its files and a fresh timeout.
func TestIdleSuspend(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	c := ts.client
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{OnTimeout: "later"}); !client.IsInvalid(err) {
		t.Errorf("CreateSandbox(on_timeout later) = %v, want invalid", err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192, TimeoutSeconds: 3, OnTimeout: "suspend"})
	if err != nil || sb.OnTimeout != "suspend" {
		t.Fatalf("CreateSandbox = %+v, %v", sb, err)
	}
	execOut(t, c, sb.ID, sh("echo kept > /root/f"))
	identity := sh("cat /etc/machine-id /proc/sys/kernel/random/boot_id")
	ids, _, _ := execOut(t, c, sb.ID, identity)
	// Used every second, it outlives its 3 s timeout (the reaper looks
	// every 5 s).
	for until := time.Now().Add(12 * time.Second); time.Now().Before(until); time.Sleep(time.Second) {
		execOut(t, c, sb.ID, sh("true"))
	}
	if got, err := c.Sandbox(ctx, sb.ID); err != nil || got.State != "running" {
		t.Fatalf("Sandbox while in use = %+v, %v; want running", got, err)
	}
	var got api.Sandbox
	testenv.Eventually(t, time.Minute, func() bool {
		got, err = c.Sandbox(ctx, sb.ID)
		return err == nil && got.State == "suspended" && got.SuspendedSnapshot != ""
	})
	if got.ExpiresAt != nil {
		t.Errorf("a sandbox suspended on its idle timeout expires at %v, want never", got.ExpiresAt)
	}
	resumed, err := c.ResumeSandbox(ctx, sb.ID)
	if err != nil || resumed.State != "running" || resumed.ExpiresAt == nil || !resumed.ExpiresAt.After(time.Now()) {
		t.Fatalf("ResumeSandbox = %+v, %v; want running with a fresh timeout", resumed, err)
	}
	if out, _, _ := execOut(t, c, sb.ID, sh("cat /root/f")); out != "kept\n" {
		t.Errorf("after resume /root/f = %q, want kept", out)
	}
	// Resumed from its own snapshot, it is the machine it was.
	if out, _, _ := execOut(t, c, sb.ID, identity); out != ids || len(strings.Fields(ids)) != 2 {
		t.Errorf("after resume machine-id and boot_id = %q, want %q as before", out, ids)
	}
}

// TestPoolCreate checks the worker's pool of ready sandboxes: a create of
// the pooled shape takes a member (started_by "pool") and gets its own
// identity and random stream; a refilled member serves the next; a
// restart re-adopts a taken member (which keeps its directories) and
// drops the untaken one; nothing is left once they are deleted.
func TestPoolCreate(t *testing.T) {
	release := guesttest.AcquireAllSlots(t)
	defer release()
	ts := startServerWith(t, Config{Prewarm: true, Pool: 1})
	ctx := t.Context()
	c := ts.client
	sandboxes := filepath.Join(ts.dataDir, "worker", "sandboxes")
	poolReady := func() bool { return ts.poolReady() }
	testenv.Eventually(t, 3*time.Minute, poolReady)
	t0 := time.Now()
	first, err := c.CreateSandbox(ctx, api.CreateSandbox{})
	took := time.Since(t0)
	if err != nil || first.VM == nil || first.VM.StartedBy != "pool" {
		t.Fatalf("CreateSandbox = %+v, %v; want one from the pool", first, err)
	}
	if _, err := os.Stat(filepath.Join(sandboxes, first.ID)); err == nil {
		t.Errorf("a pool member handed to %s was expected to keep its own directory", first.ID)
	}
	testenv.Eventually(t, 3*time.Minute, poolReady)
	second, err := c.CreateSandbox(ctx, api.CreateSandbox{Network: &api.Network{Allow: []string{"api.test"}}})
	if err != nil || second.VM == nil || second.VM.StartedBy != "pool" {
		t.Fatalf("second CreateSandbox = %+v, %v; want one from the refilled pool", second, err)
	}
	// The member's gateway takes the create's policy: its DNS answers for
	// the allowed name only (the first allows nothing).
	dns := sh("getent hosts api.test >/dev/null && echo found || echo missing")
	for sb, want := range map[string]string{first.ID: "missing\n", second.ID: "found\n"} {
		if out, _, _ := execOut(t, c, sb, dns); out != want {
			t.Errorf("api.test from pooled sandbox %s: %q, want %q", sb, out, want)
		}
	}
	rnd := sh("head -c 16 /dev/urandom | od -An -tx1; hostname")
	o1, _, _ := execOut(t, c, first.ID, rnd)
	o2, _, _ := execOut(t, c, second.ID, rnd)
	if o1 == o2 || !strings.HasSuffix(o1, worker.Hostname(first.ID)+"\n") || !strings.HasSuffix(o2, worker.Hostname(second.ID)+"\n") {
		t.Errorf("pooled sandboxes: %q and %q; want their own random bytes and hostnames", o1, o2)
	}
	t.Logf("create from the pool: %v until the API answered", took.Round(time.Millisecond))

	// A restart (VMs keep running) re-adopts both; the refilled member,
	// being the worker's own, goes.
	testenv.Eventually(t, 3*time.Minute, poolReady)
	ts.stop()
	ts = startServerWith(t, Config{DataDir: ts.dataDir, WorkerID: ts.workerID})
	ts.deleteAllOnCleanup(t)
	c = ts.client
	for _, sb := range []api.Sandbox{first, second} {
		got, err := c.Sandbox(ctx, sb.ID)
		if err != nil || got.State != "running" || got.VM == nil || got.VM.PID != sb.VM.PID {
			t.Fatalf("after restart Sandbox(%s) = %+v, %v; want it running on pid %d", sb.ID, got, err, sb.VM.PID)
		}
		if out, _, _ := execOut(t, c, sb.ID, sh("echo alive")); out != "alive\n" {
			t.Errorf("after restart exec in %s = %q", sb.ID, out)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatalf("DeleteSandbox = %v", err)
		}
	}
	assertNoLeftovers(t, ts)
}
