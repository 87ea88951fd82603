package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/coder/websocket"

	"space/api"
)

// ErrStreamCut is returned when an output stream ends before its exit (or
// error) event: the connection broke or the server went away. The command
// may still be running; Process tells, and Output or Attach resume.
var ErrStreamCut = errors.New("output stream ended before the command exited")

// Exec runs req in sandbox id and streams its output as it arrives:
// stdout bytes to stdout, stderr bytes to stderr (nil discards). It
// returns how the command ended. The output comes as binary WebSocket
// messages (ExecStream), req.Stdin as the command's stdin. An error event
// from the server comes back as an *Error; a stream that ends without an
// exit event as ErrStreamCut. Use StartDetached for req.Detach.
func (c *Client) Exec(ctx context.Context, id string, req api.Exec, stdout, stderr io.Writer) (api.Exit, error) {
	if req.Detach {
		return api.Exit{}, errors.New("exec: detach is set: use StartDetached")
	}
	sio := StreamIO{Stdout: stdout, Stderr: stderr}
	if len(req.Stdin) > 0 {
		sio.Stdin = bytes.NewReader(req.Stdin)
	}
	return c.ExecStream(ctx, id, req, sio)
}

// ExecEvents is Exec over the NDJSON event stream of POST
// /v1/sandboxes/{id}/exec (output base64 in JSON events), for paths that
// carry no WebSocket.
func (c *Client) ExecEvents(ctx context.Context, id string, req api.Exec, stdout, stderr io.Writer) (api.Exit, error) {
	if req.Detach {
		return api.Exit{}, errors.New("exec: detach is set: use StartDetached")
	}
	body, err := jsonBody(req)
	if err != nil {
		return api.Exit{}, err
	}
	return c.ndjson(ctx, request{method: http.MethodPost, sandbox: id, path: sandboxPath(id, "/exec"), body: body}, stdout, stderr)
}

// Output streams the output of the command pid (an api.Process.ID) in
// sandbox id: what is buffered, then live output until the command exits.
// It sends nothing to the command. Errors are as for Exec.
func (c *Client) Output(ctx context.Context, id string, pid int64, stdout, stderr io.Writer) (api.Exit, error) {
	return c.ndjson(ctx, request{method: http.MethodGet, sandbox: id, path: processPath(id, pid, "/output")}, stdout, stderr)
}

// OutputShared is Output alongside the command's live attachment (an
// Attach, ExecStream or another Output) instead of taking over from it:
// both get the output written from now on. A command nobody follows gives
// its buffered output as with Output.
func (c *Client) OutputShared(ctx context.Context, id string, pid int64, stdout, stderr io.Writer) (api.Exit, error) {
	return c.ndjson(ctx, request{method: http.MethodGet, sandbox: id, path: processPath(id, pid, "/output"), query: shareQuery}, stdout, stderr)
}

// shareQuery asks to follow a command alongside its live attachment.
var shareQuery = url.Values{"share": {"true"}}

// ndjson sends r, whose reply is an application/x-ndjson event stream, and
// copies the output events to stdout and stderr until the exit event.
func (c *Client) ndjson(ctx context.Context, r request, stdout, stderr io.Writer) (api.Exit, error) {
	r.accept = "application/x-ndjson"
	resp, err := c.do(ctx, r)
	if err != nil {
		return api.Exit{}, err
	}
	defer resp.Body.Close()
	out := outputs{stdout, stderr}
	var exit api.Exit
	err = readNDJSON(ctx, resp.Body, ErrStreamCut, func(ev api.Event) (done bool, err error) {
		exit, done, err = out.event(ev)
		return done, err
	})
	return exit, err
}

// readNDJSON decodes the events of an NDJSON stream in turn and passes
// each to handle, until handle reports the final event or fails. A stream
// that ends before is the error cut (wrapping what the decoder said
// unless the stream just ended); a stream that ends with ctx is ctx's
// cause.
func readNDJSON[E any](ctx context.Context, r io.Reader, cut error, handle func(E) (done bool, err error)) error {
	dec := json.NewDecoder(r)
	for {
		var ev E
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if errors.Is(err, io.EOF) {
				return cut
			}
			return fmt.Errorf("%w: %w", cut, err)
		}
		if done, err := handle(ev); done || err != nil {
			return err
		}
	}
}

