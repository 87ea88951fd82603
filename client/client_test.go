package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"space/api"
)

const testKey = "sk-test"

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeServer plays the server side of every route, well enough to check
// what the client sends and that it decodes the replies.
func fakeServer(t *testing.T) *Client {
	t.Helper()
	mux := http.NewServeMux()
	h := func(pattern string, f http.HandlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if pattern != "GET /v1/health" && r.Header.Get("Authorization") != "Bearer "+testKey {
				writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "bad key", "")
				return
			}
			f(w, r)
		})
	}
	h("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.Health{Status: "ok", Version: "test"})
	})
	h("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandbox
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, err.Error(), "")
			return
		}
		if req.VCPUs > 8 {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "at most 8", "vcpus")
			return
		}
		writeJSON(w, http.StatusCreated, api.Sandbox{ID: "sb-1", Team: "t", Template: req.Template,
			State: "running", VCPUs: req.VCPUs, Labels: req.Labels, CreatedAt: t0, UpdatedAt: t0})
	})
	h("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		// Echo the filter in the reply so the test sees what was sent.
		q := r.URL.Query()
		writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: []api.Sandbox{
			{ID: "sb-1", State: q.Get("state"), Template: strings.Join(q["label"], ",")}}})
	})
	h("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "sb-1" {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "sandbox "+r.PathValue("id")+" not found", "")
			return
		}
		writeJSON(w, http.StatusOK, api.Sandbox{ID: "sb-1", State: "running", CreatedAt: t0, UpdatedAt: t0})
	})
	h("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	h("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		var req api.Exec
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, err.Error(), "")
			return
		}
		if req.Detach {
			writeJSON(w, http.StatusCreated, api.Process{ID: 7, PID: 100, Command: req.Command, Running: true, StartedAt: t0})
			return
		}
		streamNDJSON(w, r, r.PathValue("id"), req.Command)
	})
	h("GET /v1/sandboxes/{id}/processes", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.ProcessList{Processes: []api.Process{{ID: 7, PID: 100, StartedAt: t0}}})
	})
	h("GET /v1/sandboxes/{id}/processes/{pid}", func(w http.ResponseWriter, r *http.Request) {
		pid, _ := strconv.ParseInt(r.PathValue("pid"), 10, 64)
		writeJSON(w, http.StatusOK, api.Process{ID: pid, PID: 100, StartedAt: t0})
	})
	h("GET /v1/sandboxes/{id}/processes/{pid}/output", func(w http.ResponseWriter, r *http.Request) {
		streamNDJSON(w, r, r.PathValue("id"), nil)
	})
	h("POST /v1/sandboxes/{id}/processes/{pid}/signal", func(w http.ResponseWriter, r *http.Request) {
		var s api.Signal
		if err := json.NewDecoder(r.Body).Decode(&s); err != nil || s.Signal != 9 {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, fmt.Sprintf("want signal 9, got %d", s.Signal), "signal")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	h("GET /v1/sandboxes/{id}/exec/ws", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		_, msg, err := conn.Read(r.Context())
		if err != nil {
			return
		}
		var req api.Exec
		if err := json.Unmarshal(msg, &req); err != nil {
			conn.Close(websocket.StatusProtocolError, "first message is not an Exec")
			return
		}
		echoSession(r.Context(), conn, api.Process{ID: 8, Command: req.Command, TTY: req.TTY != nil}, r.PathValue("id"))
	})
	h("GET /v1/sandboxes/{id}/processes/{pid}/attach", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("pid") == "404" {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "no process 404", "")
			return
		}
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		pid, _ := strconv.ParseInt(r.PathValue("pid"), 10, 64)
		echoSession(r.Context(), conn, api.Process{ID: pid}, r.PathValue("id"))
	})
	h("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		content := "contents of " + r.URL.Query().Get("path")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set(FileModeHeader, "0750")
		if r.URL.Query().Get("path") == "/cut" {
			w.Header().Set("Content-Length", strconv.Itoa(len(content)+10))
		} else {
			w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		}
		io.WriteString(w, content)
	})
	h("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		b, _ := io.ReadAll(r.Body)
		// Report the query back through Path so the test can check it.
		writeJSON(w, http.StatusOK, api.FileWritten{
			Path: fmt.Sprintf("%s mode=%s mkdir=%s len=%d", q.Get("path"), q.Get("mode"), q.Get("mkdir"), r.ContentLength),
			Size: int64(len(b))})
	})
	h("DELETE /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("recursive") != "true" {
			writeError(w, http.StatusConflict, api.CodeFailedPrecondition, "directory not empty", "")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	h("GET /v1/sandboxes/{id}/files/list", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.FileList{Path: r.URL.Query().Get("path"),
			Entries: []api.FileInfo{{Name: "a", Type: "file", Size: 3, Mode: 0o644, ModTime: t0}}})
	})
	h("GET /v1/sandboxes/{id}/ports/{port}", func(w http.ResponseWriter, r *http.Request) {
		port, err := strconv.Atoi(r.PathValue("port"))
		if err != nil || port < 1 || port > 65535 {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "want a TCP port 1..65535", "port")
			return
		}
		writeJSON(w, http.StatusOK, api.PortState{Port: port, Open: port == 8080})
	})
	h("POST /v1/apikeys", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateAPIKey
		json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, http.StatusCreated, api.APIKey{ID: "k1", Team: req.Team, Name: req.Name, Admin: req.Admin,
			CreatedAt: t0, Secret: "sk-new"})
	})
	h("GET /v1/apikeys", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.APIKeyList{Keys: []api.APIKey{{ID: "k1", Team: r.URL.Query().Get("team"), CreatedAt: t0}}})
	})
	h("DELETE /v1/apikeys/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	h("GET /v1/quota", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.QuotaUsage{Limits: api.Quota{Sandboxes: 10}, Used: api.Quota{Sandboxes: 1}})
	})
	h("GET /v1/badgateway", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream down", http.StatusBadGateway)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL+"/", testKey)
	if err != nil {
		t.Fatalf("setup: New(%q) = %v", srv.URL, err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg, field string) {
	writeJSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: msg, Field: field}})
}

