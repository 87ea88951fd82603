package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"space/api"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeAPI is an API server that records the last request body and query
// of each route and replies with fixed objects.
type fakeAPI struct {
	url string

	mu sync.Mutex
	// +checklocks:mu
	bodies map[string][]byte // by route pattern
	// +checklocks:mu
	queries map[string]string // by route pattern
	// +checklocks:mu
	headers map[string]http.Header // by route pattern
}

func (f *fakeAPI) record(pattern string, r *http.Request) []byte {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bodies[pattern] = b
	f.queries[pattern] = r.URL.RawQuery
	f.headers[pattern] = r.Header.Clone()
	return b
}

// header returns the last request headers sent to pattern.
func (f *fakeAPI) header(pattern string) http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.headers[pattern]
}

// body returns the last body sent to pattern, decoded into v.
func (f *fakeAPI) body(t *testing.T, pattern string, v any) {
	t.Helper()
	f.mu.Lock()
	b := f.bodies[pattern]
	f.mu.Unlock()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("body of %s %q: %v", pattern, b, err)
	}
}

func (f *fakeAPI) query(pattern string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.queries[pattern]
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{bodies: map[string][]byte{}, queries: map[string]string{}, headers: map[string]http.Header{}}
	mux := http.NewServeMux()
	handle := func(pattern string, h func(w http.ResponseWriter, r *http.Request, body []byte)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer sk-test" {
				writeJSON(w, http.StatusUnauthorized, api.Error{Error: api.ErrorBody{Code: api.CodeUnauthenticated, Message: "bad key"}})
				return
			}
			h(w, r, f.record(pattern, r))
		})
	}
	sb := api.Sandbox{ID: "sb-1", Team: "t", Template: "default", State: "running", VCPUs: 1, MemoryMiB: 512,
		DiskMiB: 4096, CreatedAt: t0, UpdatedAt: t0}
	handle("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusCreated, sb)
	})
	handle("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: []api.Sandbox{sb}})
	})
	handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.PathValue("id") != "sb-1" {
			writeJSON(w, http.StatusNotFound, api.Error{Error: api.ErrorBody{Code: api.CodeNotFound, Message: "sandbox " + r.PathValue("id") + " not found"}})
			return
		}
		writeJSON(w, http.StatusOK, sb)
	})
	handle("POST /v1/sandboxes/{id}/timeout", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusOK, sb)
	})
	handle("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req api.Exec
		json.Unmarshal(body, &req)
		if req.Detach {
			writeJSON(w, http.StatusCreated, api.Process{ID: 5, PID: 99, Command: req.Command, Running: true, StartedAt: t0})
			return
		}
		// The last argument is the exit code.
		var code int
		fmt.Sscan(req.Command[len(req.Command)-1], &code)
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.Event{Type: api.EventStarted, Process: &api.Process{ID: 5}})
		enc.Encode(api.Event{Type: api.EventStdout, Data: []byte("to stdout\n")})
		enc.Encode(api.Event{Type: api.EventStderr, Data: []byte("to stderr\n")})
		enc.Encode(api.Event{Type: api.EventExit, Exit: &api.Exit{Code: code}})
	})
	handle("GET /v1/sandboxes/{id}/exec/ws", func(w http.ResponseWriter, r *http.Request, body []byte) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		ctx := r.Context()
		_, first, err := conn.Read(ctx)
		if err != nil {
			return
		}
		var req api.Exec
		json.Unmarshal(first, &req)
		f.mu.Lock()
		f.bodies["GET /v1/sandboxes/{id}/exec/ws"] = first
		f.mu.Unlock()
		if req.Command[0] != "cat" {
			// A command whose last argument is its exit code, with a line
			// on each output stream.
			var code int
			fmt.Sscan(req.Command[len(req.Command)-1], &code)
			conn.Write(ctx, websocket.MessageBinary, append([]byte{api.StreamStdout}, "to stdout\n"...))
			conn.Write(ctx, websocket.MessageBinary, append([]byte{api.StreamStderr}, "to stderr\n"...))
			ev, _ := json.Marshal(api.Event{Type: api.EventExit, Exit: &api.Exit{Code: code}})
			conn.Write(ctx, websocket.MessageText, ev)
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		// cat: echo stdin; at stdin_eof exit with code len(stdin) and
		// report whether a terminal was asked for.
		var n int
		for {
			typ, msg, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				n += len(msg) - 1
				conn.Write(ctx, websocket.MessageBinary, append([]byte{api.StreamStdout}, msg[1:]...))
				continue
			}
			var ctl api.Control
			json.Unmarshal(msg, &ctl)
			if ctl.Type == api.ControlStdinEOF {
				conn.Write(ctx, websocket.MessageBinary, fmt.Appendf([]byte{api.StreamStderr}, "tty %v", req.TTY != nil))
				ev, _ := json.Marshal(api.Event{Type: api.EventExit, Exit: &api.Exit{Code: n}})
				conn.Write(ctx, websocket.MessageText, ev)
				conn.Close(websocket.StatusNormalClosure, "")
				return
			}
		}
	})
	handle("GET /v1/sandboxes/{id}/processes", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusOK, api.ProcessList{Processes: []api.Process{
			{ID: 5, PID: 99, Command: []string{"sleep", "9"}, StartedAt: t0, Running: true},
			{ID: 6, PID: 100, Shell: "exit 2", StartedAt: t0, Exit: &api.Exit{Code: 2}},
		}})
	})
	handle("POST /v1/sandboxes/{id}/processes/{pid}/signal", func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.WriteHeader(http.StatusNoContent)
	})
	handle("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request, body []byte) {
		mode := "0600"
		if strings.HasPrefix(r.URL.Query().Get("path"), "/suid/") {
			mode = "6777" // what a guest file's mode may be
		}
		w.Header().Set("X-Space-File-Mode", mode)
		io.WriteString(w, "remote "+r.URL.Query().Get("path"))
	})
	handle("GET /v1/sandboxes/{id}/files/tar", func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(hostileTar)
	})
	handle("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusOK, api.FileWritten{Path: r.URL.Query().Get("path"), Size: int64(len(body))})
	})
	handle("GET /v1/sandboxes/{id}/files/watch", func(w http.ResponseWriter, r *http.Request, body []byte) {
		root := r.URL.Query().Get("path")
		entry := &api.FileInfo{Name: "a", Path: root + "/a", Type: "file", Size: 3}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.FileEvent{Type: api.FileEventStart, Path: root})
		enc.Encode(api.FileEvent{Type: api.FileEventCreate, Path: root + "/a", Name: "a", Entry: entry})
		enc.Encode(api.FileEvent{Type: api.FileEventWrite, Path: root + "/a", Name: "a", Entry: entry})
		enc.Encode(api.FileEvent{Type: api.FileEventOverflow})
		enc.Encode(api.FileEvent{Type: api.FileEventRemove, Path: root, Name: "."})
	})
	handle("GET /v1/events", func(w http.ResponseWriter, r *http.Request, body []byte) {
		evs := []api.LifecycleEvent{
			{ID: "evt_7", Cursor: "7", Time: t0, Type: "created", SandboxID: "sb-1", Team: "t", State: "creating", Actor: "api_key:k1", RequestID: "req_1"},
			{ID: "evt_8", Cursor: "8", Time: t0, Type: "failed", SandboxID: "sb-1", Team: "t", State: "failed", PreviousState: "creating", Actor: "leader:cp-1", Reason: "boot: no kernel"},
		}
		if r.URL.Query().Get("follow") == "true" {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range evs {
				b, _ := json.Marshal(e)
				fmt.Fprintf(w, ": keepalive\n\nid: %s\nevent: %s\ndata: %s\n\n", e.Cursor, e.Type, b)
			}
			return // the stream ends: the client says so
		}
		writeJSON(w, http.StatusOK, api.LifecycleEventList{Events: evs, Next: "8"})
	})
	handle("POST /v1/apikeys", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusCreated, api.APIKey{ID: "k2", Team: "t", CreatedAt: t0, Secret: "sk-secret"})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// apiEnv is the environment pointing the client verbs at f.
