package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// The HTTP proxy. Every connection to a name that carries HTTP, in TLS or
// not, is served here rather than copied: the gateway is the guest's HTTP
// server (TLS with a certificate of the sandbox's CA; ALPN h2 or
// http/1.1) and decides each request on its own, against the policy in
// force and the name the connection was opened to: each HTTP/1.x
// request's Host and target, each HTTP/2 stream's :authority, each
// upgrade. A request for another authority gets 421 and is never
// forwarded; the gateway sends allowed ones on over its own connections
// to the name, TLS verified against the host's roots.

// connKey is the request context key of the *conn a request came on.
type connKey struct{}

// httpProxy serves the guest's HTTP connections.
type httpProxy struct {
	g     *Gateway
	srv   *http.Server
	ln    *connListener
	rp    *httputil.ReverseProxy
	tr    *http.Transport
	done  chan struct{} // closed when Serve returns
	close sync.Once
}

func newHTTPProxy(g *Gateway) *httpProxy {
	p := &httpProxy{g: g, ln: newConnListener(), done: make(chan struct{})}
	p.tr = &http.Transport{
		DialContext:           g.dialUpstream,
		TLSClientConfig:       &tls.Config{RootCAs: g.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   15 * time.Second,
		IdleConnTimeout:       60 * time.Second,
		MaxIdleConnsPerHost:   16,
		MaxConnsPerHost:       64, // an HTTP/2 guest's streams to an HTTP/1 upstream
		ExpectContinueTimeout: time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.tr,
		FlushInterval:  -1, // streams (server-sent events, LLM tokens) as they come
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamError,
		ErrorLog:       log.New(io.Discard, "", 0),
	}
	p.srv = &http.Server{
		Handler: http.HandlerFunc(p.serveHTTP),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, connOf(c))
		},
		ReadHeaderTimeout: 60 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(p.done)
		p.srv.Serve(p.ln)
	}()
	return p
}

// serve hands the guest's connection to the HTTP server; it returns at
// once (the connection's conn says when it ends).
func (p *httpProxy) serve(c net.Conn) bool { return p.ln.push(c) }

// shut stops the server, its connections and the upstream's.
func (p *httpProxy) shut() {
	p.close.Do(func() {
		p.srv.Close()
		<-p.done
		p.tr.CloseIdleConnections()
	})
}

// connOf is the *conn under a connection the server serves.
func connOf(c net.Conn) *conn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if gc, ok := c.(*guestConn); ok {
		return gc.c
	}
	return nil
}

// serveHTTP decides one request from the guest.
func (p *httpProxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	c, _ := r.Context().Value(connKey{}).(*conn)
	if c == nil {
		http.Error(w, "space egress: no connection", http.StatusInternalServerError)
		return
	}
	c.requests.Add(1)
	pol := p.g.Policy()
	host, why := requestAuthority(r, c)
	secrets := pol.secretsFor(c.name)
	code, class := http.StatusForbidden, refusedNotAllowed
	switch {
	case why != "":
		code = http.StatusMisdirectedRequest
	case r.Method == http.MethodConnect:
		why = "CONNECT is not proxied: open a connection to the host itself"
		code = http.StatusMethodNotAllowed
	case !pol.allowsHostPort(c.name, c.port):
		why = "the policy does not allow " + c.String()
	case len(secrets) > 0 && (r.Method == "TRACE" || r.Method == "TRACK"):
		why = r.Method + " to a host the sandbox's secrets go to is refused (it would echo them)"
		code, class = http.StatusMethodNotAllowed, refusedSecretEcho
	}
	if why != "" {
		p.refuse(w, r, c, host, code, class, why)
		return
	}
	ctx := r.Context()
	if len(secrets) > 0 {
		if c.modeName() == ModeHTTPS {
			if err := injectRequest(r, secrets); err != nil {
				p.refuse(w, r, c, host, http.StatusRequestEntityTooLarge, refusedTooLarge, err.Error())
				return
			}
			c.injected.Store(true)
		}
		// What comes back must be readable to be scrubbed: the
		// transport asks for gzip itself and decodes it.
		r.Header.Del("Accept-Encoding")
		r.Header.Del("Sec-WebSocket-Extensions") // no compressed frames
		sc := newScrubber(secrets)
		if sc != nil {
			sc.m = p.g.cfg.Metrics
		}
		ctx = context.WithValue(ctx, scrubKey{}, sc)
	}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if ap, err := netip.ParseAddrPort(info.Conn.RemoteAddr().String()); err == nil {
			c.setUpstream(ap.Addr().Unmap())
		}
	}})
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// scrubKey is the request context key of the request's *scrubber.
type scrubKey struct{}

