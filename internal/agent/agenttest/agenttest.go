// Package agenttest is the agent conformance suite: the same scenarios run
// against an agent server in the test process and against space-agent in a
// real VM.
package agenttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/testenv"
)

// Options describe the agent under test.
type Options struct {
	// Scratch is a writable guest directory the suite may fill (up to
	// ~100 MiB) and leave behind.
	Scratch string
	// PID1 is set when the agent is the guest's init, so orphans are its
	// to reap.
	PID1 bool
	// Reconnect closes old, the suite's connection, connects to the same
	// agent again and returns the new client; the suite uses it from then
	// on, and the caller closes it. nil = the scenarios that need the host
	// to go away and come back don't run.
	Reconnect func(ctx context.Context, old *client.Client) (*client.Client, error)
	// Unprivileged is set when the agent runs as a user that cannot
	// switch users (the fake vmm's guests): an exec as another user must
	// then fail with errkind.PermissionDenied, and the rest of
	// EnvCwdUser runs as the agent's own user.
	Unprivileged bool
	// PageReads is set when the agent must offer file reads in place
	// (proto.RingFeatures.PageRefs): a guest agent whose host maps its
	// memory. Without it those scenarios run only where it offers them.
	PageReads bool
}

// Run runs every scenario against c.
func Run(t *testing.T, c *client.Client, opts Options) {
	t.Run("ExitCodes", func(t *testing.T) { testExitCodes(t, c) })
	t.Run("StdoutStderrSeparate", func(t *testing.T) { testSeparate(t, c) })
	t.Run("Stdout50MiB", func(t *testing.T) { testBigStdout(t, c, opts) })
	t.Run("Stdin10MiB", func(t *testing.T) { testStdin(t, c) })
	if c.RingStdin() {
		// Inline input has no flow control but the stream's window: a
		// process that never reads it holds up the stream, signals
		// included. Through the ring the host keeps only a few
		// references in flight and the stream stays free.
		t.Run("StdinNotRead", func(t *testing.T) { testStdinNotRead(t, c) })
	}
	t.Run("Timeout", func(t *testing.T) { testTimeout(t, c) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, c) })
	t.Run("ClientDisconnect", func(t *testing.T) { testDisconnect(t, c) })
	t.Run("BackgroundSurvives", func(t *testing.T) { testBackground(t, c) })
	t.Run("EnvCwdUser", func(t *testing.T) { testEnvCwdUser(t, c, opts) })
	t.Run("ExecErrors", func(t *testing.T) { testExecErrors(t, c) })
	t.Run("PTY", func(t *testing.T) { testPTY(t, c) })
	t.Run("Files", func(t *testing.T) { testFiles(t, c, opts) })
	t.Run("FileRanges", func(t *testing.T) { testRanges(t, c, opts) })
	if opts.PageReads || c.PageReads() {
		t.Run("FileReadInPlace", func(t *testing.T) { testReadInPlace(t, c, opts) })
	}
	t.Run("AppendInPlace", func(t *testing.T) { testAppend(t, c, opts) })
	t.Run("Tar", func(t *testing.T) { testTar(t, c, opts) })
	t.Run("FileMeta", func(t *testing.T) { testFileMeta(t, c, opts) })
	t.Run("Watch", func(t *testing.T) { testWatch(t, c, opts) })
	t.Run("BadPaths", func(t *testing.T) { testBadPaths(t, c, opts) })
	t.Run("MalformedFrames", func(t *testing.T) { testMalformed(t, c) })
	runProc(t, c, opts)
	if opts.PID1 {
		t.Run("ZombiesReaped", func(t *testing.T) { testZombies(t, c) })
	}
	if opts.Reconnect != nil {
		t.Run("ProcSurvivesReconnect", func(t *testing.T) { testProcReconnect(t, &c, opts) })
	}
}

// Output runs a shell command and returns its stdout, failing t on any
// error or a non-zero exit.
func Output(t testing.TB, c *client.Client, shell string) string {
	t.Helper()
	var out, errb bytes.Buffer
	exit, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Shell: shell}, client.IO{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Exec(%q) = %v", shell, err)
	}
	if exit.Code != 0 {
		t.Fatalf("Exec(%q) exit = %+v, stderr %q", shell, exit, errb.String())
	}
	return out.String()
}

func ctx(t testing.TB, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c
}

