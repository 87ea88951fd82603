// Package qmp is a client for the QEMU Machine Protocol over a unix socket.
//
// A [Conn] owns one reader goroutine. It matches replies to commands by
// request id, so several goroutines may call [Conn.Execute] at once, and it
// hands asynchronous events to a handler or a bounded channel without ever
// blocking on a slow consumer. QEMU is only semi-trusted (the guest influences
// what it says), so lines are bounded and a malformed stream ends the
// connection instead of being resynchronised.
//
// Lock order: Conn.writeMu before Conn.mu; neither is held while calling
// the event handler.
package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"space/internal/errkind"
)

// MaxLineSize bounds one message from QEMU, in bytes. A longer line ends
// the connection.
const MaxLineSize = 1 << 20

// defaultEventBuffer is the capacity of the Events channel unless
// [WithEventBuffer] says otherwise.
const defaultEventBuffer = 64

var (
	// ErrClosed is returned by Execute once Close has been called.
	ErrClosed = fmt.Errorf("qmp connection closed: %w", errkind.FailedPrecondition)
	// ErrDisconnected is wrapped by the errors of Execute once the connection
	// broke: QEMU exited, closed the socket, or sent something unparsable.
	ErrDisconnected = fmt.Errorf("qmp connection lost: %w", errkind.Unavailable)
)

// Error is a failure QEMU reported for one command
// (`{"error": {"class": ..., "desc": ...}}`).
type Error struct {
	Command string `json:"-"`     // the command that failed
	Class   string `json:"class"` // e.g. "GenericError", "CommandNotFound"
	Desc    string `json:"desc"`  // QEMU's human-readable description
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp %s: %s (%s)", e.Command, e.Desc, e.Class)
}

// Event is an asynchronous QMP event such as SHUTDOWN, STOP or MIGRATION.
type Event struct {
	Name      string
	Data      json.RawMessage // or nil when the event carries no data
	Timestamp time.Time       // as stamped by QEMU
}

// Version is QEMU's version from the QMP greeting.
type Version struct {
	Major, Minor, Micro int
	Package             string // distribution build string, or empty
}

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
}

// Option changes how Dial sets up a Conn.
type Option func(*options)

type options struct {
	handler     func(Event)
	eventBuffer int
}

// WithEventHandler makes the Conn call h for every event, on its reader
// goroutine, instead of queueing events on [Conn.Events]. h must return
// quickly and must not call Execute or Close on the same Conn (the reply
// could only be read after h returns).
func WithEventHandler(h func(Event)) Option {
	return func(o *options) { o.handler = h }
}

// WithEventBuffer sets the capacity of the [Conn.Events] channel
// (default 64). Events that arrive while it is full are dropped and counted.
func WithEventBuffer(n int) Option {
	return func(o *options) { o.eventBuffer = n }
}

// Conn is a QMP connection in command mode. Its methods are safe for
// concurrent use. The caller must call Close.
type Conn struct {
	conn    *net.UnixConn
	version Version
	handler func(Event)   // or nil: events go to events
	events  chan Event    // or nil when handler is set; closed by the reader
	done    chan struct{} // closed when the reader goroutine has exited
	dropped atomic.Uint64 // events dropped because events was full
	writeMu sync.Mutex    // serializes writes of whole requests
	br      *bufio.Reader // owned by the reader goroutine after Dial
	nextID  atomic.Uint64 // request ids; 0 is never used
	closing sync.Once     // guards conn.Close in Close

	mu sync.Mutex
	// +checklocks:mu
	pending map[uint64]chan reply // by request id; nil once the reader exited
	// +checklocks:mu
	err error // why the Conn stopped working, or nil while it works
}

type reply struct {
	ret json.RawMessage
	err *Error
}