func (f *fakeAPI) env() map[string]string {
	return map[string]string{"SPACE_API_URL": f.url, "SPACE_API_KEY": "sk-test"}
}

func TestExecuteExitStatus(t *testing.T) {
	f := newFakeAPI(t)
	tests := []struct {
		name       string
		env        map[string]string
		args       []string
		want       int
		wantStdout string
		wantStderr string // a substring
	}{
		{"command succeeds", f.env(), []string{"exec", "sb-1", "--", "sh", "0"}, 0, "to stdout\n", "to stderr\n"},
		{"command fails", f.env(), []string{"exec", "sb-1", "--", "sh", "3"}, 3, "to stdout\n", "to stderr\n"},
		{"interactive", f.env(), []string{"exec", "-i", "sb-1", "--", "cat"}, 5, "hello", "tty false"},
		{"interactive on a terminal", f.env(), []string{"exec", "-it", "sb-1", "--", "cat"}, 5, "hello", "tty true"},
		{"not found", f.env(), []string{"sandbox", "get", "nope"}, exitFailure, "", "space: GET /v1/sandboxes/nope: sandbox nope not found"},
		{"bad key", map[string]string{"SPACE_API_URL": f.url, "SPACE_API_KEY": "wrong"}, []string{"sandbox", "ls"}, exitFailure, "", "bad key"},
		{"no key", map[string]string{"SPACE_API_URL": f.url}, []string{"sandbox", "ls"}, exitFailure, "",
			"space: no API key: set SPACE_API_KEY or start `space server`"},
		{"usage", f.env(), []string{"sandbox", "get"}, exitUsage, "", "Run 'space sandbox get --help' for usage."},
		{"server not wired", nil, []string{"server"}, exitFailure, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, stdout, stderr := newTestGlobals(t, tt.env)
			g.stdin = strings.NewReader("hello")
			if got := execute(t.Context(), g, tt.args); got != tt.want {
				t.Errorf("execute(%q) = %d, want %d (stderr %q)", tt.args, got, tt.want, stderr)
			}
			if got := stdout.String(); got != tt.wantStdout {
				t.Errorf("execute(%q) stdout = %q, want %q", tt.args, got, tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("execute(%q) stderr = %q, want it to contain %q", tt.args, stderr, tt.wantStderr)
			}
		})
	}
}

