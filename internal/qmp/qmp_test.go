package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

const greetingLine = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian test"}, "capabilities": ["oob"]}}`

// peer is the server side of one fake QMP connection.
type peer struct {
	conn *net.UnixConn
	br   *bufio.Reader
}

type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

func (p *peer) send(lines ...string) error {
	for _, l := range lines {
		if _, err := io.WriteString(p.conn, l+"\r\n"); err != nil {
			return err
		}
	}
	return nil
}

func (p *peer) recv() (request, error) {
	line, err := p.br.ReadBytes('\n')
	if err != nil {
		return request{}, fmt.Errorf("read request: %w", err)
	}
	var r request
	if err := json.Unmarshal(line, &r); err != nil {
		return request{}, fmt.Errorf("parse request %q: %w", line, err)
	}
	return r, nil
}

// expect reads one request and checks its command name.
func (p *peer) expect(cmd string) (request, error) {
	r, err := p.recv()
	if err != nil {
		return r, err
	}
	if r.Execute != cmd {
		return r, fmt.Errorf("got command %q, want %q", r.Execute, cmd)
	}
	return r, nil
}

func (p *peer) handshake() error {
	if err := p.send(greetingLine); err != nil {
		return err
	}
	r, err := p.expect("qmp_capabilities")
	if err != nil {
		return err
	}
	return p.send(`{"return": {}, "id": ` + string(r.ID) + `}`)
}

// drain waits for the client to hang up, so the script does not close the
// connection before the client has seen everything.
func (p *peer) drain() error {
	_, err := io.Copy(io.Discard, p.br)
	return err
}

// serve runs a fake QMP server for one connection and returns its socket
// path. script runs after the greeting unless raw is set; its error fails
// the test.
func serve(t *testing.T, raw bool, script func(p *peer) error) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	errc := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		p := &peer{conn: c.(*net.UnixConn), br: bufio.NewReader(c)}
		if !raw {
			if err := p.handshake(); err != nil {
				errc <- fmt.Errorf("handshake: %w", err)
				return
			}
		}
		errc <- script(p)
	}()
	t.Cleanup(func() {
		l.Close()
		if err := <-errc; err != nil {
			t.Errorf("fake qmp server: %v", err)
		}
	})
	return path
}

func dial(t *testing.T, path string, opts ...Option) *Conn {
	t.Helper()
	c, err := Dial(t.Context(), path, opts...)
	if err != nil {
		t.Fatalf("setup: Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestExecute(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		r, err := p.expect("block_resize")
		if err != nil {
			return err
		}
		if got, want := string(r.Arguments), `{"device":"d0","size":1024}`; got != want {
			return fmt.Errorf("arguments = %s, want %s", got, want)
		}
		if err := p.send(`{"return": {}, "id": ` + string(r.ID) + `}`); err != nil {
			return err
		}
		r, err = p.expect("query-status")
		if err != nil {
			return err
		}
		if r.Arguments != nil {
			return fmt.Errorf("query-status arguments = %s, want none", r.Arguments)
		}
		if err := p.send(`{"return": {"status": "prelaunch", "running": false}, "id": ` + string(r.ID) + `}`); err != nil {
			return err
		}
		return p.drain()
	})
	c := dial(t, path)
	if diff := cmp.Diff(Version{Major: 7, Minor: 2, Micro: 22, Package: "Debian test"}, c.Version()); diff != "" {
		t.Errorf("Version() mismatch (-want +got):\n%s", diff)
	}
	args := map[string]any{"device": "d0", "size": 1024}
	if err := c.Execute(t.Context(), "block_resize", args, nil); err != nil {
		t.Fatalf("Execute(block_resize) = %v", err)
	}
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := c.Execute(t.Context(), "query-status", nil, &st); err != nil {
		t.Fatalf("Execute(query-status) = %v", err)
	}
	if st.Status != "prelaunch" || st.Running {
		t.Errorf("query-status = %+v, want prelaunch, not running", st)
	}
}