func testExitCodes(t *testing.T, c *client.Client) {
	tests := []struct {
		name  string
		shell string
		want  proto.Exit
	}{
		{"zero", "exit 0", proto.Exit{Code: 0}},
		{"one", "exit 1", proto.Exit{Code: 1}},
		{"killed", "kill -9 $$", proto.Exit{Code: 137, Signal: 9}},
		{"terminated", "kill -15 $$", proto.Exit{Code: 143, Signal: 15}},
		{"true argv", "", proto.Exit{Code: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := proto.ExecRequest{Shell: tt.shell}
			if tt.shell == "" {
				req = proto.ExecRequest{Argv: []string{"true"}}
			}
			got, err := c.Exec(ctx(t, time.Minute), req, client.IO{})
			if err != nil {
				t.Fatalf("Exec(%q) = %v", tt.shell, err)
			}
			if got != tt.want {
				t.Errorf("Exec(%q) = %+v, want %+v", tt.shell, got, tt.want)
			}
		})
	}
}

func testSeparate(t *testing.T, c *client.Client) {
	var out, errb bytes.Buffer
	_, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Shell: "for i in 1 2 3; do echo out$i; echo err$i >&2; done"},
		client.IO{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Exec = %v", err)
	}
	if got, want := out.String(), "out1\nout2\nout3\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := errb.String(), "err1\nerr2\nerr3\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
}

// testBigStdout sends 50 MiB through exec and through proc.start with
// attach: both must arrive byte-exact (backpressure, never drops).
func testBigStdout(t *testing.T, c *client.Client, opts Options) {
	f := opts.Scratch + "/big"
	sum := strings.TrimSpace(Output(t, c, "head -c 52428800 /dev/urandom > "+f+" && sha256sum "+f+" | cut -d' ' -f1"))
	defer Output(t, c, "rm -f "+f)
	check := func(t *testing.T, run func(stdout io.Writer) (proto.Exit, error)) {
		h := sha256.New()
		var n countWriter
		exit, err := run(io.MultiWriter(h, &n))
		if err != nil || exit.Code != 0 {
			t.Fatalf("cat = %+v, %v", exit, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum || n != 50<<20 {
			t.Errorf("stdout: %d bytes, sha256 %s; want %d bytes, sha256 %s", n, got, 50<<20, sum)
		}
	}
	t.Run("exec", func(t *testing.T) {
		check(t, func(w io.Writer) (proto.Exit, error) {
			return c.Exec(ctx(t, 5*time.Minute), proto.ExecRequest{Argv: []string{"cat", f}}, client.IO{Stdout: w})
		})
	})
	t.Run("proc.start", func(t *testing.T) {
		check(t, func(w io.Writer) (proto.Exit, error) {
			p, _, err := c.StartAttached(ctx(t, 5*time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"cat", f}}}, client.IO{Stdout: w})
			if err != nil {
				return proto.Exit{}, err
			}
			return p.Wait()
		})
	})
}

type countWriter int64

func (w *countWriter) Write(p []byte) (int, error) { *w += countWriter(len(p)); return len(p), nil }

func testStdin(t *testing.T, c *client.Client) {
	in := make([]byte, 10<<20)
	rand.Read(in)
	var out bytes.Buffer
	exit, err := c.Exec(ctx(t, 5*time.Minute), proto.ExecRequest{Argv: []string{"cat"}}, client.IO{Stdin: bytes.NewReader(in), Stdout: &out})
	if err != nil || exit.Code != 0 {
		t.Fatalf("cat = %+v, %v", exit, err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Errorf("stdin round trip: got %d bytes back, want the %d sent, byte-exact", out.Len(), len(in))
	}
}

// testStdinNotRead: a process that never reads the input it is sent still
// takes signals, and is killed when its host goes away, although the
// agent cannot write that input anywhere.
func testStdinNotRead(t *testing.T, c *client.Client) {
	big := func() io.Reader { return bytes.NewReader(make([]byte, 32<<20)) }
	p, err := c.Start(ctx(t, time.Minute), proto.ExecRequest{Argv: []string{"sleep", "600"}}, client.IO{Stdin: big()})
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	time.Sleep(500 * time.Millisecond) // the input piles up meanwhile
	if err := p.Signal(15); err != nil {
		t.Fatalf("Signal = %v", err)
	}
	if exit, err := p.Wait(); err != nil || exit.Signal != 15 {
		t.Errorf("Wait after SIGTERM = %+v, %v; want killed by signal 15", exit, err)
	}

	cctx, cancel := context.WithCancel(ctx(t, time.Minute))
	p, err = c.Start(cctx, proto.ExecRequest{Argv: []string{"sleep", "600"}}, client.IO{Stdin: big()})
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	cancel()
	p.Wait()
	testenv.Eventually(t, 30*time.Second, func() bool {
		exit, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Shell: "test -e /proc/" + strconv.Itoa(p.PID)}, client.IO{})
		return err == nil && exit.Code == 1
	})
}