// message is any line QEMU sends.
type message struct {
	QMP       *greeting       `json:"QMP"`
	Return    json.RawMessage `json:"return"`
	Error     *Error          `json:"error"`
	ID        json.RawMessage `json:"id"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

type greeting struct {
	Version struct {
		QEMU struct {
			Major int `json:"major"`
			Minor int `json:"minor"`
			Micro int `json:"micro"`
		} `json:"qemu"`
		Package string `json:"package"`
	} `json:"version"`
}

// Dial connects to the QMP socket at path, reads QEMU's greeting and leaves
// capability negotiation mode. ctx bounds the whole handshake.
func Dial(ctx context.Context, path string, opts ...Option) (*Conn, error) {
	o := options{eventBuffer: defaultEventBuffer}
	for _, opt := range opts {
		opt(&o)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial qmp: %w", err)
	}
	c := &Conn{
		conn:    nc.(*net.UnixConn),
		handler: o.handler,
		done:    make(chan struct{}),
		br:      bufio.NewReaderSize(nc, 64<<10),
		pending: make(map[uint64]chan reply),
	}
	if c.handler == nil {
		c.events = make(chan Event, max(o.eventBuffer, 0))
	}

	g, err := c.readGreeting(ctx)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("dial qmp %s: %w", path, err)
	}
	c.version = Version{
		Major:   g.Version.QEMU.Major,
		Minor:   g.Version.QEMU.Minor,
		Micro:   g.Version.QEMU.Micro,
		Package: g.Version.Package,
	}

	go c.read()
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		return nil, errors.Join(fmt.Errorf("dial qmp %s: %w", path, err), c.Close())
	}
	return c, nil
}

func (c *Conn) readGreeting(ctx context.Context) (*greeting, error) {
	stop := interruptOnDone(ctx, c.conn.SetReadDeadline)
	line, err := readLine(c.br)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read greeting: %w", context.Cause(ctx))
		}
		return nil, fmt.Errorf("read greeting: %w", err)
	}
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, fmt.Errorf("parse greeting: %w", err)
	}
	if m.QMP == nil {
		return nil, fmt.Errorf("greeting %.100q has no QMP member: %w", line, errkind.FailedPrecondition)
	}
	return m.QMP, nil
}

// Version returns the QEMU version from the greeting.
func (c *Conn) Version() Version { return c.version }

// Events returns the channel events are queued on, or nil when the Conn was
// dialed [WithEventHandler]. The channel is closed once the connection ends.
func (c *Conn) Events() <-chan Event { return c.events }

// DroppedEvents reports how many events were discarded because the Events
// channel was full.
func (c *Conn) DroppedEvents() uint64 { return c.dropped.Load() }

// Done is closed once the connection has ended (Close, QEMU exit, or a
// protocol error); Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it works.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Execute runs cmd with args (marshalled to JSON, omitted when nil) and
// unmarshals the reply into result unless result is nil. A failure reported
// by QEMU is an *[Error]. If ctx ends first, Execute returns its cause;
// QEMU may still run the command. A write that ctx interrupts may leave
// half a request on the socket, so it also ends the connection.
func (c *Conn) Execute(ctx context.Context, cmd string, args, result any) error {
	return c.execute(ctx, cmd, args, result, nil)
}

// SendFile passes f to QEMU under name (the getfd command with the
// descriptor attached as SCM_RIGHTS), for commands that take an fd name such
// as migrate "fd:name". QEMU holds its own copy; the caller still owns f.
func (c *Conn) SendFile(ctx context.Context, name string, f *os.File) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("qmp getfd %s: %w", name, err)
	}
	var oob []byte
	if err := sc.Control(func(fd uintptr) { oob = syscall.UnixRights(int(fd)) }); err != nil {
		return fmt.Errorf("qmp getfd %s: %w", name, err)
	}
	err = c.execute(ctx, "getfd", map[string]string{"fdname": name}, nil, oob)
	runtime.KeepAlive(f) // its descriptor must stay open until the message is sent
	return err
}

func (c *Conn) execute(ctx context.Context, cmd string, args, result any, oob []byte) error {
	if ctx.Err() != nil {
		return fmt.Errorf("qmp %s: %w", cmd, context.Cause(ctx))
	}
	id := c.nextID.Add(1)
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        uint64 `json:"id"`
	}{cmd, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp %s: encode arguments: %w", cmd, err)
	}
	b = append(b, '\n')

	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	c.pending[id] = ch
	c.mu.Unlock()

	if err := c.write(ctx, b, oob); err != nil {
		c.forget(id)
		if ctx.Err() != nil {
			return fmt.Errorf("qmp %s: %w", cmd, context.Cause(ctx))
		}
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}

	var r reply
	select {
	case r = <-ch:
	case <-c.done:
		select {
		case r = <-ch: // the reply raced with the end of the connection
		default:
			return fmt.Errorf("qmp %s: %w", cmd, c.Err())
		}
	case <-ctx.Done():
		c.forget(id)
		return fmt.Errorf("qmp %s: %w", cmd, context.Cause(ctx))
	}
	if r.err != nil {
		r.err.Command = cmd
		return r.err
	}
	if result != nil {
		if err := json.Unmarshal(r.ret, result); err != nil {
			return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
		}
	}
	return nil
}

// write sends one whole request. Any failure ends the connection, since a
// partial write leaves the stream unframed.
func (c *Conn) write(ctx context.Context, b, oob []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	stop := interruptOnDone(ctx, c.conn.SetWriteDeadline)
	err := c.writeAll(b, oob)
	stop()
	if err != nil {
		c.fail(fmt.Errorf("write: %w: %w", err, ErrDisconnected))
		return c.Err()
	}
	return nil
}

func (c *Conn) writeAll(b, oob []byte) error {
	if oob != nil {
		n, _, err := c.conn.WriteMsgUnix(b, oob, nil)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	_, err := c.conn.Write(b)
	return err
}

func (c *Conn) forget(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
}

// fail records why the connection ends (first cause wins) and closes the
// socket, which makes the reader exit.
func (c *Conn) fail(cause error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = cause
	}
	c.mu.Unlock()
	c.conn.Close()
}

// Close ends the connection and waits for the reader goroutine to exit.
// It is idempotent; later calls return nil. Pending and later Execute calls
// fail with an error wrapping [ErrClosed].
func (c *Conn) Close() error {
	var err error
	c.closing.Do(func() {
		c.mu.Lock()
		if c.err == nil {
			c.err = ErrClosed
		}
		c.mu.Unlock()
		if cerr := c.conn.Close(); !errors.Is(cerr, net.ErrClosed) {
			err = cerr // else the connection had already broken
		}
	})
	<-c.done
	return err
}

// read is the reader goroutine; Close waits for it.
func (c *Conn) read() {
	defer close(c.done)
	if c.events != nil {
		defer close(c.events)
	}
	var cause error
	for {
		line, err := readLine(c.br)
		if err != nil {
			cause = err
			break
		}
		if err := c.dispatch(line); err != nil {
			cause = err
			break
		}
	}
	c.fail(fmt.Errorf("read: %w: %w", cause, ErrDisconnected))
	c.mu.Lock()
	c.pending = nil
	c.mu.Unlock()
}

func (c *Conn) dispatch(line []byte) error {
	if len(bytes.TrimSpace(line)) == 0 {
		return nil
	}
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return fmt.Errorf("parse message %.100q: %w", line, err)
	}
	switch {
	case m.Event != "":
		ev := Event{Name: m.Event, Data: m.Data}
		if m.Timestamp != nil {
			ev.Timestamp = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
		}
		c.deliver(ev)
	case m.Return != nil || m.Error != nil:
		id, err := strconv.ParseUint(string(m.ID), 10, 64)
		if err != nil {
			// Not one of ours (we always send numeric ids); nobody waits for it.
			return nil
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- reply{ret: m.Return, err: m.Error} // buffered, never blocks
		}
	}
	// Anything else (a second greeting, unknown members) is ignored.
	return nil
}

func (c *Conn) deliver(ev Event) {
	if c.handler != nil {
		c.handler(ev)
		return
	}
	select {
	case c.events <- ev:
	default:
		c.dropped.Add(1)
	}
}

// errLineTooLong ends a connection whose peer sent more than MaxLineSize
// bytes without a newline.
var errLineTooLong = fmt.Errorf("message longer than %d bytes: %w", MaxLineSize, errkind.ResourceExhausted)

// readLine returns the next newline-terminated line, without buffering more
// than MaxLineSize bytes of it.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > MaxLineSize {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// interruptOnDone makes the I/O guarded by setDeadline fail once ctx ends,
// until the returned stop func is called. stop clears the deadline again,
// even if ctx ended in between.
func interruptOnDone(ctx context.Context, setDeadline func(time.Time) error) (stop func()) {
	var mu sync.Mutex
	stopped := false
	cancel := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			_ = setDeadline(time.Unix(1, 0))
		}
	})
	return func() {
		cancel()
		mu.Lock()
		stopped = true
		mu.Unlock()
		_ = setDeadline(time.Time{})
	}
}