// eventError is the *Error of an error event's body b (or nil).
func eventError(b *api.ErrorBody) *Error {
	if b == nil {
		return &Error{Code: api.CodeInternal, Message: "error event without error"}
	}
	return &Error{Code: b.Code, Message: b.Message, Field: b.Field}
}

// outputs are where a stream's output goes.
type outputs struct {
	stdout, stderr io.Writer // or nil
}

// write copies b to w unless w is nil.
func write(w io.Writer, name string, b []byte) error {
	if w == nil || len(b) == 0 {
		return nil
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// event handles one stream event. done is set by the final event (exit
// or error).
func (o outputs) event(ev api.Event) (exit api.Exit, done bool, err error) {
	switch ev.Type {
	case api.EventStdout:
		return api.Exit{}, false, write(o.stdout, "stdout", ev.Data)
	case api.EventStderr:
		return api.Exit{}, false, write(o.stderr, "stderr", ev.Data)
	case api.EventExit:
		if ev.Exit == nil {
			return api.Exit{}, true, errors.New("exit event without exit status")
		}
		return *ev.Exit, true, nil
	case api.EventError:
		return api.Exit{}, true, eventError(ev.Error)
	default: // started, and kinds of events this client does not know
		return api.Exit{}, false, nil
	}
}

// StreamIO is the I/O of a command on a WebSocket.
type StreamIO struct {
	// Stdin is copied to the command's stdin, which is closed at EOF. Nil
	// sends no stdin: ExecStream closes the command's stdin at once,
	// Attach leaves it alone. A Read that blocks (a terminal) may keep a
	// goroutine alive after the call returns, until the Read returns.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output (a terminal's is all
	// stdout); nil discards it.
	Stdout, Stderr io.Writer
	// Resize, if not nil, carries new terminal sizes for a command on a
	// terminal. The caller owns it and may close it, or not.
	Resize <-chan api.WinSize
	// KeepStdinOpen, with a nil Stdin, leaves the command's stdin open for
	// WriteStdin instead of closing it at once.
	KeepStdinOpen bool
	// Started, if not nil, is called with the command's Process when the
	// server reports it started (or, attaching, when the attachment begins),
	// before any of its output.
	Started func(api.Process)
}

// ExecStream runs req in sandbox id over a WebSocket, with stdin streamed
// from sio.Stdin; set req.TTY to run it on a terminal of that size. It
// returns how the command ended. Errors are as for Exec. When ctx ends
// the connection is dropped; the command keeps running unless
// req.KillOnDisconnect is set.
func (c *Client) ExecStream(ctx context.Context, id string, req api.Exec, sio StreamIO) (api.Exit, error) {
	req.Detach = false
	req.Stdin = nil
	return c.websocket(ctx, id, sandboxPath(id, "/exec/ws"), nil, &req, sio)
}

// Attach attaches to the running command pid (an api.Process.ID) in
// sandbox id over a WebSocket: its buffered, then live output goes to
// sio.Stdout and sio.Stderr and sio.Stdin to its stdin, until it exits.
// Errors are as for Exec.
func (c *Client) Attach(ctx context.Context, id string, pid int64, sio StreamIO) (api.Exit, error) {
	return c.websocket(ctx, id, processPath(id, pid, "/attach"), nil, nil, sio)
}

// AttachShared is Attach alongside the command's live attachment instead
// of taking over from it: both get the output written from now on and
// both reach its stdin. Leaving never kills the command.
func (c *Client) AttachShared(ctx context.Context, id string, pid int64, sio StreamIO) (api.Exit, error) {
	return c.websocket(ctx, id, processPath(id, pid, "/attach"), shareQuery, nil, sio)
}

// maxMessage bounds a WebSocket message from the server: an event or a
// chunk of output.
const maxMessage = 16 << 20

func (c *Client) websocket(ctx context.Context, sandbox, path string, q url.Values, first *api.Exec, sio StreamIO) (_ api.Exit, err error) {
	dial := func() (*websocket.Conn, *http.Response, error) {
		base, auth, err := c.route(ctx, sandbox)
		if err != nil {
			return nil, nil, err
		}
		h := http.Header{}
		setAuth(h, auth)
		return websocket.Dial(ctx, urlOf(base, path, q), &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	}
	conn, resp, err := dial()
	if err != nil && resp != nil && resp.StatusCode == http.StatusUnauthorized {
		c.forget(sandbox) // a data-plane token refused: once more with a new one
		conn, resp, err = dial()
	}
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
			return api.Exit{}, fmt.Errorf("GET %s: %w", path, decodeError(resp.StatusCode, body))
		}
		return api.Exit{}, fmt.Errorf("GET %s: %w", path, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxMessage)

	if first != nil {
		b, err := json.Marshal(first)
		if err != nil {
			return api.Exit{}, err
		}
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			return api.Exit{}, fmt.Errorf("send exec: %w", err)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	switch {
	case sio.Stdin != nil:
		// Not waited for: a Read from a terminal cannot be interrupted.
		go sendStdin(ctx, conn, sio.Stdin)
	case first != nil && !sio.KeepStdinOpen:
		if err := sendControl(ctx, conn, api.Control{Type: api.ControlStdinEOF}); err != nil {
			return api.Exit{}, err
		}
	}
	if sio.Resize != nil {
		wg.Go(func() { sendResizes(ctx, conn, sio.Resize) })
	}

	out := outputs{sio.Stdout, sio.Stderr}
	for {
		typ, r, err := conn.Reader(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return api.Exit{}, context.Cause(ctx)
			}
			return api.Exit{}, fmt.Errorf("%w: %w", ErrStreamCut, err)
		}
		if typ == websocket.MessageBinary {
			// Output goes straight from the connection to its writer.
			if err := out.copyMessage(r); err != nil {
				return api.Exit{}, err
			}
			continue
		}
		msg, err := io.ReadAll(r)
		if err != nil {
			return api.Exit{}, fmt.Errorf("%w: %w", ErrStreamCut, err)
		}
		var ev api.Event
		if err := json.Unmarshal(msg, &ev); err != nil {
			return api.Exit{}, fmt.Errorf("decode event: %w", err)
		}
		if ev.Type == api.EventStarted && ev.Process != nil && sio.Started != nil {
			sio.Started(*ev.Process)
		}
		if exit, done, err := out.event(ev); done || err != nil {
			if done {
				conn.Close(websocket.StatusNormalClosure, "")
			}
			return exit, err
		}
	}
}

// copyMessage copies a binary output message (a stream byte, then the
// bytes) to its writer; messages of other streams are read and dropped.
func (o outputs) copyMessage(r io.Reader) error {
	var stream [1]byte
	if _, err := io.ReadFull(r, stream[:]); err != nil {
		return nil // empty
	}
	w, name := io.Discard, ""
	switch stream[0] {
	case api.StreamStdout:
		w, name = o.stdout, "stdout"
	case api.StreamStderr:
		w, name = o.stderr, "stderr"
	}
	if w == nil {
		w = io.Discard
	}
	ew := &errWriter{w: w}
	if _, err := io.Copy(ew, r); err != nil {
		if ew.err != nil {
			return fmt.Errorf("write %s: %w", name, ew.err)
		}
		return fmt.Errorf("%w: %w", ErrStreamCut, err)
	}
	return nil
}

// errWriter records the error its writer returned.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

func sendControl(ctx context.Context, conn *websocket.Conn, ctl api.Control) error {
	b, err := json.Marshal(ctl)
	if err != nil {
		return err
	}
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("send %s: %w", ctl.Type, err)
	}
	return nil
}

// sendStdin copies r to the command's stdin until EOF, which it passes
// on as a stdin_eof control. A read error other than EOF also closes the
// command's stdin. It gives up once ctx ends or a send fails: the read
// loop then sees the broken connection.
func sendStdin(ctx context.Context, conn *websocket.Conn, r io.Reader) {
	buf := make([]byte, 1+32<<10)
	buf[0] = api.StreamStdin
	for {
		n, err := r.Read(buf[1:])
		if n > 0 {
			if conn.Write(ctx, websocket.MessageBinary, buf[:1+n]) != nil {
				return
			}
		}
		if err != nil {
			sendControl(ctx, conn, api.Control{Type: api.ControlStdinEOF})
			return
		}
	}
}

// sendResizes forwards terminal sizes until ctx ends or a send fails.
func sendResizes(ctx context.Context, conn *websocket.Conn, sizes <-chan api.WinSize) {
	for {
		select {
		case <-ctx.Done():
			return
		case ws, ok := <-sizes:
			if !ok {
				return
			}
			if sendControl(ctx, conn, api.Control{Type: api.ControlResize, Rows: ws.Rows, Cols: ws.Cols}) != nil {
				return
			}
		}
	}
}