func testTimeout(t *testing.T, c *client.Client) {
	got, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Argv: []string{"sleep", "60"}, TimeoutMS: 300}, client.IO{})
	if err != nil {
		t.Fatalf("Exec = %v", err)
	}
	if want := (proto.Exit{Code: 137, Signal: 9, TimedOut: true}); got != want {
		t.Errorf("Exec(sleep 60, timeout 300ms) = %+v, want %+v", got, want)
	}
}

func testConcurrent(t *testing.T, c *client.Client) {
	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			exit, err := c.Exec(ctx(t, 2*time.Minute), proto.ExecRequest{Shell: fmt.Sprintf("sleep 0.3; echo %d", i)}, client.IO{Stdout: &out})
			switch {
			case err != nil:
				errs[i] = err
			case exit.Code != 0 || out.String() != fmt.Sprintf("%d\n", i):
				errs[i] = fmt.Errorf("exec %d: exit %+v, output %q", i, exit, out.String())
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// blockingWriter accepts a few writes, then blocks until released: a client
// that stops reading.
type blockingWriter struct {
	got     chan struct{}
	release chan struct{}
	once    sync.Once
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.got) })
	<-w.release
	return len(p), nil
}

func testDisconnect(t *testing.T, c *client.Client) {
	cctx, cancel := context.WithCancel(t.Context())
	w := &blockingWriter{got: make(chan struct{}), release: make(chan struct{})}
	p, err := c.Start(cctx, proto.ExecRequest{Argv: []string{"yes"}}, client.IO{Stdout: w})
	if err != nil {
		t.Fatalf("Start(yes) = %v", err)
	}
	<-w.got
	cancel()
	close(w.release)
	if _, err := p.Wait(); err == nil {
		t.Errorf("Wait() after cancel = nil error, want one")
	}
	// The agent still serves, and the abandoned process is killed.
	testenv.Eventually(t, 30*time.Second, func() bool {
		exit, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Shell: "test -e /proc/" + strconv.Itoa(p.PID)}, client.IO{})
		return err == nil && exit.Code == 1
	})
}

func testBackground(t *testing.T, c *client.Client) {
	pid := strings.TrimSpace(Output(t, c, "sleep 1000 > /dev/null 2>&1 & echo $!"))
	Output(t, c, "kill -0 "+pid) // still running after its exec ended
	Output(t, c, "kill "+pid)
}

func testEnvCwdUser(t *testing.T, c *client.Client, opts Options) {
	uid := uint32(65534)
	req := proto.ExecRequest{Shell: `echo "$FOO" "$(pwd)" "$(id -u)"`, Env: []string{"FOO=bar baz"}, Cwd: "/", UID: &uid}
	want := "bar baz / 65534\n"
	if opts.Unprivileged {
		if _, err := c.Exec(ctx(t, time.Minute), req, client.IO{}); !errors.Is(err, errkind.PermissionDenied) {
			t.Errorf("Exec as uid %d by an unprivileged agent = %v, want PermissionDenied", uid, err)
		}
		req.UID = nil
		want = "bar baz / " + strings.TrimSpace(Output(t, c, "id -u")) + "\n"
	}
	var out bytes.Buffer
	exit, err := c.Exec(ctx(t, time.Minute), req, client.IO{Stdout: &out})
	if err != nil || exit.Code != 0 {
		t.Fatalf("Exec = %+v, %v", exit, err)
	}
	if got := out.String(); got != want {
		t.Errorf("env/cwd/uid output = %q, want %q", got, want)
	}
}

func testExecErrors(t *testing.T, c *client.Client) {
	tests := []struct {
		name string
		req  proto.ExecRequest
		kind error
	}{
		{"no command", proto.ExecRequest{}, errkind.InvalidArgument},
		{"both argv and shell", proto.ExecRequest{Argv: []string{"true"}, Shell: "true"}, errkind.InvalidArgument},
		{"missing program", proto.ExecRequest{Argv: []string{"no-such-program-xyz"}}, errkind.NotFound},
		{"missing path", proto.ExecRequest{Argv: []string{"/no/such/program"}}, errkind.NotFound},
		{"bad env", proto.ExecRequest{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, errkind.InvalidArgument},
		{"missing cwd", proto.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, errkind.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Exec(ctx(t, time.Minute), tt.req, client.IO{})
			if !errors.Is(err, tt.kind) {
				t.Errorf("Exec(%+v) = %v, want kind %v", tt.req, err, tt.kind)
			}
		})
	}
}

