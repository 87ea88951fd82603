// Package client is the host side of the agent protocol: it runs commands in
// a guest and moves files in and out of it over one multiplexed connection.
//
// Everything the guest sends is untrusted. Frames are bounded
// (proto.MaxFrame), JSON replies are bounded and strictly decoded, every
// call honours its ctx, and nothing in a reply is ever used as a host path:
// file contents go to the io.Writer the caller gives.
package client

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/errkind"
)

// ErrClosed is returned by calls on a client whose connection is gone.
var ErrClosed = fmt.Errorf("agent connection closed: %w", errkind.Unavailable)

// ErrUnresponsive is wrapped by the cause a host gives CloseWithCause when
// it declares the agent unresponsive (it stopped answering heartbeats):
// calls in flight and later calls on the client fail with that cause.
var ErrUnresponsive = fmt.Errorf("agent unresponsive: %w", errkind.Unavailable)

// UnresponsiveError is the cause a host gives CloseWithCause when the
// agent gave no answer to its heartbeat for Silent. It matches
// ErrUnresponsive and errkind.Unavailable.
type UnresponsiveError struct {
	Silent time.Duration
}

func (e *UnresponsiveError) Error() string {
	return fmt.Sprintf("agent unresponsive: no heartbeat answer for %v", e.Silent)
}

// Is makes errors.Is(err, ErrUnresponsive) hold.
func (e *UnresponsiveError) Is(target error) bool { return target == ErrUnresponsive }

// Unwrap gives the error's kind.
func (e *UnresponsiveError) Unwrap() error { return errkind.Unavailable }

// UnaryTimeout bounds every call whose reply is a single frame (Health,
// Stat, Mkdir, Remove, SignalProcess, ...) when the caller's ctx has no
// deadline: a guest cannot keep one waiting forever, even one whose agent
// answers heartbeats but never this call (a hung file system under the
// path). Streaming calls (exec, file transfers, watches) are bounded by
// the caller's ctx and by the host's heartbeat, which closes the client
// once the agent stops answering.
const UnaryTimeout = 2 * time.Minute

// Client is a connection to one guest agent. It is safe for concurrent use.
type Client struct {
	sess         *yamux.Session
	agentVersion string
	ring         *ring.Session         // or nil: bulk bytes go inline
	ringStream   *stream               // the OpRing call, carrying releases; nil without a ring
	ringUnmap    func()                // lets go of the ring's mapping; nil without a ring
	stdinRefs    atomic.Bool           // the agent takes stdin through the ring (proto.RingFeatures)
	pageRefs     atomic.Bool           // the agent sends file reads as page references (proto.RingFeatures)
	memory       *ring.MemoryFile      // the VM's RAM, for page references; nil without
	closeCause   atomic.Pointer[error] // why CloseWithCause closed the client, or nil
}

// Dial runs the handshake on conn and starts the session. conn is owned by
// the Client from here on (closed by Close, or on error). ctx bounds the
// handshake only; a conn without deadlines is closed when ctx ends first.
func Dial(ctx context.Context, conn io.ReadWriteCloser, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	c, err := dial(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if o.ring != nil {
		if err := c.attachRing(ctx, o.ring); err != nil {
			c.Close()
			return nil, err
		}
	}
	if o.memory != nil && c.ring != nil {
		// Without it file reads are copied through the ring.
		c.memory, _ = ring.OpenMemory(*o.memory)
	}
	return c, nil
}

// helloEvery is how often the hello is repeated until the agent answers.
// A restored guest drops the first ones while it ends the session its
// snapshot was taken in, and each repeat is one short line, so it is
// frequent: the wait shows in every restore.
const helloEvery = 40 * time.Millisecond

func dial(ctx context.Context, conn io.ReadWriteCloser) (*Client, error) {
	var nb [16]byte
	rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	done := make(chan struct{})
	var handshakeErr error
	var ready proto.Ready
	br := bufio.NewReaderSize(conn, 4096)
	go func() {
		defer close(done)
		ready, handshakeErr = proto.ReadReady(br, nonce, proto.MaxHandshakeScan)
	}()
	// Repeat the hello until the reply: one sent while the guest was still
	// busy with an earlier session may be lost.
	hello := proto.Hello{Version: proto.Version, Nonce: nonce}.Line()
	tick := time.NewTicker(helloEvery)
	defer tick.Stop()
	for waiting := true; waiting; {
		if _, err := conn.Write(hello); err != nil {
			conn.Close() // unblocks the reader
			<-done
			return nil, fmt.Errorf("agent handshake: send hello: %w", err)
		}
		select {
		case <-done:
			waiting = false
		case <-tick.C:
		case <-ctx.Done():
			conn.Close() // unblocks the reader
			<-done
			return nil, fmt.Errorf("agent handshake: %w", context.Cause(ctx))
		}
	}
	if handshakeErr != nil {
		return nil, fmt.Errorf("agent handshake: %w", handshakeErr)
	}
	if _, err := conn.Write(proto.StartLine(nonce)); err != nil {
		return nil, fmt.Errorf("agent handshake: send start: %w", err)
	}
	if ready.Version != proto.Version {
		return nil, fmt.Errorf("agent speaks protocol %d, want %d: %w", ready.Version, proto.Version, errkind.FailedPrecondition)
	}
	sess, err := yamux.Client(proto.Buffered(br, conn), proto.YamuxConfig())
	if err != nil {
		return nil, fmt.Errorf("agent session: %w", err)
	}
	return &Client{sess: sess, agentVersion: ready.AgentVersion}, nil
}

// DialUnix connects to an agent channel exposed as a unix socket (QEMU's
// virtio-serial chardev) and runs the handshake.
func DialUnix(ctx context.Context, path string, opts ...Option) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w", err)
	}
	return Dial(ctx, conn, opts...)
}