func TestSandboxCreateRequest(t *testing.T) {
	f := newFakeAPI(t)
	g, stdout, _ := newTestGlobals(t, f.env())
	args := []string{"sandbox", "create", "--template", "py", "--vcpus", "2", "--memory", "1024", "--disk", "8192",
		"--timeout", "90s", "--env", "A=1", "--env", "B=x=y", "--label", "team=ml"}
	if _, err := run(t.Context(), g, args); err != nil {
		t.Fatalf("run(%q) = %v", args, err)
	}
	var got api.CreateSandbox
	f.body(t, "POST /v1/sandboxes", &got)
	want := api.CreateSandbox{Template: "py", VCPUs: 2, MemoryMiB: 1024, DiskMiB: 8192, TimeoutSeconds: 90,
		Env: map[string]string{"A": "1", "B": "x=y"}, Labels: map[string]string{"team": "ml"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("create request differs (-want +got):\n%s", diff)
	}
	if got, want := stdout.String(), "sb-1\n"; got != want {
		t.Errorf("sandbox create printed %q, want %q", got, want)
	}
}

func TestSandboxTimeoutRequest(t *testing.T) {
	f := newFakeAPI(t)
	g, _, _ := newTestGlobals(t, f.env())
	if _, err := run(t.Context(), g, []string{"sandbox", "timeout", "sb-1", "90m"}); err != nil {
		t.Fatalf("run(sandbox timeout) = %v", err)
	}
	var got api.SetTimeout
	f.body(t, "POST /v1/sandboxes/{id}/timeout", &got)
	if got.TimeoutSeconds != 5400 {
		t.Errorf("sandbox timeout sent %+v, want 5400 s", got)
	}
	for _, bad := range []string{"soon", "500ms", "-1h"} {
		_, err := run(t.Context(), g, []string{"sandbox", "timeout", "sb-1", bad})
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("sandbox timeout %s = %v, want a usage error", bad, err)
		}
	}
}

func TestExecRequest(t *testing.T) {
	f := newFakeAPI(t)
	g, _, _ := newTestGlobals(t, f.env())
	args := []string{"exec", "sb-1", "--env", "A=1", "--cwd", "/tmp", "--user", "nobody", "--timeout", "1m",
		"--kill-on-disconnect", "--", "sh", "-c", "exit 0", "0"}
	if _, err := run(t.Context(), g, args); err != nil {
		t.Fatalf("run(%q) = %v", args, err)
	}
	var got api.Exec
	f.body(t, "GET /v1/sandboxes/{id}/exec/ws", &got)
	want := api.Exec{Command: []string{"sh", "-c", "exit 0", "0"}, Env: map[string]string{"A": "1"}, Cwd: "/tmp",
		User: "nobody", TimeoutSeconds: 60, KillOnDisconnect: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("exec request differs (-want +got):\n%s", diff)
	}
}

