package egress

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Connection modes, as the audit log says them (Event.Mode).
const (
	// ModeHTTPS is TLS the gateway terminates with the sandbox's CA, its
	// requests decided one by one and forwarded over TLS it verifies.
	ModeHTTPS = "https"
	// ModeHTTP is plain HTTP, its requests decided one by one.
	ModeHTTP = "http"
	// ModePassthrough is TLS left opaque by a tls=passthrough rule:
	// decided by its SNI alone.
	ModePassthrough = "tls-passthrough"
	// ModeTCP is TCP that is neither TLS nor HTTP, to a name a rule
	// allows on that port: decided when it opens.
	ModeTCP = "tcp"
	// ModeAddr is a connection to an address an address rule allows:
	// decided when it opens, not inspected.
	ModeAddr = "ip"
)

// conn is a connection from the guest the gateway serves: it is counted
// against the policy's limit, closed when a new policy refuses it, and
// audited once when it ends.
type conn struct {
	name      string     // the name it was opened to; "" for an address
	dst       netip.Addr // the address the guest connected to
	port      uint16
	closeOnce sync.Once
	done      chan struct{} // closed by close

	mode     atomic.Pointer[string]
	upstream atomic.Pointer[netip.Addr] // the address last dialed for it
	requests atomic.Int64
	refused  atomic.Int64 // requests refused
	injected atomic.Bool
	in       atomic.Int64 // bytes to the guest
	out      atomic.Int64 // bytes from the guest

	mu sync.Mutex
	// +checklocks:mu
	closers []func() error // what close closes
	// +checklocks:mu
	reason string // why the gateway ended it, or ""
}

func newConn(name string, dst netip.Addr, port uint16) *conn {
	return &conn{name: name, dst: dst, port: port, done: make(chan struct{})}
}

func (c *conn) setMode(m string)         { c.mode.Store(&m) }
func (c *conn) setUpstream(a netip.Addr) { c.upstream.Store(&a) }

// modeName is the connection's mode, "" until it is known.
func (c *conn) modeName() string {
	if m := c.mode.Load(); m != nil {
		return *m
	}
	return ""
}

func (c *conn) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// String is "name:port" or "addr:port".
func (c *conn) String() string {
	if c.name != "" {
		return c.name + ":" + strconv.Itoa(int(c.port))
	}
	return netip.AddrPortFrom(c.dst, c.port).String()
}

// onClose adds f to what close closes; if c is closed already, f runs
// at once.
func (c *conn) onClose(f func() error) {
	c.mu.Lock()
	if !c.isClosed() {
		c.closers = append(c.closers, f)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	f()
}

// close ends the connection (both sides), saying why if the gateway
// ends it ("" when it ended by itself).
func (c *conn) close(reason string) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.reason = reason
		closers := c.closers
		c.closers = nil
		close(c.done)
		c.mu.Unlock()
		for _, f := range closers {
			f()
		}
	})
}

// event is the audit event of the ended connection.
func (c *conn) event() Event {
	ev := Event{Proto: "tcp", Name: c.name, Port: c.port, Allowed: true, BytesIn: c.in.Load(), BytesOut: c.out.Load(),
		Requests: c.requests.Load(), Injected: c.injected.Load()}
	ev.Mode = c.modeName()
	if c.name == "" {
		ev.Addr = c.dst.String()
	} else if a := c.upstream.Load(); a != nil {
		ev.Addr = a.String()
	}
	c.mu.Lock()
	ev.Reason = c.reason
	c.mu.Unlock()
	if n := c.refused.Load(); n > 0 && ev.Reason == "" {
		ev.Reason = strconv.FormatInt(n, 10) + " requests refused (logged each)"
	}
	return ev
}

// track counts c as open, unless the policy's limit is reached.
func (g *Gateway) track(c *conn, p Policy) bool {
	limit := p.MaxConns
	if limit == 0 {
		limit = DefaultMaxConns
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.open) >= limit {
		return false
	}
	g.open[c] = struct{}{}
	g.cfg.Metrics.opened()
	return true
}