// streamNDJSON plays an exec or output stream; the sandbox ID picks the
// ending: "cut" ends without an exit event, "fail" with an error event,
// "hang" waits for the client to go away, anything else exits with code 3.
func streamNDJSON(w http.ResponseWriter, r *http.Request, id string, argv []string) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	send := func(ev api.Event) {
		enc.Encode(ev)
		w.(http.Flusher).Flush()
	}
	send(api.Event{Type: api.EventStarted, Process: &api.Process{ID: 7, Command: argv}})
	send(api.Event{Type: api.EventStdout, Data: []byte("out1 " + strings.Join(argv, " ") + "\n")})
	send(api.Event{Type: api.EventStderr, Data: []byte{0, 0xff, '\n'}})
	send(api.Event{Type: api.EventStdout, Data: []byte("out2\n")})
	switch id {
	case "cut":
	case "fail":
		send(api.Event{Type: api.EventError, Error: &api.ErrorBody{Code: api.CodeUnavailable, Message: "agent went away"}})
	case "hang":
		<-r.Context().Done()
	default:
		send(api.Event{Type: api.EventExit, Exit: &api.Exit{Code: 3}})
	}
}

// echoSession plays a WebSocket session: stdin comes back as stdout,
// resizes and signals are reported on stderr, and stdin_eof ends the
// command with code 0. Sandbox "cut" drops the connection after started.
func echoSession(ctx context.Context, conn *websocket.Conn, p api.Process, id string) {
	sendEvent := func(ev api.Event) error {
		b, _ := json.Marshal(ev)
		return conn.Write(ctx, websocket.MessageText, b)
	}
	if sendEvent(api.Event{Type: api.EventStarted, Process: &p}) != nil {
		return
	}
	if id == "cut" {
		conn.CloseNow()
		return
	}
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if len(msg) > 0 && msg[0] == api.StreamStdin {
				conn.Write(ctx, websocket.MessageBinary, append([]byte{api.StreamStdout}, msg[1:]...))
			}
			continue
		}
		var ctl api.Control
		json.Unmarshal(msg, &ctl)
		switch ctl.Type {
		case api.ControlResize:
			conn.Write(ctx, websocket.MessageBinary, fmt.Appendf([]byte{api.StreamStderr}, "resize %dx%d\n", ctl.Rows, ctl.Cols))
		case api.ControlStdinEOF:
			sendEvent(api.Event{Type: api.EventExit, Exit: &api.Exit{Code: 0}})
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		url     string
		wantErr bool
	}{
		{"http://127.0.0.1:7070", false},
		{"https://space.example/prefix/", false},
		{"127.0.0.1:7070", true},
		{"ftp://x", true},
		{"http://", true},
	}
	for _, tt := range tests {
		_, err := New(tt.url, "k")
		if (err != nil) != tt.wantErr {
			t.Errorf("New(%q) = %v, want error %v", tt.url, err, tt.wantErr)
		}
	}
}

