package e2b

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"space/api"
	"space/client"
)

// The process service's messages, in protobuf's JSON form (field names in
// lowerCamelCase, bytes in base64, enums by name).

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type ptySize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

type ptyConfig struct {
	Size *ptySize `json:"size,omitempty"`
}

type startRequest struct {
	Process *processConfig `json:"process"`
	PTY     *ptyConfig     `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

type processSelector struct {
	PID *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

type startEvent struct {
	PID uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

// eventMessage is StartResponse and ConnectResponse alike.
type eventMessage struct {
	Event processEvent `json:"event"`
}

var keepaliveEvent = eventMessage{Event: processEvent{Keepalive: &struct{}{}}}

// endOf describes how a command ended as envd does (Go's ProcessState):
// "exit status N", or "signal: NAME" with exit code -1.
func endOf(e api.Exit) endEvent {
	if e.Signal != 0 {
		status := "signal: " + syscall.Signal(e.Signal).String()
		return endEvent{ExitCode: -1, Exited: false, Status: status, Error: &status}
	}
	status := "exit status " + strconv.Itoa(e.Code)
	end := endEvent{ExitCode: int32(e.Code), Exited: true, Status: status}
	if e.Code != 0 {
		end.Error = &status
	}
	return end
}

// output sends what a command writes to one stream as data events.
type output struct {
	st   *stream
	kind string // stdout, stderr or pty
}

func (o output) Write(p []byte) (int, error) {
	b := append([]byte(nil), p...)
	var d dataEvent
	switch o.kind {
	case "stdout":
		d.Stdout = b
	case "stderr":
		d.Stderr = b
	default:
		d.PTY = b
	}
	if err := o.st.Send(eventMessage{Event: processEvent{Data: &d}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// follow streams a command's events over st: ExecStream or Attach with
// the StreamIO it is given, started, data and end events, keepalives
// meanwhile, then the end of the stream.
// When the stream breaks because the sandbox stopped running (killed,
// paused, its VM died), the response is dropped rather than ended with an
// error, as envd's connection drops with its VM: the SDKs then ask
// /health, get the 502 of a sandbox that is gone, and say so.
func follow(ctx context.Context, r *http.Request, st *stream, c *envdCall, tty bool, run func(client.StreamIO) (api.Exit, error), keepStdin bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go st.keepalive(ctx, r, keepaliveEvent)
	stdout, stderr := output{st, "stdout"}, output{st, "stderr"}
	if tty {
		stdout.kind = "pty"
	}
	exit, err := run(client.StreamIO{
		Stdout: stdout, Stderr: stderr, KeepStdinOpen: keepStdin,
		Started: func(p api.Process) {
			st.Send(eventMessage{Event: processEvent{Start: &startEvent{PID: uint32(p.PID)}}})
		},
	})
	if err != nil {
		if r.Context().Err() == nil && c.gone() {
			panic(http.ErrAbortHandler)
		}
		st.End(err)
		return
	}
	end := endOf(exit)
	if err := st.Send(eventMessage{Event: processEvent{End: &end}}); err != nil {
		return
	}
	st.End(nil)
}

func (s *Server) processStart(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req startRequest
	sc, ok := beginStream(w, r, &req)
	if !ok {
		return
	}
	defer sc.cancel()
	st, ctx, timeout := sc.st, sc.ctx, sc.timeout
	if req.Process == nil || req.Process.Cmd == "" {
		st.End(newRPCError("invalid_argument", "process.cmd is empty"))
		return
	}
	user, home := c.userAndHome(ctx)
	ex := api.Exec{
		Command: append([]string{req.Process.Cmd}, req.Process.Args...),
		Env:     req.Process.Envs, User: user, Cwd: home,
		// envd kills a command when its call's deadline passes.
		TimeoutSeconds: int64((timeout + time.Second - 1) / time.Second),
	}
	if req.Tag != nil {
		ex.Tag = *req.Tag
	}
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		cwd, err := c.absPath(ctx, *req.Process.Cwd)
		if err != nil {
			st.End(err)
			return
		}
		ex.Cwd = cwd
	}
	if req.PTY != nil {
		size := ptySize{Cols: 80, Rows: 24}
		if req.PTY.Size != nil {
			size = *req.PTY.Size
		}
		if size.Cols == 0 || size.Rows == 0 || size.Cols > 65535 || size.Rows > 65535 {
			st.End(newRPCError("invalid_argument", "pty size %dx%d", size.Cols, size.Rows))
			return
		}
		ex.TTY = &api.WinSize{Rows: uint16(size.Rows), Cols: uint16(size.Cols)}
	}
	// Before envd 0.3.0 stdin was always open, and an absent field keeps
	// that meaning.
	keepStdin := req.Stdin == nil || *req.Stdin || req.PTY != nil
	follow(ctx, r, st, c, req.PTY != nil, func(sio client.StreamIO) (api.Exit, error) {
		return c.sandbox.ExecStream(ctx, c.id, ex, sio)
	}, keepStdin)
}

// process finds the running command a selector names: envd's pids are
// the guest's, SPACE's process routes take the agent's table IDs.
func (c *envdCall) process(ctx context.Context, sel *processSelector) (api.Process, error) {
	if sel == nil || (sel.PID == nil && sel.Tag == nil) {
		return api.Process{}, newRPCError("invalid_argument", "process selector is empty")
	}
	procs, err := c.sandbox.Processes(ctx, c.id)
	if err != nil {
		return api.Process{}, err
	}
	// The newest first: a pid may have been used before, and tags need
	// not be unique.
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		if !p.Running {
			continue
		}
		if sel.PID != nil && p.PID == int(*sel.PID) || sel.PID == nil && p.Tag == *sel.Tag {
			return p, nil
		}
	}
	if sel.PID == nil {
		return api.Process{}, notFoundf("process with tag %q not found", *sel.Tag)
	}
	return api.Process{}, notFoundf("process with pid %d not found", *sel.PID)
}

func (s *Server) processConnect(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req struct {
		Process *processSelector `json:"process"`
	}
	sc, ok := beginStream(w, r, &req)
	if !ok {
		return
	}
	defer sc.cancel()
	st, ctx := sc.st, sc.ctx
	p, err := c.process(ctx, req.Process)
	if err != nil {
		st.End(err)
		return
	}
	follow(ctx, r, st, c, p.TTY, func(sio client.StreamIO) (api.Exit, error) {
		return c.sandbox.AttachShared(ctx, c.id, p.ID, sio)
	}, true)
}

func (s *Server) processList(w http.ResponseWriter, r *http.Request, c *envdCall) {
	if err := readUnary(r, &struct{}{}); err != nil {
		writeRPCError(w, err)
		return
	}
	procs, err := c.sandbox.Processes(r.Context(), c.id)
	if err != nil {
		writeRPCError(w, err)
		return
	}
	type processInfo struct {
		Config processConfig `json:"config"`
		PID    uint32        `json:"pid"`
		Tag    *string       `json:"tag,omitempty"`
	}
	out := struct {
		Processes []processInfo `json:"processes"`
	}{Processes: []processInfo{}}
	for _, p := range procs {
		if !p.Running {
			continue // envd lists the running ones
		}
		cfg := processConfig{Cmd: "/bin/sh", Args: []string{"-c", p.Shell}, Envs: map[string]string{}}
		if len(p.Command) > 0 {
			cfg.Cmd, cfg.Args = p.Command[0], p.Command[1:]
		}
		if p.Cwd != "" {
			cwd := p.Cwd
			cfg.Cwd = &cwd
		}
		info := processInfo{Config: cfg, PID: uint32(p.PID)}
		if p.Tag != "" {
			info.Tag = &p.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	writeUnary(w, out)
}

// processUnary serves a unary call on one process: decode the request
// into req, find the process sel(req) names, apply do to it.
func processUnary[T any](w http.ResponseWriter, r *http.Request, c *envdCall, sel func(*T) *processSelector, do func(context.Context, api.Process, *T) error) {
	var req T
	if err := readUnary(r, &req); err != nil {
		writeRPCError(w, err)
		return
	}
	p, err := c.process(r.Context(), sel(&req))
	if err == nil {
		err = do(r.Context(), p, &req)
	}
	if err != nil {
		writeRPCError(w, err)
		return
	}
	writeUnary(w, struct{}{})
}

// processInput is input for a process: for its stdin, or for its
// terminal.
type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	PTY   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process *processSelector `json:"process"`
	Input   *processInput    `json:"input"`
}

func (s *Server) processSendInput(w http.ResponseWriter, r *http.Request, c *envdCall) {
	processUnary(w, r, c, func(q *sendInputRequest) *processSelector { return q.Process },
		func(ctx context.Context, p api.Process, q *sendInputRequest) error {
			if q.Input == nil {
				return nil
			}
			data := append(q.Input.Stdin, q.Input.PTY...)
			return c.sandbox.WriteStdin(ctx, c.id, p.ID, data, false)
		})
}

type selectorRequest struct {
	Process *processSelector `json:"process"`
}

func (s *Server) processCloseStdin(w http.ResponseWriter, r *http.Request, c *envdCall) {
	processUnary(w, r, c, func(q *selectorRequest) *processSelector { return q.Process },
		func(ctx context.Context, p api.Process, _ *selectorRequest) error {
			if p.TTY {
				return newRPCError("failed_precondition", "a terminal's stdin is not closed: send Ctrl+D (0x04) instead")
			}
			return c.sandbox.WriteStdin(ctx, c.id, p.ID, nil, true)
		})
}

type signalRequest struct {
	Process *processSelector `json:"process"`
	Signal  string           `json:"signal"`
}

func (s *Server) processSendSignal(w http.ResponseWriter, r *http.Request, c *envdCall) {
	processUnary(w, r, c, func(q *signalRequest) *processSelector { return q.Process },
		func(ctx context.Context, p api.Process, q *signalRequest) error {
			sig := map[string]int{"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15, "9": 9, "15": 15}[q.Signal]
			if sig == 0 {
				return newRPCError("invalid_argument", "signal %q: want SIGNAL_SIGKILL or SIGNAL_SIGTERM", q.Signal)
			}
			return c.sandbox.Signal(ctx, c.id, p.ID, sig)
		})
}

type updateRequest struct {
	Process *processSelector `json:"process"`
	PTY     *ptyConfig       `json:"pty,omitempty"`
}

func (s *Server) processUpdate(w http.ResponseWriter, r *http.Request, c *envdCall) {
	processUnary(w, r, c, func(q *updateRequest) *processSelector { return q.Process },
		func(ctx context.Context, p api.Process, q *updateRequest) error {
			if q.PTY == nil || q.PTY.Size == nil {
				return nil
			}
			sz := q.PTY.Size
			if sz.Cols == 0 || sz.Rows == 0 || sz.Cols > 65535 || sz.Rows > 65535 {
				return newRPCError("invalid_argument", "pty size %dx%d", sz.Cols, sz.Rows)
			}
			return c.sandbox.ResizeProcess(ctx, c.id, p.ID, api.WinSize{Rows: uint16(sz.Rows), Cols: uint16(sz.Cols)})
		})
}

// streamInputRequest is one message of StreamInput: the process first,
// then its input, with keepalives in between.
type streamInputRequest struct {
	Start *struct {
		Process *processSelector `json:"process"`
	} `json:"start,omitempty"`
	Data *struct {
		Input *processInput `json:"input"`
	} `json:"data,omitempty"`
	Keepalive *struct{} `json:"keepalive,omitempty"`
}

// processStreamInput is envd's client-streaming input: a start message
// naming the process, then data messages written to its stdin in order as
// they arrive. The reply, once the client ends its side, is one empty
// message; a failure ends the call early with the error.
func (s *Server) processStreamInput(w http.ResponseWriter, r *http.Request, c *envdCall) {
	sc, ok := beginStream(w, r, nil)
	if !ok {
		return
	}
	defer sc.cancel()
	st, ctx := sc.st, sc.ctx
	var p *api.Process
	for {
		var msg streamInputRequest
		err := readEnvelope(r.Body, &msg)
		if err == io.EOF {
			break
		}
		switch {
		case err != nil:
		case msg.Start != nil:
			if p != nil {
				err = newRPCError("invalid_argument", "a second start message")
				break
			}
			var found api.Process
			if found, err = c.process(ctx, msg.Start.Process); err == nil {
				p = &found
			}
		case msg.Data != nil:
			if p == nil {
				err = newRPCError("invalid_argument", "input before the start message that names the process")
				break
			}
			if in := msg.Data.Input; in != nil {
				err = c.sandbox.WriteStdin(ctx, c.id, p.ID, append(in.Stdin, in.PTY...), false)
			}
		}
		if err != nil {
			st.End(err)
			return
		}
	}
	if err := st.Send(struct{}{}); err == nil {
		st.End(nil)
	}
}