func TestSandboxListQuery(t *testing.T) {
	f := newFakeAPI(t)
	g, stdout, _ := newTestGlobals(t, f.env())
	g.now = func() time.Time { return t0.Add(5 * time.Minute) }
	if _, err := run(t.Context(), g, []string{"sandbox", "ls", "--state", "running", "--label", "b=2", "--label", "a=1"}); err != nil {
		t.Fatalf("run(sandbox ls) = %v", err)
	}
	if got, want := f.query("GET /v1/sandboxes"), "label=a%3D1&label=b%3D2&state=running"; got != want {
		t.Errorf("sandbox ls query = %q, want %q", got, want)
	}
	want := "ID    STATE    TEMPLATE  VCPUS  MEMORY  CREATED  EXPIRES  LABELS\n" +
		"sb-1  running  default   1      512MiB  5m ago            \n"
	if diff := cmp.Diff(want, stdout.String()); diff != "" {
		t.Errorf("sandbox ls table differs (-want +got):\n%s", diff)
	}
}

// TestJSONOutput checks that -o json prints the API's objects.
func TestJSONOutput(t *testing.T) {
	f := newFakeAPI(t)
	sb := api.Sandbox{ID: "sb-1", Team: "t", Template: "default", State: "running", VCPUs: 1, MemoryMiB: 512,
		DiskMiB: 4096, CreatedAt: t0, UpdatedAt: t0}
	tests := []struct {
		args []string
		got  func() any // a new value to decode the output into
		want any
	}{
		{[]string{"sandbox", "create", "-o", "json"}, func() any { return new(api.Sandbox) }, &sb},
		{[]string{"sandbox", "get", "sb-1", "-o", "json"}, func() any { return new(api.Sandbox) }, &sb},
		{[]string{"sandbox", "ls", "-o", "json"}, func() any { return new(api.SandboxList) },
			&api.SandboxList{Sandboxes: []api.Sandbox{sb}}},
		{[]string{"exec", "sb-1", "--detach", "-o", "json", "--", "sleep", "9"}, func() any { return new(api.Process) },
			&api.Process{ID: 5, PID: 99, Command: []string{"sleep", "9"}, Running: true, StartedAt: t0}},
		{[]string{"ps", "sb-1", "-o", "json"}, func() any { return new(api.ProcessList) },
			&api.ProcessList{Processes: []api.Process{
				{ID: 5, PID: 99, Command: []string{"sleep", "9"}, StartedAt: t0, Running: true},
				{ID: 6, PID: 100, Shell: "exit 2", StartedAt: t0, Exit: &api.Exit{Code: 2}},
			}}},
		{[]string{"events", "--json"}, func() any { return new(api.LifecycleEventList) },
			&api.LifecycleEventList{Next: "8", Events: []api.LifecycleEvent{
				{ID: "evt_7", Cursor: "7", Time: t0, Type: "created", SandboxID: "sb-1", Team: "t", State: "creating", Actor: "api_key:k1", RequestID: "req_1"},
				{ID: "evt_8", Cursor: "8", Time: t0, Type: "failed", SandboxID: "sb-1", Team: "t", State: "failed", PreviousState: "creating", Actor: "leader:cp-1", Reason: "boot: no kernel"},
			}}},
		{[]string{"apikey", "create", "-o", "json"}, func() any { return new(api.APIKey) },
			&api.APIKey{ID: "k2", Team: "t", CreatedAt: t0, Secret: "sk-secret"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:2], " "), func(t *testing.T) {
			g, stdout, _ := newTestGlobals(t, f.env())
			if _, err := run(t.Context(), g, tt.args); err != nil {
				t.Fatalf("run(%q) = %v", tt.args, err)
			}
			got := tt.got()
			dec := json.NewDecoder(stdout)
			dec.DisallowUnknownFields()
			if err := dec.Decode(got); err != nil {
				t.Fatalf("run(%q) printed %q: %v", tt.args, stdout, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("run(%q) output differs (-want +got):\n%s", tt.args, diff)
			}
		})
	}
}