func TestJSONRoutes(t *testing.T) {
	c := fakeServer(t)
	ctx := t.Context()
	tests := []struct {
		name string
		call func() (any, error)
		want any
	}{
		{"health", func() (any, error) { return c.Health(ctx) }, api.Health{Status: "ok", Version: "test"}},
		{"create sandbox", func() (any, error) {
			return c.CreateSandbox(ctx, api.CreateSandbox{Template: "py", VCPUs: 2, Labels: map[string]string{"a": "b"}})
		}, api.Sandbox{ID: "sb-1", Team: "t", Template: "py", State: "running", VCPUs: 2,
			Labels: map[string]string{"a": "b"}, CreatedAt: t0, UpdatedAt: t0}},
		{"list sandboxes", func() (any, error) {
			return c.Sandboxes(ctx, ListOptions{State: "running", Labels: map[string]string{"z": "1", "a": "x=y"}})
		}, []api.Sandbox{{ID: "sb-1", State: "running", Template: "a=x=y,z=1"}}},
		{"get sandbox", func() (any, error) { return c.Sandbox(ctx, "sb-1") },
			api.Sandbox{ID: "sb-1", State: "running", CreatedAt: t0, UpdatedAt: t0}},
		{"delete sandbox", func() (any, error) { return nil, c.DeleteSandbox(ctx, "sb-1") }, nil},
		{"start detached", func() (any, error) { return c.StartDetached(ctx, "sb-1", api.Exec{Command: []string{"sleep", "9"}}) },
			api.Process{ID: 7, PID: 100, Command: []string{"sleep", "9"}, Running: true, StartedAt: t0}},
		{"processes", func() (any, error) { return c.Processes(ctx, "sb-1") },
			[]api.Process{{ID: 7, PID: 100, StartedAt: t0}}},
		{"process", func() (any, error) { return c.Process(ctx, "sb-1", 42) }, api.Process{ID: 42, PID: 100, StartedAt: t0}},
		{"signal", func() (any, error) { return nil, c.Signal(ctx, "sb-1", 7, 9) }, nil},
		{"write file", func() (any, error) {
			return c.WriteFile(ctx, "sb-1", "/a/b", strings.NewReader("hello"), WriteOptions{Mode: 0o755, Mkdir: true})
		}, api.FileWritten{Path: "/a/b mode=0755 mkdir=true len=5", Size: 5}},
		{"write file with defaults", func() (any, error) {
			return c.WriteFile(ctx, "sb-1", "/a", strings.NewReader(""), WriteOptions{})
		}, api.FileWritten{Path: "/a mode= mkdir= len=0", Size: 0}},
		{"remove file", func() (any, error) { return nil, c.RemoveFile(ctx, "sb-1", "/d", RemoveOptions{Recursive: true}) }, nil},
		{"list files", func() (any, error) { return c.ListFiles(ctx, "sb-1", "/d") },
			api.FileList{Path: "/d", Entries: []api.FileInfo{{Name: "a", Type: "file", Size: 3, Mode: 0o644, ModTime: t0}}}},
		{"open port", func() (any, error) { return c.PortOpen(ctx, "sb-1", 8080) }, true},
		{"closed port", func() (any, error) { return c.PortOpen(ctx, "sb-1", 9) }, false},
		{"create api key", func() (any, error) { return c.CreateAPIKey(ctx, api.CreateAPIKey{Name: "ci", Team: "t2", Admin: true}) },
			api.APIKey{ID: "k1", Team: "t2", Name: "ci", Admin: true, CreatedAt: t0, Secret: "sk-new"}},
		{"list api keys", func() (any, error) { return c.APIKeys(ctx, "t2") },
			[]api.APIKey{{ID: "k1", Team: "t2", CreatedAt: t0}}},
		{"delete api key", func() (any, error) { return nil, c.DeleteAPIKey(ctx, "k1") }, nil},
		{"quota", func() (any, error) { return c.Quota(ctx) },
			api.QuotaUsage{Limits: api.Quota{Sandboxes: 10}, Used: api.Quota{Sandboxes: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.call()
			if err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("%s: reply differs (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	c := fakeServer(t)
	ctx := t.Context()
	bad, err := New(c.base.String(), "wrong")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	tests := []struct {
		name string
		err  error
		want *Error
	}{
		{"not found", func() error { _, err := c.Sandbox(ctx, "nope"); return err }(),
			&Error{Status: 404, Code: api.CodeNotFound, Message: "sandbox nope not found"}},
		{"field", func() error { _, err := c.CreateSandbox(ctx, api.CreateSandbox{VCPUs: 99}); return err }(),
			&Error{Status: 400, Code: api.CodeInvalidArgument, Message: "at most 8", Field: "vcpus"}},
		{"bad port", func() error { _, err := c.PortOpen(ctx, "sb-1", 70000); return err }(),
			&Error{Status: 400, Code: api.CodeInvalidArgument, Message: "want a TCP port 1..65535", Field: "port"}},
		{"bad key", func() error { _, err := bad.Quota(ctx); return err }(),
			&Error{Status: 401, Code: api.CodeUnauthenticated, Message: "bad key"}},
		{"conflict", c.RemoveFile(ctx, "sb-1", "/d", RemoveOptions{}),
			&Error{Status: 409, Code: api.CodeFailedPrecondition, Message: "directory not empty"}},
		{"not json", c.call(ctx, request{method: http.MethodGet, path: "/v1/badgateway"}, nil),
			&Error{Status: 502, Code: api.CodeUnavailable, Message: "upstream down"}},
		{"websocket handshake", func() error { _, err := c.Attach(ctx, "sb-1", 404, StreamIO{}); return err }(),
			&Error{Status: 404, Code: api.CodeNotFound, Message: "no process 404"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got *Error
			if !errors.As(tt.err, &got) {
				t.Fatalf("error = %v (%T), want an *Error", tt.err, tt.err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("*Error differs (-want +got):\n%s", diff)
			}
		})
	}
	_, err = c.Sandbox(ctx, "nope")
	if !IsNotFound(err) {
		t.Errorf("IsNotFound(%v) = false, want true", err)
	}
	if IsNotFound(errors.New("x")) || IsNotFound(nil) {
		t.Errorf("IsNotFound(plain error or nil) = true, want false")
	}
	if got, want := err.Error(), "GET /v1/sandboxes/nope: sandbox nope not found (not_found, HTTP 404)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestReadFile(t *testing.T) {
	c := fakeServer(t)
	var buf bytes.Buffer
	mode, err := c.ReadFile(t.Context(), "sb-1", "/etc/x", &buf)
	if err != nil {
		t.Fatalf("ReadFile = %v", err)
	}
	if got, want := buf.String(), "contents of /etc/x"; got != want {
		t.Errorf("ReadFile wrote %q, want %q", got, want)
	}
	if mode != fs.FileMode(0o750) {
		t.Errorf("ReadFile mode = %v, want 0750", mode)
	}
	if _, err := c.ReadFile(t.Context(), "sb-1", "/cut", io.Discard); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("ReadFile(short body) = %v, want io.ErrUnexpectedEOF", err)
	}
}

// TestExecEvents reads the NDJSON event stream (POST exec); Exec itself
// goes over the WebSocket (TestExecStream and the real-VM tests).
func TestExecEvents(t *testing.T) {
	c := fakeServer(t)
	var stdout, stderr bytes.Buffer
	exit, err := c.ExecEvents(t.Context(), "sb-1", api.Exec{Command: []string{"echo", "hi"}}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("Exec = %v", err)
	}
	if diff := cmp.Diff(api.Exit{Code: 3}, exit); diff != "" {
		t.Errorf("Exec exit differs (-want +got):\n%s", diff)
	}
	if got, want := stdout.String(), "out1 echo hi\nout2\n"; got != want {
		t.Errorf("Exec stdout = %q, want %q", got, want)
	}
	if got, want := stderr.Bytes(), []byte{0, 0xff, '\n'}; !bytes.Equal(got, want) {
		t.Errorf("Exec stderr = %q, want %q", got, want)
	}
	if _, err := c.ExecEvents(t.Context(), "sb-1", api.Exec{Detach: true}, nil, nil); err == nil {
		t.Errorf("ExecEvents(detach) = nil error, want one pointing at StartDetached")
	}
	if _, err := c.Exec(t.Context(), "sb-1", api.Exec{Detach: true}, nil, nil); err == nil {
		t.Errorf("Exec(detach) = nil error, want one pointing at StartDetached")
	}
}

func TestStreamEndings(t *testing.T) {
	c := fakeServer(t)
	tests := []struct {
		sandbox string
		check   func(error) bool
		want    string
	}{
		{"cut", func(err error) bool { return errors.Is(err, ErrStreamCut) }, "ErrStreamCut"},
		{"fail", func(err error) bool {
			var e *Error
			return errors.As(err, &e) && e.Code == api.CodeUnavailable && e.Message == "agent went away"
		}, "an *Error unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.sandbox, func(t *testing.T) {
			var stdout bytes.Buffer
			_, err := c.ExecEvents(t.Context(), tt.sandbox, api.Exec{Command: []string{"x"}}, &stdout, nil)
			if !tt.check(err) {
				t.Errorf("Exec = %v, want %s", err, tt.want)
			}
			if got, want := stdout.String(), "out1 x\nout2\n"; got != want {
				t.Errorf("Exec stdout = %q, want %q (output before the end is delivered)", got, want)
			}
			if _, err := c.Output(t.Context(), tt.sandbox, 7, nil, nil); !tt.check(err) {
				t.Errorf("Output = %v, want %s", err, tt.want)
			}
		})
	}
}

func TestOutput(t *testing.T) {
	c := fakeServer(t)
	var stdout bytes.Buffer
	exit, err := c.Output(t.Context(), "sb-1", 7, &stdout, nil)
	if err != nil || exit.Code != 3 {
		t.Fatalf("Output = %+v, %v; want exit code 3", exit, err)
	}
	if got, want := stdout.String(), "out1 \nout2\n"; got != want {
		t.Errorf("Output stdout = %q, want %q", got, want)
	}
}

func TestExecCanceled(t *testing.T) {
	c := fakeServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	// cancelOnWrite cancels once output arrives, while the server streams on.
	w := writerFunc(func(b []byte) (int, error) { cancel(); return len(b), nil })
	_, err := c.ExecEvents(ctx, "hang", api.Exec{Command: []string{"x"}}, w, nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ExecEvents(canceled) = %v, want context.Canceled", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestExecStream(t *testing.T) {
	c := fakeServer(t)
	resize := make(chan api.WinSize, 1)
	resize <- api.WinSize{Rows: 40, Cols: 100}
	// Stdin arrives only after the resize went through, so the order of
	// the echoed output is fixed.
	pr, pw := io.Pipe()
	var stdout bytes.Buffer
	var once sync.Once
	stderr := writerFunc(func(b []byte) (int, error) {
		once.Do(func() {
			go func() {
				io.WriteString(pw, "hello\n")
				pw.Close()
			}()
		})
		return len(b), nil
	})
	var gotStderr bytes.Buffer
	exit, err := c.ExecStream(t.Context(), "sb-1", api.Exec{Command: []string{"cat"}, TTY: &api.WinSize{Rows: 24, Cols: 80}},
		StreamIO{Stdin: pr, Stdout: &stdout, Stderr: io.MultiWriter(&gotStderr, stderr), Resize: resize})
	if err != nil {
		t.Fatalf("ExecStream = %v", err)
	}
	if exit.Code != 0 {
		t.Errorf("ExecStream exit = %+v, want code 0", exit)
	}
	if got, want := stdout.String(), "hello\n"; got != want {
		t.Errorf("ExecStream stdout = %q, want %q", got, want)
	}
	if got, want := gotStderr.String(), "resize 40x100\n"; got != want {
		t.Errorf("ExecStream stderr = %q, want %q", got, want)
	}
}

func TestExecStreamNoStdin(t *testing.T) {
	c := fakeServer(t)
	// Without stdin the client sends stdin_eof at once, which ends the
	// fake's command.
	exit, err := c.ExecStream(t.Context(), "sb-1", api.Exec{Command: []string{"true"}}, StreamIO{})
	if err != nil || exit.Code != 0 {
		t.Errorf("ExecStream(no stdin) = %+v, %v; want code 0", exit, err)
	}
}

func TestAttach(t *testing.T) {
	c := fakeServer(t)
	var stdout bytes.Buffer
	exit, err := c.Attach(t.Context(), "sb-1", 7, StreamIO{Stdin: strings.NewReader("again\n"), Stdout: &stdout})
	if err != nil || exit.Code != 0 {
		t.Fatalf("Attach = %+v, %v; want code 0", exit, err)
	}
	if got, want := stdout.String(), "again\n"; got != want {
		t.Errorf("Attach stdout = %q, want %q", got, want)
	}
	if _, err := c.Attach(t.Context(), "cut", 7, StreamIO{}); !errors.Is(err, ErrStreamCut) {
		t.Errorf("Attach(connection dropped) = %v, want ErrStreamCut", err)
	}
}