func (g *Gateway) untrack(c *conn) {
	g.mu.Lock()
	_, tracked := g.open[c]
	delete(g.open, c)
	g.mu.Unlock()
	if tracked {
		g.cfg.Metrics.closed()
	}
}

// enforce closes the open connections p refuses, at once.
func (g *Gateway) enforce(p Policy) {
	refused := map[*conn]string{}
	g.mu.Lock()
	for c := range g.open {
		if why := refusal(p, c); why != "" {
			refused[c] = why
		}
	}
	g.mu.Unlock()
	for c, why := range refused {
		c.close("closed by a policy change: " + why)
	}
}

// refusal says why p refuses the open connection c, or "" if it allows
// it.
func refusal(p Policy, c *conn) string {
	if p.Off {
		return "the network is off"
	}
	if c.name == "" {
		if !p.allowsAddr(c.dst, c.port) {
			return "no address rule covers " + c.String()
		}
		return ""
	}
	a := p.nameAccess(c.name, c.port)
	m := c.modeName()
	switch {
	case !a.allowed:
		return "the policy does not allow " + c.String()
	case m == ModePassthrough && !a.passthrough:
		return "no tls=passthrough rule covers " + c.String() + " any more"
	case m == ModeTCP && !a.tcp:
		return "no rule names " + c.String() + " for TCP any more"
	}
	return ""
}

// guestConn is the guest's side of a connection as the gateway reads
// and writes it: bytes it has read already first, then the connection;
// counted, and through the policy's bandwidth limit.
type guestConn struct {
	net.Conn
	g *Gateway
	c *conn
	r io.Reader
}

func newGuestConn(g *Gateway, c *conn, nc net.Conn) *guestConn {
	return &guestConn{Conn: nc, g: g, c: c, r: nc}
}

// unread puts b back in front of what is still to be read.
func (gc *guestConn) unread(b []byte) {
	if len(b) > 0 {
		gc.r = io.MultiReader(bytes.NewReader(b), gc.r)
	}
}

func (gc *guestConn) Read(p []byte) (int, error) {
	n, err := gc.r.Read(p)
	if n > 0 {
		gc.c.out.Add(int64(n))
		gc.g.wait(n)
	}
	return n, err
}

func (gc *guestConn) Write(p []byte) (int, error) {
	if gc.g.currentLimiter() == nil {
		n, err := gc.Conn.Write(p)
		gc.c.in.Add(int64(n))
		return n, err
	}
	var n int
	for len(p) > 0 {
		k := min(len(p), 32<<10)
		gc.g.wait(k)
		w, err := gc.Conn.Write(p[:k])
		n += w
		gc.c.in.Add(int64(w))
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// Close closes the whole connection the guest opened.
func (gc *guestConn) Close() error {
	gc.c.close("")
	return nil
}

// CloseWrite half-closes the guest's side.
func (gc *guestConn) CloseWrite() error {
	if cw, ok := gc.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// wait takes n bytes from the bandwidth limit, if there is one.
func (g *Gateway) wait(n int) {
	if lim := g.currentLimiter(); lim != nil {
		for n > 0 {
			k := min(n, lim.Burst())
			lim.WaitN(g.ctx, k)
			n -= k
		}
	}
}

// readFirst reads what the guest sends first, waiting at most wait; it
// returns no bytes and no error when the guest stayed silent.
func readFirst(gc *guestConn, wait time.Duration) ([]byte, error) {
	gc.SetReadDeadline(time.Now().Add(wait))
	defer gc.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	n, err := gc.r.Read(buf)
	if n > 0 {
		return buf[:n], nil
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return nil, nil
	}
	return nil, err
}

// relay copies both ways between the guest and up until both are done.
func (g *Gateway) relay(gc *guestConn, up net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(up, gc)
		closeWrite(up)
	})
	wg.Go(func() {
		io.Copy(gc, up)
		gc.CloseWrite()
	})
	wg.Wait()
}

// dialCtx is the context of a dial for a connection: it ends with the
// gateway, and after timeout.
func (g *Gateway) dialCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(g.ctx, 15*time.Second)
}
