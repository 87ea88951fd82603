package worker

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"space/api"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/httpapi"
)

// maxWSMessage bounds one WebSocket message from a client.
const maxWSMessage = 1 << 20

// procStart turns an API exec request into the agent's, with the
// sandbox's environment under the request's.
func (w *Worker) procStart(ctx context.Context, a *client.Client, id string, req api.Exec) (proto.ProcStart, error) {
	var ps proto.ProcStart
	switch {
	case len(req.Command) > 0 && req.Shell != "":
		return ps, httpapi.Invalid("command", "give command or shell, not both")
	case len(req.Command) == 0 && req.Shell == "":
		return ps, httpapi.Invalid("command", "give a command (argv) or a shell string")
	case len(req.Command) > 0 && req.Command[0] == "":
		return ps, httpapi.Invalid("command", "empty program name")
	case req.TimeoutSeconds < 0:
		return ps, httpapi.Invalid("timeout_seconds", "negative")
	case req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0):
		return ps, httpapi.Invalid("tty", "rows and cols must be positive")
	case req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/"):
		return ps, httpapi.Invalid("cwd", "want an absolute path")
	}
	if err := proto.CheckProcTag(req.Tag); err != nil {
		return ps, &httpapi.FieldError{Field: "tag", Err: err}
	}
	s, err := w.get(id)
	if err != nil {
		return ps, err
	}
	s.mu.Lock()
	env := map[string]string{}
	if len(s.rec.Spec.Secrets) > 0 {
		env = secretEnv(s.rec.Spec)
	}
	for k, v := range s.rec.Spec.Env {
		env[k] = v
	}
	req.Cwd = cmp.Or(req.Cwd, s.rec.Spec.Workdir)
	req.User = cmp.Or(req.User, s.rec.Spec.User)
	s.mu.Unlock()
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return ps, httpapi.Invalid("env", "variable name %.64q", k)
		}
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ps.Env = append(ps.Env, k+"="+env[k])
	}
	ps.Argv, ps.Shell, ps.Cwd = req.Command, req.Shell, req.Cwd
	ps.TimeoutMS = req.TimeoutSeconds * 1000
	ps.KillOnDetach = req.KillOnDisconnect
	ps.Tag = req.Tag
	if req.TTY != nil {
		ps.PTY = &proto.WinSize{Rows: req.TTY.Rows, Cols: req.TTY.Cols}
	}
	if req.User != "" && req.User != "root" {
		u, err := lookupUser(ctx, a, req.User)
		if err != nil {
			return ps, err
		}
		ps.UID, ps.GID = &u.uid, &u.gid
		// A login's variables, unless the sandbox or the request set them.
		for _, kv := range [][2]string{{"HOME", u.home}, {"LOGNAME", u.name}, {"USER", u.name}} {
			if _, set := env[kv[0]]; !set && kv[1] != "" {
				ps.Env = append(ps.Env, kv[0]+"="+kv[1])
			}
		}
	}
	return ps, nil
}

// guestUser is a user of the guest's /etc/passwd.
type guestUser struct {
	name     string
	uid, gid uint32
	home     string
}

// lookupUser resolves a user name (or numeric uid) in the guest's
// /etc/passwd.
func lookupUser(ctx context.Context, a *client.Client, user string) (guestUser, error) {
	if n, err := strconv.ParseUint(user, 10, 32); err == nil {
		return guestUser{uid: uint32(n), gid: uint32(n)}, nil
	}
	var buf limitedBuffer
	buf.max = 1 << 20
	if _, err := a.ReadFile(ctx, "/etc/passwd", &buf); err != nil {
		return guestUser{}, fmt.Errorf("look up user %.32q: %w", user, err)
	}
	sc := bufio.NewScanner(&buf.b)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 4 || f[0] != user {
			continue
		}
		u, err1 := strconv.ParseUint(f[2], 10, 32)
		g, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 == nil && err2 == nil {
			gu := guestUser{name: user, uid: uint32(u), gid: uint32(g)}
			if len(f) > 5 {
				gu.home = f[5]
			}
			return gu, nil
		}
	}
	return guestUser{}, httpapi.Invalid("user", "no user %.32q in the sandbox", user)
}