func TestTextOutput(t *testing.T) {
	f := newFakeAPI(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"exec", "sb-1", "--detach", "--", "sleep", "9"}, "5\n"},
		{[]string{"ps", "sb-1"}, "ID  PID  STATUS      STARTED  TAG  COMMAND\n" +
			"5   99   running     1m ago   -    sleep 9\n" +
			"6   100  exited (2)  1m ago   -    exit 2\n"},
		{[]string{"kill", "sb-1", "5", "-s", "KILL"}, ""},
		{[]string{"file", "get", "sb-1", "/etc/hostname"}, "remote /etc/hostname"},
		{[]string{"file", "get", "sb-1", "/etc/hostname", "-"}, "remote /etc/hostname"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:2], " "), func(t *testing.T) {
			g, stdout, _ := newTestGlobals(t, f.env())
			g.now = func() time.Time { return t0.Add(time.Minute) }
			if _, err := run(t.Context(), g, tt.args); err != nil {
				t.Fatalf("run(%q) = %v", tt.args, err)
			}
			if diff := cmp.Diff(tt.want, stdout.String()); diff != "" {
				t.Errorf("run(%q) output differs (-want +got):\n%s", tt.args, diff)
			}
		})
	}
	var sig api.Signal
	f.body(t, "POST /v1/sandboxes/{id}/processes/{pid}/signal", &sig)
	if sig.Signal != 9 {
		t.Errorf("kill -s KILL sent signal %d, want 9", sig.Signal)
	}
}