// AgentVersion is the version the agent announced in the handshake. It is
// guest-controlled text (printable, at most 64 bytes).
func (c *Client) AgentVersion() string { return c.agentVersion }

// Close ends the session and closes the connection. Calls in flight fail.
func (c *Client) Close() error {
	return c.close()
}

// CloseWithCause is Close for a reason the calls should give: calls in
// flight and later ones fail with an error that wraps cause (not
// ErrClosed). The host closes a client with a cause wrapping
// ErrUnresponsive when its agent stopped answering. The first cause given
// sticks.
func (c *Client) CloseWithCause(cause error) error {
	c.closeCause.CompareAndSwap(nil, &cause)
	return c.close()
}

// closedErr is the error of a call on a closed session.
func (c *Client) closedErr() error {
	if p := c.closeCause.Load(); p != nil {
		return *p
	}
	return ErrClosed
}

func (c *Client) close() error {
	err := c.sess.Close()
	if c.ringUnmap != nil {
		c.ringUnmap() // waits for a copy under way; later ones fail
	}
	if c.memory != nil {
		c.memory.Close() // a read under way finishes first; later ones fail
	}
	return err
}

// Done is closed when the session ends, whoever ended it.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// stream is one call on the session.
type stream struct {
	// st is safe for concurrent use; mu only keeps frames whole.
	st *yamux.Stream // +checklocksignore
	r  *proto.Reader
	mu sync.Mutex // serializes writes
}

// open starts a call: it opens a stream and sends the request. The stream is
// closed when ctx ends.
func (c *Client) open(ctx context.Context, op proto.Op, args any) (*stream, func(), error) {
	p, err := json.Marshal(args)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: encode args: %w", op, err)
	}
	st, err := c.sess.OpenStream()
	if err != nil {
		if c.sess.IsClosed() {
			return nil, nil, fmt.Errorf("%s: %w", op, c.closedErr())
		}
		return nil, nil, fmt.Errorf("%s: open stream: %v: %w", op, err, errkind.Unavailable)
	}
	s := &stream{st: st, r: proto.NewReader(st, 0)}
	stop := context.AfterFunc(ctx, func() { st.Close() })
	release := func() {
		stop()
		st.Close()
	}
	if err := s.writeJSON(proto.TypeRequest, proto.Request{Op: op, Args: p}); err != nil {
		release()
		return nil, nil, c.callErr(ctx, op, err)
	}
	return s, release, nil
}

// unaryCtx gives ctx the deadline of a call with a single reply frame:
// its own, or UnaryTimeout from now.
func unaryCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, UnaryTimeout,
		fmt.Errorf("agent gave no answer in %v: %w", UnaryTimeout, errkind.Unavailable))
}

// readUntil makes the stream's reads fail at once when ctx ends, and
// returns the function that stops that. Closing the stream (open's
// AfterFunc) is not enough on its own: reads wait for the agent to close
// its side, and a frozen agent never does (yamux then gives up only after
// StreamCloseTimeout). Only for calls whose replies name no ring slots:
// a transfer's reader drains what the agent sends after it gave up.
func (s *stream) readUntil(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() { s.st.SetReadDeadline(time.Now()) })
}

func (s *stream) write(t proto.Type, p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return proto.WriteFrame(s.st, t, p)
}

func (s *stream) writeJSON(t proto.Type, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.write(t, p)
}