type limitedBuffer struct {
	b   bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.b.Len()+len(p) > l.max {
		return 0, fmt.Errorf("more than %d bytes: %w", l.max, errkind.ResourceExhausted)
	}
	return l.b.Write(p)
}

func processView(p proto.ProcInfo) api.Process {
	v := api.Process{
		ID: p.ID, PID: p.PID, Command: p.Argv, Shell: p.Shell, Cwd: p.Cwd, TTY: p.PTY, Tag: p.Tag,
		StartedAt: time.UnixMilli(p.StartedUnixMS).UTC(), Running: p.Running,
		Attached: p.Attached, DroppedBytes: p.DroppedBytes,
	}
	if p.Exit != nil {
		v.Exit = &api.Exit{Code: p.Exit.Code, Signal: p.Exit.Signal, TimedOut: p.Exit.TimedOut}
	}
	return v
}

func exitView(e proto.Exit) *api.Exit {
	return &api.Exit{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut}
}

// ndjson writes events as lines, flushing each.
type ndjson struct {
	started chan struct{} // closed once the started (or error) event is out

	mu sync.Mutex
	// +checklocks:mu
	rw http.ResponseWriter
	// +checklocks:mu
	rc *http.ResponseController
	// +checklocks:mu
	err error
}

func newNDJSON(rw http.ResponseWriter) *ndjson {
	rw.Header().Set("Content-Type", "application/x-ndjson")
	rw.Header().Set("Cache-Control", "no-store")
	rw.WriteHeader(http.StatusOK)
	n := &ndjson{started: make(chan struct{})}
	n.mu.Lock()
	n.rw, n.rc = rw, http.NewResponseController(rw)
	n.mu.Unlock()
	return n
}

func (n *ndjson) send(ev api.Event) error { return n.sendJSON(ev) }

// sendJSON writes v as one line.
func (n *ndjson) sendJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	if _, err := n.rw.Write(append(b, '\n')); err != nil {
		n.err = err
		return err
	}
	if err := n.rc.Flush(); err != nil {
		n.err = err
	}
	return n.err
}

// eventWriter turns output writes into events of one type.
type eventWriter struct {
	started <-chan struct{} // output waits until the started event is out
	send    func(api.Event) error
	typ     api.EventType
}