func TestFileCopy(t *testing.T) {
	f := newFakeAPI(t)
	g, _, _ := newTestGlobals(t, f.env())
	dir := t.TempDir()
	local := filepath.Join(dir, "script.sh")
	if err := os.WriteFile(local, []byte("echo hi\n"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := run(t.Context(), g, []string{"file", "put", "sb-1", local, "/work/script.sh", "--mkdir"}); err != nil {
		t.Fatalf("file put = %v", err)
	}
	if got, want := f.query("PUT /v1/sandboxes/{id}/files"), "mkdir=true&mode=0755&path=%2Fwork%2Fscript.sh"; got != want {
		t.Errorf("file put query = %q, want %q", got, want)
	}
	if _, err := run(t.Context(), g, []string{"file", "get", "sb-1", "/etc/hosts", dir}); err != nil {
		t.Fatalf("file get = %v", err)
	}
	got := filepath.Join(dir, "hosts")
	b, err := os.ReadFile(got)
	if err != nil || string(b) != "remote /etc/hosts" {
		t.Errorf("file get wrote %q, %v; want %q", b, err, "remote /etc/hosts")
	}
	if fi, err := os.Stat(got); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file get made %s with mode %v (%v), want 0600", got, fi.Mode(), err)
	}
}

// TestFileWatch checks file watch prints a line per event and ends with
// the watched directory, and file put sends owner and metadata.
func TestFileWatch(t *testing.T) {
	f := newFakeAPI(t)
	g, stdout, _ := newTestGlobals(t, f.env())
	if _, err := run(t.Context(), g, []string{"file", "watch", "sb-1", "/work", "-r"}); err != nil {
		t.Fatalf("file watch = %v", err)
	}
	want := "create /work/a\nwrite /work/a\noverflow\nremove /work\n"
	if diff := cmp.Diff(want, stdout.String()); diff != "" {
		t.Errorf("file watch output differs (-want +got):\n%s", diff)
	}
	if got, want := f.query("GET /v1/sandboxes/{id}/files/watch"), "path=%2Fwork&recursive=true"; got != want {
		t.Errorf("file watch query = %q, want %q", got, want)
	}
	if _, err := run(t.Context(), g, []string{"file", "put", "sb-1", "-", "/work/x", "--owner", "user", "--metadata", "k=v=w"}); err != nil {
		t.Fatalf("file put = %v", err)
	}
	if got, want := f.query("PUT /v1/sandboxes/{id}/files"), "owner=user&path=%2Fwork%2Fx"; got != want {
		t.Errorf("file put query = %q, want %q", got, want)
	}
	if got := f.header("PUT /v1/sandboxes/{id}/files").Get(api.MetadataHeader + "k"); got != "v=w" {
		t.Errorf("file put metadata header k = %q, want %q", got, "v=w")
	}
}

func TestAPIEndpoint(t *testing.T) {
	tests := []struct {
		name       string
		env        map[string]string
		serverJSON string // or "" for none
		adminKey   string // or "" for none
		wantURL    string
		wantKey    string
		wantErr    string // a substring, or ""
	}{
		{name: "environment", env: map[string]string{"SPACE_API_URL": "http://h:1", "SPACE_API_KEY": "k"},
			serverJSON: `{"url":"http://other:2"}`, adminKey: "admin\n", wantURL: "http://h:1", wantKey: "k"},
		{name: "data dir", serverJSON: `{"url":"http://other:2"}`, adminKey: "admin\nignored\n",
			wantURL: "http://other:2", wantKey: "admin"},
		{name: "defaults", adminKey: "admin", wantURL: defaultAPIURL, wantKey: "admin"},
		{name: "no key", wantErr: "no API key: set SPACE_API_KEY or start `space server` (it writes "},
		{name: "empty key file", adminKey: "\n", wantErr: "is empty"},
		{name: "bad server.json", serverJSON: "{", adminKey: "k", wantErr: "server.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _, _ := newTestGlobals(t, tt.env)
			if tt.serverJSON != "" {
				if err := os.WriteFile(filepath.Join(g.dataDir, serverInfoFile), []byte(tt.serverJSON), 0o644); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			if tt.adminKey != "" {
				if err := os.WriteFile(filepath.Join(g.dataDir, adminKeyFile), []byte(tt.adminKey), 0o600); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			url, key, err := g.apiEndpoint()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("apiEndpoint() = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || url != tt.wantURL || key != tt.wantKey {
				t.Errorf("apiEndpoint() = %q, %q, %v; want %q, %q, nil", url, key, err, tt.wantURL, tt.wantKey)
			}
		})
	}
}

func TestDefaultDataDir(t *testing.T) {
	if os.Geteuid() == 0 {
		if got := defaultDataDir(); got != "/var/lib/space" {
			t.Errorf("defaultDataDir() as root = %q, want /var/lib/space", got)
		}
		return
	}
	t.Setenv("XDG_DATA_HOME", "/xdg")
	if got := defaultDataDir(); got != "/xdg/space" {
		t.Errorf("defaultDataDir() with XDG_DATA_HOME=/xdg = %q, want /xdg/space", got)
	}
	t.Setenv("XDG_DATA_HOME", "")
	t.Setenv("HOME", "/home/u")
	if got := defaultDataDir(); got != "/home/u/.local/share/space" {
		t.Errorf("defaultDataDir() with HOME=/home/u = %q, want /home/u/.local/share/space", got)
	}
}

// TestEventsVerb checks space events: its filters go to the query, the
// table shows each event's change and cause, and --follow prints the
// stream's events as they come (and says when the server ends it).
func TestEventsVerb(t *testing.T) {
	f := newFakeAPI(t)
	g, stdout, _ := newTestGlobals(t, f.env())
	g.now = func() time.Time { return t0.Add(time.Minute) }
	if _, err := run(t.Context(), g, []string{"events", "--sandbox", "sb-1", "--type", "created,failed", "--after", "6", "--limit", "5"}); err != nil {
		t.Fatalf("space events = %v", err)
	}
	if q := f.query("GET /v1/events"); q != "after=6&limit=5&sandbox=sb-1&type=created%2Cfailed" {
		t.Errorf("space events sent query %q", q)
	}
	out := stdout.String()
	for _, want := range []string{"CURSOR", "created", "creating", "creating->failed", "leader:cp-1", "boot: no kernel"} {
		if !strings.Contains(out, want) {
			t.Errorf("space events printed %q, want it to contain %q", out, want)
		}
	}
	g, stdout, _ = newTestGlobals(t, f.env())
	_, err := run(t.Context(), g, []string{"events", "--follow", "--json"})
	if err == nil || !strings.Contains(err.Error(), "ended the stream") {
		t.Errorf("space events --follow = %v, want the end of the stream reported", err)
	}
	var got []string
	dec := json.NewDecoder(stdout)
	for {
		var e api.LifecycleEvent
		if dec.Decode(&e) != nil {
			break
		}
		got = append(got, e.Cursor+" "+e.Type)
	}
	if diff := cmp.Diff([]string{"7 created", "8 failed"}, got); diff != "" {
		t.Errorf("space events --follow --json (-want +got):\n%s", diff)
	}
	if q := f.query("GET /v1/events"); q != "follow=true" {
		t.Errorf("space events --follow sent query %q", q)
	}
}