// lockedBuffer is a bytes.Buffer safe to read while a process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	// +checklocks:mu
	b bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func testPTY(t *testing.T, c *client.Client) {
	var out bytes.Buffer
	exit, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Argv: []string{"stty", "size"}, PTY: &proto.WinSize{Rows: 24, Cols: 80}}, client.IO{Stdout: &out})
	if err != nil || exit.Code != 0 {
		t.Fatalf("stty size on a pty = %+v, %v", exit, err)
	}
	if got := strings.TrimSpace(out.String()); got != "24 80" {
		t.Errorf("stty size = %q, want %q", got, "24 80")
	}

	var buf lockedBuffer
	p, err := c.Start(ctx(t, time.Minute), proto.ExecRequest{Argv: []string{"sh"}, PTY: &proto.WinSize{Rows: 24, Cols: 80}}, client.IO{Stdout: &buf})
	if err != nil {
		t.Fatalf("Start(sh on pty) = %v", err)
	}
	if err := p.Resize(40, 132); err != nil {
		t.Fatalf("Resize = %v", err)
	}
	if err := p.WriteStdin([]byte("stty size; exit 3\n")); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	exit, err = p.Wait()
	if err != nil || exit.Code != 3 {
		t.Fatalf("sh on pty = %+v, %v; output %q", exit, err, buf.String())
	}
	if !strings.Contains(buf.String(), "40 132") {
		t.Errorf("pty output after resize = %q, want it to contain %q", buf.String(), "40 132")
	}
}

func testFiles(t *testing.T, c *client.Client, opts Options) {
	dir := opts.Scratch + "/files"
	if err := c.Mkdir(ctx(t, time.Minute), dir+"/a/b", 0o750, true); err != nil {
		t.Fatalf("Mkdir(parents) = %v", err)
	}
	data := make([]byte, 20<<20)
	rand.Read(data)
	res, err := c.WriteFile(ctx(t, 5*time.Minute), proto.WriteArgs{Path: dir + "/a/big", Mode: 0o600}, bytes.NewReader(data))
	if err != nil || res.Size != int64(len(data)) {
		t.Fatalf("WriteFile(20 MiB) = %+v, %v", res, err)
	}
	var back bytes.Buffer
	info, err := c.ReadFile(ctx(t, 5*time.Minute), dir+"/a/big", &back)
	if err != nil {
		t.Fatalf("ReadFile = %v", err)
	}
	if !bytes.Equal(back.Bytes(), data) {
		t.Errorf("ReadFile returned %d bytes, want the %d written, byte-exact", back.Len(), len(data))
	}
	if info.Mode != 0o600 || info.Type != proto.FileRegular || info.Size != int64(len(data)) {
		t.Errorf("ReadFile info = %+v, want a 0600 regular file of %d bytes", info, len(data))
	}
	// Replace atomically, with parents created on the way.
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: dir + "/new/dir/small", MkdirAll: true}, strings.NewReader("hello")); err != nil {
		t.Fatalf("WriteFile(mkdir_all) = %v", err)
	}
	if err := c.Rename(ctx(t, time.Minute), dir+"/new/dir/small", dir+"/a/small"); err != nil {
		t.Fatalf("Rename = %v", err)
	}
	st, err := c.Stat(ctx(t, time.Minute), dir+"/a/small")
	if err != nil || st.Size != 5 || st.Mode != 0o644 {
		t.Errorf("Stat(small) = %+v, %v; want 5 bytes, mode 0644", st, err)
	}
	entries, err := c.List(ctx(t, time.Minute), dir+"/a", 0)
	if err != nil {
		t.Fatalf("List = %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name+":"+string(e.Type))
	}
	want := []string{"b:dir", "big:file", "small:file"}
	if diff := cmp.Diff(want, sorted(names)); diff != "" {
		t.Errorf("List(%s) differs (-want +got):\n%s", dir+"/a", diff)
	}
	if err := c.Remove(ctx(t, time.Minute), dir, true); err != nil {
		t.Fatalf("Remove(recursive) = %v", err)
	}
	if _, err := c.Stat(ctx(t, time.Minute), dir); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Stat(removed) = %v, want NotFound", err)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func testBadPaths(t *testing.T, c *client.Client, opts Options) {
	read := func(p string) error { _, err := c.ReadFile(ctx(t, time.Minute), p, io.Discard); return err }
	write := func(p string) error {
		_, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: p}, strings.NewReader("x"))
		return err
	}
	tests := []struct {
		name string
		call func() error
		kind error
	}{
		{"read relative", func() error { return read("etc/passwd") }, errkind.InvalidArgument},
		{"read empty", func() error { return read("") }, errkind.InvalidArgument},
		{"read NUL", func() error { return read("/etc/\x00passwd") }, errkind.InvalidArgument},
		{"read missing", func() error { return read(opts.Scratch + "/no/such/file") }, errkind.NotFound},
		{"read directory", func() error { return read(opts.Scratch) }, errkind.FailedPrecondition},
		{"write missing parent", func() error { return write(opts.Scratch + "/no/such/dir/f") }, errkind.NotFound},
		{"write over directory", func() error { return write(opts.Scratch) }, errkind.FailedPrecondition},
		{"write relative", func() error { return write("x") }, errkind.InvalidArgument},
		{"list file", func() error {
			_, err := c.List(ctx(t, time.Minute), "/proc/self/status", 0)
			return err
		}, errkind.FailedPrecondition},
		{"list missing", func() error { _, err := c.List(ctx(t, time.Minute), "/no/such", 0); return err }, errkind.NotFound},
		{"mkdir existing", func() error { return c.Mkdir(ctx(t, time.Minute), opts.Scratch, 0, false) }, errkind.Conflict},
		{"remove missing", func() error { return c.Remove(ctx(t, time.Minute), opts.Scratch+"/nope", false) }, errkind.NotFound},
		{"remove root", func() error { return c.Remove(ctx(t, time.Minute), "/", true) }, errkind.InvalidArgument},
		{"rename missing", func() error { return c.Rename(ctx(t, time.Minute), opts.Scratch+"/nope", opts.Scratch+"/x") }, errkind.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.kind) {
				t.Errorf("got %v, want kind %v", err, tt.kind)
			}
		})
	}
}