// requestAuthority returns the host r names and, if it is not the one
// c was opened to (on c's port), why it is refused.
func requestAuthority(r *http.Request, c *conn) (host, why string) {
	// net/http puts here an HTTP/1 absolute target's authority (over
	// any Host header), else the Host or, on HTTP/2, :authority; an
	// HTTP/2 :path may still be an absolute target of its own.
	authority := r.Host
	if authority == "" {
		return c.name, "" // HTTP/1.0 without a Host: the connection's
	}
	host, port := authority, ""
	if h, p, err := net.SplitHostPort(authority); err == nil {
		host, port = h, p
	}
	host = normalize(host)
	switch {
	case host != c.name:
		return host, fmt.Sprintf("a request for %q on a connection opened to %s", host, c.name)
	case port != "" && port != strconv.Itoa(int(c.port)):
		return host, fmt.Sprintf("a request for port %s on a connection opened to %s", port, c.String())
	case r.URL.Host != "" && targetHost(r.URL.Host) != host:
		return host, fmt.Sprintf("a request target for %q on a connection opened to %s", r.URL.Host, c.name)
	}
	return host, ""
}

// targetHost is the host of a request target's authority, normalized.
func targetHost(authority string) string {
	if h, _, err := net.SplitHostPort(authority); err == nil {
		return normalize(h)
	}
	return normalize(authority)
}

// refuse answers a request the gateway does not forward, audits it and,
// on HTTP/1, ends the connection (it is not reused for anything else).
func (p *httpProxy) refuse(w http.ResponseWriter, r *http.Request, c *conn, host string, code int, class denial, why string) {
	c.refused.Add(1)
	if r.ProtoMajor < 2 {
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Space-Egress", "refused")
	w.WriteHeader(code)
	fmt.Fprintf(w, "space egress: %s\n", why)
	p.g.audit(Event{Proto: "http", Name: host, Port: c.port, Mode: c.modeName(), Method: r.Method, Reason: why}, class)
}

// rewrite sends an allowed request to the connection's own name.
func (p *httpProxy) rewrite(pr *httputil.ProxyRequest) {
	c := pr.In.Context().Value(connKey{}).(*conn)
	scheme := "http"
	if c.modeName() == ModeHTTPS {
		scheme = "https"
	}
	pr.Out.URL.Scheme = scheme
	pr.Out.URL.Host = net.JoinHostPort(c.name, strconv.Itoa(int(c.port)))
	pr.Out.Host = pr.In.Host
	if pr.Out.Host == "" {
		pr.Out.Host = c.name
	}
}

// errUnscrubbable is a response from a secret's host the gateway cannot
// read to scrub.
var errUnscrubbable = errors.New("a response from a host the sandbox's secrets go to, in an encoding the gateway cannot read to scrub them")

// modifyResponse scrubs a response from a secret's host.
func (p *httpProxy) modifyResponse(resp *http.Response) error {
	s, _ := resp.Request.Context().Value(scrubKey{}).(*scrubber)
	if s == nil {
		return nil
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && ce != "identity" {
		return fmt.Errorf("%w (%s)", errUnscrubbable, ce)
	}
	s.header(resp.Header)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = s.maskRWC(rwc)
		}
		return nil
	}
	resp.Body = s.reader(resp.Body, resp.Trailer)
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return nil
}

// upstreamError answers a request the upstream did not answer.
func (p *httpProxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	c, _ := r.Context().Value(connKey{}).(*conn)
	code := http.StatusBadGateway
	if errors.Is(err, context.Canceled) {
		return // the guest went away
	}
	if c != nil {
		p.refuse(w, r, c, c.name, code, refusedFailed, "upstream: "+err.Error())
	}
}

// dialUpstream dials "name:port" for the HTTP transport, as a dial for a
// name is made (dialName).
func (g *Gateway) dialUpstream(ctx context.Context, _, addr string) (net.Conn, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil, err
	}
	up, _, err := g.dialName(ctx, host, uint16(port))
	return up, err
}

// connListener is a net.Listener of the connections pushed to it.
type connListener struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), closed: make(chan struct{})}
}

// push hands c to Accept; false once the listener is closed.
func (l *connListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.TCPAddr{} }
