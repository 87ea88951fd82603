package firecracker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"space/internal/vmm/firecracker/fcapi/fcapitest"
)

// The test binary doubles as a fake firecracker and a fake jailer:
// FCFAKE_MODE selects the role. Config.Binary points at a small shell
// script that sets the environment (the driver clears it) and execs this
// binary, so the driver's process handling runs against a real process.
func TestMain(m *testing.M) {
	switch os.Getenv("FCFAKE_MODE") {
	case "firecracker":
		os.Exit(fakeFirecrackerMain(os.Args[1:]))
	case "jailer":
		os.Exit(fakeJailerMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeFirecrackerMain serves fcapitest.FakeFirecracker like a firecracker
// process. Environment: FCFAKE_VERSION, FCFAKE_REQUESTS (a file that gets
// every request as a JSON line), FCFAKE_ARGV (a file that gets argv and
// the working directory), FCFAKE_IGNORE_TERM=1, FCFAKE_CRASH (print it
// and exit 1 at once).
func fakeFirecrackerMain(args []string) int {
	if msg := os.Getenv("FCFAKE_CRASH"); msg != "" {
		fmt.Fprintln(os.Stderr, msg)
		return 1
	}
	if os.Getenv("FCFAKE_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	// Firecracker's stdout is the guest console.
	fmt.Printf("fake firecracker %s console\n", os.Getenv("FCFAKE_VERSION"))
	if p := os.Getenv("FCFAKE_ARGV"); p != "" {
		cwd, _ := os.Getwd()
		netns, _ := os.Readlink("/proc/self/ns/net")
		b, _ := json.Marshal(invocation{Args: args, Dir: cwd, Netns: netns})
		if err := os.WriteFile(p, b, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	cfg := fcapitest.Config{
		Serial:  os.Getenv("FCFAKE_SERIAL"),
		Version: os.Getenv("FCFAKE_VERSION"),
		Exit:    os.Exit, // the response has been flushed
	}
	if p := os.Getenv("FCFAKE_REQUESTS"); p != "" {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		var mu sync.Mutex
		cfg.Record = func(r fcapitest.Request) {
			b, _ := json.Marshal(r)
			mu.Lock()
			defer mu.Unlock()
			f.Write(append(b, '\n'))
		}
	}
	return fcapitest.RunProcess(args, cfg, os.Stdout, os.Stderr)
}

type invocation struct {
	Args  []string `json:"args"`
	Dir   string   `json:"dir"`
	Netns string   `json:"netns,omitempty"` // /proc/self/ns/net's target
}

// fakeJailerMain does what the jailer does minus the isolation: it checks
// its arguments like the jailer, creates <base>/<exec name>/<id>/root,
// copies the exec file there, chowns the root, changes into it and execs
// the copy as "--id <id> <args after -->". It neither chroots nor drops
// privileges. FCFAKE_JAILER_ARGV gets its argv.
func fakeJailerMain(args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "jailer: "+format+"\n", a...)
		return 1
	}
	if p := os.Getenv("FCFAKE_JAILER_ARGV"); p != "" {
		b, _ := json.Marshal(invocation{Args: args})
		os.WriteFile(p, b, 0o600)
	}
	vals := map[string]string{}
	var extra []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			extra = args[i+1:]
			break
		}
		switch args[i] {
		case "--id", "--exec-file", "--uid", "--gid", "--chroot-base-dir", "--cgroup-version", "--netns", "--parent-cgroup":
		default:
			return fail("unexpected argument %q", args[i])
		}
		if i+1 >= len(args) {
			return fail("%s needs a value", args[i])
		}
		vals[args[i]] = args[i+1]
		i++
	}
	for _, req := range []string{"--id", "--exec-file", "--uid", "--gid", "--chroot-base-dir"} {
		if vals[req] == "" {
			return fail("missing %s", req)
		}
	}
	if v := vals["--cgroup-version"]; v != "" && v != "1" && v != "2" {
		return fail("bad cgroup version %q", v)
	}
	uid, err1 := strconv.Atoi(vals["--uid"])
	gid, err2 := strconv.Atoi(vals["--gid"])
	if err1 != nil || err2 != nil {
		return fail("bad uid or gid")
	}
	exe, err := filepath.EvalSymlinks(vals["--exec-file"])
	if err != nil {
		return fail("%v", err)
	}
	base, err := filepath.EvalSymlinks(vals["--chroot-base-dir"])
	if err != nil {
		return fail("%v", err)
	}
	name := filepath.Base(exe)
	root := filepath.Join(base, name, vals["--id"], "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fail("%v", err)
	}
	if err := copyFile(exe, filepath.Join(root, name)); err != nil {
		return fail("copy exec file: %v", err)
	}
	if err := os.Chown(root, uid, gid); err != nil {
		return fail("%v", err)
	}
	if err := os.Chdir(root); err != nil {
		return fail("%v", err)
	}
	argv := append([]string{name, "--id", vals["--id"], "--start-time-us", "1", "--start-time-cpu-us", "1", "--parent-cpu-time-us", "1"}, extra...)
	err = syscall.Exec(filepath.Join(root, name), argv, []string{})
	return fail("exec: %v", err)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// fakeOptions shape a fake firecracker.
type fakeOptions struct {
	version    string // "" = 1.16.1
	ignoreTerm bool
	crash      string
	serial     string // what the "guest" prints once started
}

// fakeBinary is a fake firecracker (or jailer) executable for one test.
type fakeBinary struct {
	path     string // the script
	requests string // FCFAKE_REQUESTS
	argv     string // FCFAKE_ARGV (or FCFAKE_JAILER_ARGV)
}

// shortTempDir returns a temporary directory with a short path (unix
// socket paths are limited), removed when t ends.
func shortTempDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func writeScript(t *testing.T, path string, env map[string]string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	for k, v := range env {
		fmt.Fprintf(&b, "export %s=%q\n", k, v)
	}
	fmt.Fprintf(&b, "exec %q \"$@\"\n", self)
	if err := os.WriteFile(path, []byte(b.String()), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
}

// newFakeFirecracker writes a script named firecracker that runs a fake
// firecracker with opts.
func newFakeFirecracker(t *testing.T, opts fakeOptions) *fakeBinary {
	t.Helper()
	dir := shortTempDir(t, "fcbin")
	b := &fakeBinary{path: filepath.Join(dir, "firecracker"), requests: filepath.Join(dir, "requests.jsonl"), argv: filepath.Join(dir, "argv.json")}
	env := map[string]string{"FCFAKE_MODE": "firecracker", "FCFAKE_REQUESTS": b.requests, "FCFAKE_ARGV": b.argv, "FCFAKE_VERSION": opts.version, "FCFAKE_SERIAL": opts.serial}
	if opts.ignoreTerm {
		env["FCFAKE_IGNORE_TERM"] = "1"
	}
	if opts.crash != "" {
		env["FCFAKE_CRASH"] = opts.crash
	}
	writeScript(t, b.path, env)
	return b
}

// newFakeJailer writes a script named jailer that runs a fake jailer.
func newFakeJailer(t *testing.T) *fakeBinary {
	t.Helper()
	dir := shortTempDir(t, "jlbin")
	b := &fakeBinary{path: filepath.Join(dir, "jailer"), argv: filepath.Join(dir, "argv.json")}
	writeScript(t, b.path, map[string]string{"FCFAKE_MODE": "jailer", "FCFAKE_JAILER_ARGV": b.argv})
	return b
}

// Requests returns what the fake received, in order, leaving out the
// readiness polls (GET /).
func (b *fakeBinary) Requests(t *testing.T) []fcapitest.Request {
	t.Helper()
	f, err := os.Open(b.requests)
	if err != nil {
		t.Fatalf("read fake requests: %v", err)
	}
	defer f.Close()
	var reqs []fcapitest.Request
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r fcapitest.Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("read fake requests: %v", err)
		}
		if r.Method == "GET" && r.Path == "/" {
			continue
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// ResetRequests forgets the requests seen so far. The file is truncated,
// not removed: a running fake appends to it.
func (b *fakeBinary) ResetRequests(t *testing.T) {
	t.Helper()
	if err := os.Truncate(b.requests, 0); err != nil && !os.IsNotExist(err) {
		t.Fatalf("reset fake requests: %v", err)
	}
}

// Invocation returns the argv and working directory the fake recorded.
func (b *fakeBinary) Invocation(t *testing.T) invocation {
	t.Helper()
	data, err := os.ReadFile(b.argv)
	if err != nil {
		t.Fatalf("read fake argv: %v", err)
	}
	var inv invocation
	if err := json.Unmarshal(data, &inv); err != nil {
		t.Fatalf("read fake argv: %v", err)
	}
	return inv
}