// testMalformed sends frames no well-behaved host sends: each gets an error
// reply (or a closed stream) and the agent keeps serving.
func testMalformed(t *testing.T, c *client.Client) {
	tests := []struct {
		name string
		raw  []byte
	}{
		{"unknown op", proto.AppendFrame(nil, proto.TypeRequest, []byte(`{"op":"format_disk"}`))},
		{"unknown frame type", []byte{200, 0, 0, 0, 1, 'x'}},
		{"oversized frame", []byte{byte(proto.TypeRequest), 0xff, 0xff, 0xff, 0xff}},
		{"not json", proto.AppendFrame(nil, proto.TypeRequest, []byte(`{{{{`))},
		{"unknown field", proto.AppendFrame(nil, proto.TypeRequest, []byte(`{"op":"health","evil":1}`))},
		{"data before request", proto.AppendFrame(nil, proto.TypeData, []byte(`hello`))},
		{"bad exec args", proto.AppendFrame(nil, proto.TypeRequest, []byte(`{"op":"exec","args":{"argv":"notalist"}}`))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := c.OpenRaw()
			if err != nil {
				t.Fatalf("OpenRaw = %v", err)
			}
			defer st.Close()
			if _, err := st.Write(tt.raw); err != nil {
				t.Fatalf("write = %v", err)
			}
			f, err := proto.NewReader(st, 0).Next()
			if err != nil {
				t.Fatalf("reply = %v, want an error frame", err)
			}
			var e proto.Error
			if f.Type != proto.TypeError || proto.DecodeJSON(f, 0, &e) != nil || e.Code != errkind.InvalidArgument.String() {
				t.Errorf("reply = %s %q, want an invalid_argument error", f.Type, f.Payload)
			}
		})
	}
	if _, err := c.Health(ctx(t, time.Minute)); err != nil {
		t.Errorf("Health after malformed frames = %v", err)
	}
}

func testZombies(t *testing.T, c *client.Client) {
	// The shell exits at once; its child becomes an orphan of PID 1.
	Output(t, c, "(sleep 0.2 &) ; true")
	testenv.Eventually(t, 30*time.Second, func() bool {
		out := Output(t, c, "ps -eo stat= | grep -c '^Z' || true")
		return strings.TrimSpace(out) == "0"
	})
}