func (e eventWriter) Write(p []byte) (int, error) {
	<-e.started
	if err := e.send(api.Event{Type: e.typ, Data: bytes.Clone(p)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// io returns the process IO that turns output into events.
func (n *ndjson) io(stdin io.Reader) client.IO {
	return client.IO{
		Stdin:  stdin,
		Stdout: eventWriter{n.started, n.send, api.EventStdout},
		Stderr: eventWriter{n.started, n.send, api.EventStderr},
	}
}

// follow streams an attached process to its end: started, its output (as
// the writers send it), then exit or error.
func (n *ndjson) follow(p *client.Process, info proto.ProcInfo, err error, wait waitFunc) {
	if err != nil {
		close(n.started)
		body := httpapi.Body(err)
		n.send(api.Event{Type: api.EventError, Error: &body})
		return
	}
	pv := processView(info)
	n.send(api.Event{Type: api.EventStarted, Process: &pv})
	close(n.started)
	exit, err := wait(p, info)
	if err != nil {
		body := httpapi.Body(err)
		n.send(api.Event{Type: api.EventError, Error: &body})
		return
	}
	n.send(api.Event{Type: api.EventExit, Exit: exitView(exit)})
}

func (w *Worker) handleExec(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	var req api.Exec
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.TTY != nil {
		return httpapi.Invalid("tty", "a terminal needs the WebSocket route (exec/ws)")
	}
	if req.Detach && len(req.Stdin) > 0 {
		return httpapi.Invalid("stdin", "a detached command gets no stdin here; attach to feed it")
	}
	ps, err := w.procStart(r.Context(), a, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	if req.Detach {
		info, err := a.StartProcess(r.Context(), ps)
		if err != nil {
			return err
		}
		httpapi.WriteJSON(rw, http.StatusCreated, processView(info))
		return nil
	}
	var stdin io.Reader
	if len(req.Stdin) > 0 {
		stdin = bytes.NewReader(req.Stdin)
	}
	// Headers go out before the process starts, so its first output
	// cannot race them; a failed start is then an error event.
	n := newNDJSON(rw)
	started := time.Now()
	p, info, err := a.StartAttached(r.Context(), ps, n.io(stdin))
	n.follow(p, info, err, execWait(a, req.TimeoutSeconds))
	w.execEnded(r.PathValue("id"), req, started, err)
	return nil
}

// processRef returns the process named in the path, which must exist.
func processRef(r *http.Request, a *client.Client) (proto.ProcInfo, error) {
	id, err := strconv.ParseInt(r.PathValue("pid"), 10, 64)
	if err != nil || id < 1 {
		return proto.ProcInfo{}, fmt.Errorf("process %.32q: %w", r.PathValue("pid"), errkind.NotFound)
	}
	all, err := a.Processes(r.Context())
	if err != nil {
		return proto.ProcInfo{}, err
	}
	for _, p := range all {
		if p.ID == id {
			return p, nil
		}
	}
	return proto.ProcInfo{}, fmt.Errorf("process %d: %w", id, errkind.NotFound)
}

// attachFunc is how a request attaches to a process of the table.
type attachFunc func(context.Context, int64, client.IO) (*client.Process, proto.ProcInfo, error)

// attacher returns how the request attaches: alongside the process's live
// attachment with ?share=true, taking over from it otherwise.
func attacher(r *http.Request, a *client.Client) (attachFunc, error) {
	switch v := r.URL.Query().Get("share"); v {
	case "", "false":
		return a.Attach, nil
	case "true":
		return a.AttachShared, nil
	default:
		return nil, fmt.Errorf("share=%.32q: want true or false: %w", v, errkind.InvalidArgument)
	}
}

func handleOutput(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	attach, err := attacher(r, a)
	if err != nil {
		return err
	}
	// Check the process exists before committing to a 200 stream.
	ref, err := processRef(r, a)
	if err != nil {
		return err
	}
	n := newNDJSON(rw)
	p, info, err := attach(r.Context(), ref.ID, n.io(nil))
	n.follow(p, info, err, attachedWait)
	return nil
}

func handleProcesses(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	all, err := a.Processes(r.Context())
	if err != nil {
		return err
	}
	out := api.ProcessList{Processes: make([]api.Process, 0, len(all))}
	for _, p := range all {
		out.Processes = append(out.Processes, processView(p))
	}
	httpapi.WriteJSON(rw, http.StatusOK, out)
	return nil
}

func handleProcess(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	p, err := processRef(r, a)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, processView(p))
	return nil
}

func handleSignal(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	var req api.Signal
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if req.Signal < 1 || req.Signal > 64 {
		return httpapi.Invalid("signal", "%d is outside 1..64", req.Signal)
	}
	p, err := processRef(r, a)
	if err != nil {
		return err
	}
	if err := a.SignalProcess(r.Context(), p.ID, req.Signal); err != nil {
		return err
	}
	rw.WriteHeader(http.StatusNoContent)
	return nil
}

// handleExecWS runs a command over a WebSocket: the client's first
// message is the api.Exec.
func (w *Worker) handleExecWS(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	c, err := websocket.Accept(rw, r, nil)
	if err != nil {
		return nil // Accept answered the client
	}
	defer c.CloseNow()
	c.SetReadLimit(maxWSMessage)
	ctx := r.Context()
	typ, msg, err := c.Read(ctx)
	if err != nil {
		return nil
	}
	var req api.Exec
	if typ != websocket.MessageText {
		err = httpapi.Invalid("exec", "the first message must be a JSON exec request")
	} else {
		err = decodeStrict(msg, &req)
	}
	var ps proto.ProcStart
	if err == nil {
		if req.Detach || len(req.Stdin) > 0 {
			err = httpapi.Invalid("exec", "detach and stdin are not for the WebSocket route (stream stdin instead)")
		} else {
			ps, err = w.procStart(ctx, a, r.PathValue("id"), req)
		}
	}
	if err != nil {
		wsFail(ctx, c, err)
		return nil
	}
	ws := newWSSession(ctx, c)
	started := time.Now()
	p, info, err := a.StartAttached(ctx, ps, ws.io())
	ws.follow(p, info, err, execWait(a, req.TimeoutSeconds))
	w.execEnded(r.PathValue("id"), req, started, err)
	return nil
}

// execEnded records on sandbox id that an attached command which started
// (startErr nil) ended now.
func (w *Worker) execEnded(id string, req api.Exec, started time.Time, startErr error) {
	if startErr != nil {
		return
	}
	if s, err := w.get(id); err == nil {
		s.execEnded(req, started)
	}
}

// handleAttachWS attaches a WebSocket to a running process.
func handleAttachWS(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	attach, err := attacher(r, a)
	if err != nil {
		return err
	}
	ref, err := processRef(r, a)
	if err != nil {
		return err
	}
	c, err := websocket.Accept(rw, r, nil)
	if err != nil {
		return nil
	}
	defer c.CloseNow()
	c.SetReadLimit(maxWSMessage)
	ws := newWSSession(r.Context(), c)
	p, info, err := attach(r.Context(), ref.ID, ws.io())
	ws.follow(p, info, err, attachedWait)
	return nil
}

// wsFail sends an error event and closes the WebSocket.
func wsFail(ctx context.Context, c *websocket.Conn, err error) {
	body := httpapi.Body(err)
	b, _ := json.Marshal(api.Event{Type: api.EventError, Error: &body})
	c.Write(ctx, websocket.MessageText, b)
	c.Close(websocket.StatusNormalClosure, "")
}

// wsSession connects one WebSocket to one attached process.
type wsSession struct {
	ctx     context.Context
	c       *websocket.Conn
	stdin   *inputPipe
	started chan struct{} // closed once the started (or error) event is out
}

// wsStdinBuffer is how much of a client's stdin a session holds ahead of
// the process: enough for a few ring slots' worth of its messages.
const wsStdinBuffer = 1 << 20

func newWSSession(ctx context.Context, c *websocket.Conn) *wsSession {
	return &wsSession{ctx: ctx, c: c, stdin: newInputPipe(wsStdinBuffer), started: make(chan struct{})}
}

// wsWriter sends output as binary messages prefixed by the stream byte.
type wsWriter struct {
	s      *wsSession
	stream byte
}

func (ww wsWriter) Write(p []byte) (int, error) {
	<-ww.s.started
	msg := make([]byte, 1+len(p))
	msg[0] = ww.stream
	copy(msg[1:], p)
	if err := ww.s.c.Write(ww.s.ctx, websocket.MessageBinary, msg); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *wsSession) io() client.IO {
	return client.IO{Stdin: s.stdin, Stdout: wsWriter{s, api.StreamStdout}, Stderr: wsWriter{s, api.StreamStderr}}
}

func (s *wsSession) sendEvent(ev api.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return s.c.Write(s.ctx, websocket.MessageText, b)
}

// follow serves the session until the process exits or the client leaves.
func (s *wsSession) follow(p *client.Process, info proto.ProcInfo, err error, wait waitFunc) {
	defer s.stdin.Close()
	if err != nil {
		close(s.started)
		wsFail(s.ctx, s.c, err)
		return
	}
	pv := processView(info)
	s.sendEvent(api.Event{Type: api.EventStarted, Process: &pv})
	close(s.started)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		s.readClient(p)
	}()
	exit, err := wait(p, info)
	if err != nil {
		if !errors.Is(err, client.ErrDetached) || s.ctx.Err() == nil {
			body := httpapi.Body(err)
			s.sendEvent(api.Event{Type: api.EventError, Error: &body})
		}
	} else {
		s.sendEvent(api.Event{Type: api.EventExit, Exit: exitView(exit)})
	}
	s.c.Close(websocket.StatusNormalClosure, "")
	s.stdin.Close()
	<-readDone
}

// readClient applies the client's messages to the process until the
// connection ends; a client that goes away detaches.
func (s *wsSession) readClient(p *client.Process) {
	for {
		typ, msg, err := s.c.Read(s.ctx)
		if err != nil {
			s.stdin.CloseWithError(err)
			p.Detach()
			return
		}
		if typ == websocket.MessageBinary {
			if len(msg) < 1 || msg[0] != api.StreamStdin {
				continue
			}
			if _, err := s.stdin.Write(msg[1:]); err != nil {
				continue // stdin closed: drop
			}
			continue
		}
		var ctl api.Control
		if decodeStrict(msg, &ctl) != nil {
			continue
		}
		switch ctl.Type {
		case api.ControlStdinEOF:
			s.stdin.Close()
		case api.ControlResize:
			if ctl.Rows > 0 && ctl.Cols > 0 {
				p.Resize(ctl.Rows, ctl.Cols)
			}
		case api.ControlSignal:
			if ctl.Signal > 0 && ctl.Signal < 65 {
				p.Signal(ctl.Signal)
			}
		case api.ControlDetach:
			p.Detach()
		}
	}
}

// waitFunc waits for an attached process to end (or its attachment).
type waitFunc func(p *client.Process, info proto.ProcInfo) (proto.Exit, error)

// attachedWait waits as long as the attachment lasts: an attachment
// has no timeout of its own.
func attachedWait(p *client.Process, _ proto.ProcInfo) (proto.Exit, error) { return p.Wait() }

// execTimeoutGrace is how long after an exec's timeout_seconds the host
// waits for the guest to report the exit it enforces, before it ends the
// exec itself: the guest's own exit grace, a loaded guest's scheduling,
// and the trip of the exit frame fit in it many times over.
const execTimeoutGrace = 5 * time.Second

// execWait is the waitFunc of an exec with timeout_seconds: the host
// enforces the timeout too, so that an agent that stops answering (or
// never enforces it) cannot keep the exec open. seconds+execTimeoutGrace
// after the start, if the exit has not come, the host asks the agent to
// kill the process (for at most execKillWait), detaches and reports the
// exit the guest would have: killed by SIGKILL, timed out.
func execWait(a *client.Client, seconds int64) waitFunc {
	if seconds <= 0 || seconds > maxHostTimeout {
		return attachedWait
	}
	return func(p *client.Process, info proto.ProcInfo) (proto.Exit, error) {
		t := time.NewTimer(time.Duration(seconds)*time.Second + execTimeoutGrace)
		defer t.Stop()
		select {
		case <-p.Done():
			return p.Wait()
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), execKillWait)
		a.SignalProcess(ctx, info.ID, 9) // best effort: the guest's SIGKILL
		cancel()
		select {
		case <-p.Done(): // it ended meanwhile: its own exit it is
			return p.Wait()
		default:
		}
		p.Detach()
		return proto.Exit{Code: 128 + 9, Signal: 9, TimedOut: true}, nil
	}
}

// maxHostTimeout is the longest timeout_seconds the host enforces too
// (136 years: longer ones would overflow a time.Duration).
const maxHostTimeout = 1 << 32

// execKillWait bounds the host's kill of an exec that outlived its
// timeout.
const execKillWait = 2 * time.Second