func TestEventsInterleavedWithReplies(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		ids := map[string]string{}
		for range 2 {
			r, err := p.recv()
			if err != nil {
				return err
			}
			ids[r.Execute] = string(r.ID)
		}
		// Replies out of order, with events and foreign ids in between.
		return errors.Join(p.send(
			`{"timestamp": {"seconds": 100, "microseconds": 5}, "event": "STOP"}`,
			`{"return": "for b", "id": `+ids["b"]+`}`,
			`{"return": "stray", "id": "not-ours"}`,
			`{"return": "stray", "id": 999999}`,
			`{"event": "RESUME", "data": {"x": 1}, "timestamp": {"seconds": 101, "microseconds": 0}}`,
			`{"return": "for a", "id": `+ids["a"]+`}`,
		), p.drain())
	})
	c := dial(t, path)

	cmds := []string{"a", "b"}
	got := make([]string, len(cmds))
	errs := make([]error, len(cmds))
	var wg sync.WaitGroup
	for i, cmd := range cmds {
		wg.Go(func() { errs[i] = c.Execute(t.Context(), cmd, nil, &got[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if diff := cmp.Diff([]string{"for a", "for b"}, got); diff != "" {
		t.Errorf("replies mismatch (-want +got):\n%s", diff)
	}
	var evs []Event
	for range 2 {
		evs = append(evs, <-c.Events())
	}
	want := []Event{
		{Name: "STOP", Timestamp: time.Unix(100, 5000)},
		{Name: "RESUME", Data: json.RawMessage(`{"x": 1}`), Timestamp: time.Unix(101, 0)},
	}
	if diff := cmp.Diff(want, evs); diff != "" {
		t.Errorf("events mismatch (-want +got):\n%s", diff)
	}
}

func TestErrorReply(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		r, err := p.expect("migrate-incoming")
		if err != nil {
			return err
		}
		return errors.Join(p.send(`{"error": {"class": "GenericError", "desc": "Guest not set up for incoming migration"}, "id": `+string(r.ID)+`}`), p.drain())
	})
	c := dial(t, path)
	err := c.Execute(t.Context(), "migrate-incoming", map[string]string{"uri": "fd:x"}, nil)
	var qerr *Error
	if !errors.As(err, &qerr) {
		t.Fatalf("Execute(migrate-incoming) = %v, want *Error", err)
	}
	want := &Error{Command: "migrate-incoming", Class: "GenericError", Desc: "Guest not set up for incoming migration"}
	if diff := cmp.Diff(want, qerr); diff != "" {
		t.Errorf("error mismatch (-want +got):\n%s", diff)
	}
	if got, want := err.Error(), "qmp migrate-incoming: Guest not set up for incoming migration (GenericError)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	// The connection stays usable after a command error.
	if c.Err() != nil {
		t.Errorf("Err() = %v after a command error, want nil", c.Err())
	}
}

func TestOversizedLine(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		if _, err := p.expect("query-status"); err != nil {
			return err
		}
		// An event whose data never ends: 1 MiB plus a bit, no newline yet.
		big := `{"event": "X", "data": "` + strings.Repeat("a", MaxLineSize) + `"}`
		if _, err := io.WriteString(p.conn, big); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			return err
		}
		return nil
	})
	c := dial(t, path)
	err := c.Execute(t.Context(), "query-status", nil, nil)
	if !errors.Is(err, ErrDisconnected) || !errors.Is(err, errkind.ResourceExhausted) {
		t.Fatalf("Execute(query-status) = %v, want ErrDisconnected and ResourceExhausted", err)
	}
	<-c.Done()
	if err := c.Execute(t.Context(), "query-status", nil, nil); !errors.Is(err, ErrDisconnected) {
		t.Errorf("Execute after disconnect = %v, want ErrDisconnected", err)
	}
}

func TestLineAtLimit(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		r, err := p.expect("big")
		if err != nil {
			return err
		}
		prefix := `{"id": ` + string(r.ID) + `, "return": "`
		suffix := "\"}\r\n"
		body := strings.Repeat("b", MaxLineSize-len(prefix)-len(suffix))
		if _, err := io.WriteString(p.conn, prefix+body+suffix); err != nil {
			return err
		}
		return p.drain()
	})
	c := dial(t, path)
	var s string
	if err := c.Execute(t.Context(), "big", nil, &s); err != nil {
		t.Fatalf("Execute(big) with a reply of exactly MaxLineSize bytes = %v", err)
	}
	if len(s) < MaxLineSize-100 {
		t.Errorf("len(reply) = %d, want about %d", len(s), MaxLineSize)
	}
}

func TestServerClosesMidCommand(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		_, err := p.expect("migrate")
		return err // and hang up without replying
	})
	c := dial(t, path)
	err := c.Execute(t.Context(), "migrate", nil, nil)
	if !errors.Is(err, ErrDisconnected) || !errors.Is(err, errkind.Unavailable) {
		t.Fatalf("Execute(migrate) = %v, want ErrDisconnected", err)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done() not closed after the server hung up")
	}
	if _, ok := <-c.Events(); ok {
		t.Error("Events() not closed after the server hung up")
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
}

func TestExecuteDeadline(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		if _, err := p.expect("slow"); err != nil {
			return err
		}
		slowDone, err := p.expect("fast")
		if err != nil {
			return err
		}
		// The late reply to "slow" must not confuse the next command.
		return errors.Join(p.send(
			`{"return": "late", "id": 1}`,
			`{"return": "fast", "id": `+string(slowDone.ID)+`}`,
		), p.drain())
	})
	c := dial(t, path)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := c.Execute(ctx, "slow", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute(slow) = %v, want context.DeadlineExceeded", err)
	}
	var s string
	if err := c.Execute(t.Context(), "fast", nil, &s); err != nil || s != "fast" {
		t.Fatalf("Execute(fast) = %q, %v, want \"fast\", nil", s, err)
	}
}