// callErr explains a stream failure: the ctx, the session, or the stream.
func (c *Client) callErr(ctx context.Context, op proto.Op, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", op, context.Cause(ctx))
	case c.sess.IsClosed():
		return fmt.Errorf("%s: %w", op, c.closedErr())
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%s: agent ended the call early: %w", op, errkind.Unavailable)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// protocolErr reports a reply that breaks the protocol.
func protocolErr(op proto.Op, format string, a ...any) error {
	return fmt.Errorf("%s: agent broke protocol: %s: %w", op, fmt.Sprintf(format, a...), errkind.Internal)
}

// simple makes a call whose reply is one result (or error) frame.
// ReclaimMemory has the guest give the memory it only caches back to the
// host (proto.OpMemoryReclaim). An agent older than the op gives an
// errkind.FailedPrecondition error saying so.
func (c *Client) ReclaimMemory(ctx context.Context) (proto.Reclaimed, error) {
	var r proto.Reclaimed
	err := c.simple(ctx, proto.OpMemoryReclaim, proto.Empty{}, &r)
	if errors.Is(err, errkind.InvalidArgument) {
		// The arguments are empty: the agent did not know the op.
		err = fmt.Errorf("agent %q cannot reclaim memory (built before it): %v: %w", c.agentVersion, err, errkind.FailedPrecondition)
	}
	return r, err
}

func (c *Client) simple(ctx context.Context, op proto.Op, args, result any) error {
	return c.simpleMax(ctx, op, args, proto.MaxControl, result)
}

// simpleMax is simple with a result of up to max bytes. Without a
// deadline in ctx the call gets UnaryTimeout.
func (c *Client) simpleMax(ctx context.Context, op proto.Op, args any, max int, result any) error {
	ctx, cancel := unaryCtx(ctx)
	defer cancel()
	s, release, err := c.open(ctx, op, args)
	if err != nil {
		return err
	}
	defer release()
	defer s.readUntil(ctx)()
	f, err := s.r.Next()
	if err != nil {
		return c.callErr(ctx, op, err)
	}
	return decodeResult(op, f, max, result)
}

// decodeResult decodes a result frame into v, or returns the error an error
// frame carries.
func decodeResult(op proto.Op, f proto.Frame, max int, v any) error {
	switch f.Type {
	case proto.TypeResult:
		if err := proto.DecodeJSON(f, max, v); err != nil {
			return protocolErr(op, "result: %v", err)
		}
		return nil
	case proto.TypeError:
		var e proto.Error
		if err := proto.DecodeJSON(f, 0, &e); err != nil {
			return protocolErr(op, "error frame: %v", err)
		}
		return fmt.Errorf("%s: %w", op, e.Err())
	}
	return protocolErr(op, "unexpected %s frame", f.Type)
}

// Health asks the agent for its version and uptime.
func (c *Client) Health(ctx context.Context) (proto.Health, error) {
	var h proto.Health
	err := c.simple(ctx, proto.OpHealth, proto.Empty{}, &h)
	return h, err
}

// WaitReady calls Health until it answers or ctx ends. Use it right after a
// boot or restore.
func (c *Client) WaitReady(ctx context.Context) error {
	for {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Health(hctx)
		cancel()
		if err == nil || ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return err
		}
	}
}

// PostRestore fixes up a restored or forked guest: clock, RNG and, when
// given, hostname and network.
func (c *Client) PostRestore(ctx context.Context, pr proto.PostRestore) error {
	return c.simple(ctx, proto.OpPostRestore, pr, &proto.Empty{})
}

// ConfigureNetwork (re)addresses the guest's interfaces.
func (c *Client) ConfigureNetwork(ctx context.Context, cfg proto.NetConfig) error {
	return c.simple(ctx, proto.OpNetwork, cfg, &proto.Empty{})
}

// Shutdown asks the guest to power off (or reboot). It returns once the agent
// acknowledged; the VMM process exits shortly after.
func (c *Client) Shutdown(ctx context.Context, reboot bool) error {
	return c.simple(ctx, proto.OpShutdown, proto.Shutdown{Reboot: reboot}, &proto.Empty{})
}

// OpenRaw opens a bare stream on the session and returns it without sending
// anything. It exists for protocol conformance tests and debugging tools that
// must send frames the typed calls never would.
func (c *Client) OpenRaw() (io.ReadWriteCloser, error) {
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open stream: %v: %w", err, errkind.Unavailable)
	}
	return st, nil
}

// DialUnixWait connects to an agent channel that may not be up yet (a VM
// that is still booting). QEMU accepts the connection before the guest
// opens its port and holds the hello until it does, so one attempt usually
// suffices.
func DialUnixWait(ctx context.Context, path string, opts ...Option) (*Client, error) {
	return DialWait(ctx, func(ctx context.Context) (*Client, error) { return DialUnix(ctx, path, opts...) })
}

// DialWait calls dial until it yields a client whose agent answers a health
// call, or ctx ends. Use it for a guest that is booting or restoring: until
// its agent listens, dials fail or go unanswered.
func DialWait(ctx context.Context, dial func(context.Context) (*Client, error)) (*Client, error) {
	var last error
	for {
		c, err := dial(ctx)
		if err == nil {
			if err = c.WaitReady(ctx); err == nil {
				return c, nil
			}
			c.Close()
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("agent not ready: %w (last error: %v)", context.Cause(ctx), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