func TestDialDeadline(t *testing.T) {
	hold := make(chan struct{})
	path := serve(t, true, func(p *peer) error {
		<-hold // never greet
		return nil
	})
	defer close(hold)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if c, err := Dial(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial without greeting = %v, want context.DeadlineExceeded", err)
	}
}

func TestDialBadGreeting(t *testing.T) {
	path := serve(t, true, func(p *peer) error {
		return p.send(`{"return": {}}`)
	})
	c, err := Dial(t.Context(), path)
	if err == nil {
		c.Close()
		t.Fatal("Dial with a greeting lacking QMP = nil error, want error")
	}
}

func TestCloseFailsPending(t *testing.T) {
	got := make(chan struct{})
	path := serve(t, false, func(p *peer) error {
		if _, err := p.expect("wait"); err != nil {
			return err
		}
		close(got)
		return p.drain()
	})
	c := dial(t, path)
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(t.Context(), "wait", nil, nil) }()
	<-got
	if err := c.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("pending Execute after Close = %v, want ErrClosed", err)
	}
	if err := c.Execute(t.Context(), "x", nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Execute after Close = %v, want ErrClosed", err)
	}
}

func TestEventOverflowDropsAndCounts(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		r, err := p.expect("ping")
		if err != nil {
			return err
		}
		var lines []string
		for i := range 5 {
			lines = append(lines, fmt.Sprintf(`{"event": "E%d", "timestamp": {"seconds": 1, "microseconds": 0}}`, i))
		}
		lines = append(lines, `{"return": {}, "id": `+string(r.ID)+`}`)
		return errors.Join(p.send(lines...), p.drain())
	})
	c := dial(t, path, WithEventBuffer(2))
	// The reply comes after the events, so all of them have been handled
	// by the time Execute returns, although nobody reads Events.
	if err := c.Execute(t.Context(), "ping", nil, nil); err != nil {
		t.Fatalf("Execute(ping) = %v", err)
	}
	if got, want := c.DroppedEvents(), uint64(3); got != want {
		t.Errorf("DroppedEvents() = %d, want %d", got, want)
	}
	var names []string
	for range 2 {
		names = append(names, (<-c.Events()).Name)
	}
	if diff := cmp.Diff([]string{"E0", "E1"}, names); diff != "" {
		t.Errorf("queued events mismatch (-want +got):\n%s", diff)
	}
}

func TestEventHandler(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		r, err := p.expect("ping")
		if err != nil {
			return err
		}
		return errors.Join(p.send(
			`{"event": "SHUTDOWN", "data": {"guest": true}, "timestamp": {"seconds": 1, "microseconds": 0}}`,
			`{"return": {}, "id": `+string(r.ID)+`}`,
		), p.drain())
	})
	var mu sync.Mutex
	var names []string
	c := dial(t, path, WithEventHandler(func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		names = append(names, ev.Name)
	}))
	if c.Events() != nil {
		t.Error("Events() != nil with an event handler")
	}
	if err := c.Execute(t.Context(), "ping", nil, nil); err != nil {
		t.Fatalf("Execute(ping) = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"SHUTDOWN"}, names); diff != "" {
		t.Errorf("handled events mismatch (-want +got):\n%s", diff)
	}
}

func TestSendFile(t *testing.T) {
	path := serve(t, false, func(p *peer) error {
		buf := make([]byte, 4096)
		oob := make([]byte, syscall.CmsgSpace(4))
		n, oobn, _, _, err := p.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return err
		}
		var r request
		if err := json.Unmarshal(buf[:n], &r); err != nil {
			return fmt.Errorf("parse %q: %w", buf[:n], err)
		}
		if r.Execute != "getfd" || string(r.Arguments) != `{"fdname":"snap"}` {
			return fmt.Errorf("got %s %s, want getfd {\"fdname\":\"snap\"}", r.Execute, r.Arguments)
		}
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			return fmt.Errorf("control messages = %d, %v, want 1", len(msgs), err)
		}
		fds, err := syscall.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			return fmt.Errorf("passed fds = %v, %v, want one", fds, err)
		}
		f := os.NewFile(uintptr(fds[0]), "passed")
		_, err = io.WriteString(f, "through the fd")
		f.Close()
		if err != nil {
			return fmt.Errorf("write to passed fd: %w", err)
		}
		return errors.Join(p.send(`{"return": {}, "id": `+string(r.ID)+`}`), p.drain())
	})
	c := dial(t, path)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer pr.Close()
	if err := c.SendFile(t.Context(), "snap", pw); err != nil {
		t.Fatalf("SendFile() = %v", err)
	}
	pw.Close()
	b, err := io.ReadAll(pr)
	if err != nil || string(b) != "through the fd" {
		t.Errorf("read from pipe = %q, %v, want %q", b, err, "through the fd")
	}
}
