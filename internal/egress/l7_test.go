package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"space/internal/egress/egresstest"
)

// The tests below play a guest with root that has one site allowed
// (api.test) on an upstream address that also serves other.test and
// x.wild.test with one certificate: a shared CDN address. Whatever the
// guest does on a connection opened to api.test, only api.test's
// requests may reach the upstream.

// tlsConn opens a TLS connection from the guest to addr:443 with SNI sni,
// trusting roots, offering protos (ALPN).
func tlsConn(t *testing.T, g *guest, roots *x509.CertPool, addr netip.Addr, sni string, protos ...string) *tls.Conn {
	t.Helper()
	c, err := g.dial(addr, 443)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots, NextProtos: protos})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS handshake with %s: %v", sni, err)
	}
	return tc
}

// exchange writes raw requests on c, then reads n responses.
func exchange(t *testing.T, c net.Conn, raw string, n int) []string {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	var out []string
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			out = append(out, "error: "+err.Error())
			break
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out = append(out, resp.Status+" "+strings.TrimSpace(string(b)))
	}
	return out
}

// sawHost reports whether the upstream was ever sent a request for host.
func sawHost(u *egresstest.Upstream, host string) bool {
	for _, r := range u.Requests() {
		if strings.HasPrefix(r.Host, host) {
			return true
		}
	}
	return false
}

func TestEveryRequestIsDecided(t *testing.T) {
	_, g, u, log := setup(t, "api.test")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")

	get := func(host string) string {
		return fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	}
	for _, tc := range []struct {
		name string
		tls  bool
		raw  string
		want []string // status prefixes
	}{
		{"the allowed host twice", true, get("api.test") + get("api.test"), []string{"200", "200"}},
		{"pipelined, another Host second", true, get("api.test") + get("other.test"), []string{"200", "421"}},
		{"another Host inside TLS", true, get("other.test"), []string{"421"}},
		{"Host with a trailing dot and case", true, get("API.test."), []string{"200"}},
		{"absolute target to another host", true, "GET https://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", []string{"421"}},
		{"another port in Host", true, get("api.test:8443"), []string{"421"}},
		{"websocket upgrade to another Host", true, "GET /ws HTTP/1.1\r\nHost: other.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", []string{"421"}},
		{"CONNECT to another host", true, "CONNECT other.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n", []string{"421"}},
		{"CONNECT to the allowed name", true, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n", []string{"405"}},
		{"plain HTTP, pipelined", false, get("api.test") + get("other.test"), []string{"200", "421"}},
		{"plain HTTP, absolute target", false, "GET http://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", []string{"421"}},
		{"plain HTTP, duplicate Host", false, "GET / HTTP/1.1\r\nHost: api.test\r\nHost: other.test\r\n\r\n", []string{"400"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c net.Conn
			if tc.tls {
				c = tlsConn(t, g, g.roots, api[0], "api.test", "http/1.1")
			} else {
				var err error
				if c, err = g.dial(api[0], 80); err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
			}
			got := exchange(t, c, tc.raw, len(tc.want))
			for i, w := range tc.want {
				if i >= len(got) || !strings.HasPrefix(got[i], w) {
					t.Errorf("responses = %q, want statuses %v", got, tc.want)
					break
				}
			}
			if tc.want[len(tc.want)-1] != "200" {
				// A refusal ends the connection: nothing more goes on it.
				if resp := exchange(t, c, get("api.test"), 1); strings.HasPrefix(resp[0], "200") {
					t.Errorf("the connection served a request after a refusal: %q", resp)
				}
			}
		})
	}
	// Keep-alive: an answered request, then another Host on the same
	// connection.
	c := tlsConn(t, g, g.roots, api[0], "api.test", "http/1.1")
	if got := exchange(t, c, get("api.test"), 1); !strings.HasPrefix(got[0], "200") {
		t.Fatalf("first request = %q", got)
	}
	if got := exchange(t, c, get("other.test"), 1); !strings.HasPrefix(got[0], "421") {
		t.Errorf("a second request for other.test on a kept-alive connection = %q, want 421", got)
	}
	if sawHost(u, "other.test") {
		t.Errorf("the upstream was sent a request for other.test: %v", u.Requests())
	}
	log.find(t, func(e Event) bool {
		return e.Proto == "http" && e.Name == "other.test" && e.Mode == ModeHTTPS && strings.Contains(e.Reason, "opened to api.test")
	})
	log.find(t, func(e Event) bool { return e.Proto == "http" && e.Name == "other.test" && e.Mode == ModeHTTP })
	log.find(t, func(e Event) bool { return e.Proto == "tcp" && e.Allowed && e.Mode == ModeHTTPS && e.Requests >= 1 })
}

// TestHTTP2 checks that HTTP/2 works through the gateway, with several
// requests on one connection, and that a stream for another :authority
// on it is refused while the connection's other streams go on.
func TestHTTP2(t *testing.T) {
	_, g, u, log := setup(t, "api.test")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	dials := 0
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			dials++
			c, err := g.dial(api[0], 443)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: g.roots, NextProtos: []string{"h2"}})
			return tc, tc.HandshakeContext(ctx)
		},
		ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	do := func(authority string) (string, string) {
		req, _ := http.NewRequest("GET", "https://api.test/echo", nil)
		req.Host = authority
		resp, err := client.Do(req)
		if err != nil {
			return "error", err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.Proto + " " + resp.Status, string(b)
	}
	for i, authority := range []string{"api.test", "other.test", "api.test", "x.wild.test", "api.test"} {
		status, body := do(authority)
		want := "HTTP/2.0 200 OK"
		if authority != "api.test" {
			want = "HTTP/2.0 421 Misdirected Request"
		}
		if status != want {
			t.Errorf("request %d for %s = %s %q, want %s", i, authority, status, body, want)
		}
		if authority == "api.test" {
			var e egresstest.Echo
			if json.Unmarshal([]byte(body), &e) != nil || e.Host != "api.test" {
				t.Errorf("upstream saw %q", body)
			}
		}
	}
	if dials != 1 {
		t.Errorf("%d connections for 5 requests, want 1 (refused streams do not end the connection)", dials)
	}
	if sawHost(u, "other.test") || sawHost(u, "x.wild.test") {
		t.Errorf("the upstream was sent a request for another authority: %v", u.Requests())
	}
	log.find(t, func(e Event) bool { return e.Proto == "http" && e.Name == "other.test" && e.Mode == ModeHTTPS })
}

// TestWebSocket checks an upgrade to the allowed host works end to end.
func TestWebSocket(t *testing.T) {
	_, g, _, _ := setup(t, "api.test")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := g.dial(api[0], 443)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: g.roots, NextProtos: []string{"http/1.1"}})
			return tc, tc.HandshakeContext(ctx)
		},
	}}
	ws, _, err := websocket.Dial(ctx, "wss://api.test/ws", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("websocket to api.test: %v", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	_, msg, err := ws.Read(ctx)
	if err != nil || !strings.HasPrefix(string(msg), "ping ") {
		t.Errorf("websocket echo = %q, %v", msg, err)
	}
}

// TestPassthrough checks a tls=passthrough rule: a client that pins its
// upstream's CA works (the gateway terminates nothing), the SNI still
// decides, and the log says so.
func TestPassthrough(t *testing.T) {
	_, g, u, log := setup(t, "api.test:443 tls=passthrough", "other.test")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	other, _, _ := g.resolve(t, gatewayIP, "other.test")
	if got, err := httpsGetTrusting(g, u.Pool, api[0], "api.test", "api.test", "/"); err != nil || got != "200 OK hello api.test" {
		t.Errorf("pinned client through passthrough = %q, %v", got, err)
	}
	log.find(t, func(e Event) bool { return e.Name == "api.test" && e.Allowed && e.Mode == ModePassthrough })
	if got, err := httpsGetTrusting(g, u.Pool, other[0], "other.test", "other.test", "/"); err == nil {
		t.Errorf("pinned client to other.test (terminated: the gateway's certificate) = %q, want a TLS error", got)
	}
	if _, err := httpsGetTrusting(g, u.Pool, api[0], "other.test", "other.test", "/"); err == nil {
		t.Errorf("passthrough with another SNI worked")
	}
	log.find(t, func(e Event) bool { return e.Name == "api.test" && strings.Contains(e.Reason, `names "other.test"`) })
}

// TestOtherTCP checks TCP that is neither TLS nor HTTP: refused to a
// name without a rule naming the port; with one, a server that speaks
// first works, and a guest that waits and then speaks TLS or HTTP is
// decided as such.
func TestOtherTCP(t *testing.T) {
	_, g, u, log := setup(t, "api.test", fmt.Sprintf("other.test:%d", egresstest.BannerPort), "x.wild.test:443")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	other, _, _ := g.resolve(t, gatewayIP, "other.test")
	wild, _, _ := g.resolve(t, gatewayIP, "x.wild.test")

	c, err := g.dial(api[0], egresstest.BannerPort)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "\x00\x01binary")
	if b, _ := io.ReadAll(c); len(b) != 0 {
		t.Errorf("non-HTTP TCP to api.test (no port rule) answered %q", b)
	}
	c.Close()
	log.find(t, func(e Event) bool {
		return e.Name == "api.test" && strings.Contains(e.Reason, "needs a rule naming its port")
	})

	c, err = g.dial(other[0], egresstest.BannerPort)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || line != egresstest.Banner {
		t.Errorf("banner = %q, %v", line, err)
	}
	io.WriteString(c, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "hello\n" {
		t.Errorf("echo = %q, %v", line, err)
	}
	c.Close()
	log.find(t, func(e Event) bool { return e.Name == "other.test" && e.Allowed && e.Mode == ModeTCP })

	// A guest that stays silent past the wait and then sends TLS for
	// another name to a port a rule names: still decided by its SNI.
	c, err = g.dial(wild[0], 443)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(serverFirstWait + 500*time.Millisecond) // past the gateway's wait: the point of the test
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: "other.test", RootCAs: u.Pool})
	if err := tc.Handshake(); err == nil {
		t.Errorf("TLS for other.test after a silence on a connection to x.wild.test:443 was passed")
	}
	c.Close()
	log.find(t, func(e Event) bool { return e.Name == "x.wild.test" && strings.Contains(e.Reason, `names "other.test"`) })
	// And the same silence, then TLS for the right name, is served.
	c, err = g.dial(wild[0], 443)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(serverFirstWait + 500*time.Millisecond)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc = tls.Client(c, &tls.Config{ServerName: "x.wild.test", RootCAs: g.roots})
	if got := exchange(t, tc, "GET / HTTP/1.1\r\nHost: x.wild.test\r\n\r\n", 1); got[0] != "200 OK hello x.wild.test" {
		t.Errorf("after a silence, https://x.wild.test/ = %q", got)
	}
	c.Close()
}

// TestSecretsNeverComeBack checks responses from a secret's host: an
// echo of the request gives the placeholder back, never the value, in
// headers and bodies, compressed or not; TRACE is refused; a response in
// an encoding the gateway cannot read is refused.
func TestSecretsNeverComeBack(t *testing.T) {
	gw, g, _, log := setupWith(t, func(c *Config) {
		c.Policy.Secrets = []Secret{{Name: "api-key", Placeholder: placeholder, Value: []byte(secretValue),
			Hosts: []string{"api.test"}, Header: "X-Api-Key", Format: "Key {}"}}
	}, "api.test")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	tc := tlsConn(t, g, g.roots, api[0], "api.test", "http/1.1")
	for _, req := range []string{
		"POST /echo?key=" + placeholder + " HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + placeholder +
			"\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(placeholder)+2) + "\r\n\r\n\"" + placeholder + "\"",
		"GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: " + placeholder + "\r\nAccept-Encoding: gzip\r\n\r\n",
	} {
		io.WriteString(tc, req)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatalf("echo: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		all := fmt.Sprint(resp.Header) + string(b)
		if strings.Contains(all, secretValue) || resp.StatusCode != 200 {
			t.Errorf("the echo gave the guest the secret's value (or failed: %s): %s", resp.Status, all)
		}
		if !strings.Contains(all, placeholder) {
			t.Errorf("the echo holds no placeholder: %s", all)
		}
		if resp.Header.Get("Content-Encoding") != "" {
			t.Errorf("a compressed echo came back compressed (%s): the gateway must read it to scrub it", resp.Header.Get("Content-Encoding"))
		}
	}
	tc = tlsConn(t, g, g.roots, api[0], "api.test", "http/1.1")
	got := exchange(t, tc, "TRACE / HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: "+placeholder+"\r\n\r\n", 1)
	if !strings.HasPrefix(got[0], "405") || strings.Contains(got[0], secretValue) {
		t.Errorf("TRACE to a secret's host = %q, want 405", got)
	}
	tc = tlsConn(t, g, g.roots, api[0], "api.test", "http/1.1")
	got = exchange(t, tc, "GET /brotli HTTP/1.1\r\nHost: api.test\r\nAuthorization: "+placeholder+"\r\n\r\n", 1)
	if !strings.HasPrefix(got[0], "502") || strings.Contains(got[0], secretValue) {
		t.Errorf("an unreadable encoding from a secret's host = %q, want 502", got)
	}
	log.find(t, func(e Event) bool { return e.Method == "TRACE" && !e.Allowed })

	// A policy without the secret: the same connection's next request
	// carries the placeholder only.
	tc = tlsConn(t, g, g.roots, api[0], "api.test", "http/1.1")
	got = exchange(t, tc, "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: "+placeholder+"\r\n\r\n", 1)
	if !strings.Contains(got[0], placeholder) {
		t.Fatalf("echo = %q", got)
	}
	gw.SetPolicy(Policy{Allow: mustRules(t, "api.test")})
	got = exchange(t, tc, "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: "+placeholder+"\r\n\r\n", 1)
	var e egresstest.Echo
	if len(got) == 0 || !strings.HasPrefix(got[0], "200") || json.Unmarshal([]byte(strings.TrimPrefix(got[0], "200 OK ")), &e) != nil ||
		e.Header.Get("Authorization") != placeholder || e.Header.Get("X-Api-Key") != "" {
		t.Errorf("after the secret's revocation the upstream saw %q, want the placeholder and no X-Api-Key", got)
	}
}

// TestPolicyChangeClosesConnections checks that connections a new policy
// refuses are closed at once, whatever their mode, and logged so; others
// stay open.
func TestPolicyChangeClosesConnections(t *testing.T) {
	gw, g, u, log := setup(t, "api.test", "other.test:443 tls=passthrough", "x.wild.test")
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	other, _, _ := g.resolve(t, gatewayIP, "other.test")
	wild, _, _ := g.resolve(t, gatewayIP, "x.wild.test")
	terminated := tlsConn(t, g, g.roots, api[0], "api.test", "http/1.1")
	passed := tlsConn(t, g, u.Pool, other[0], "other.test", "http/1.1")
	kept := tlsConn(t, g, g.roots, wild[0], "x.wild.test", "http/1.1")
	for _, c := range []struct {
		c    net.Conn
		host string
	}{{terminated, "api.test"}, {passed, "other.test"}, {kept, "x.wild.test"}} {
		if got := exchange(t, c.c, "GET / HTTP/1.1\r\nHost: "+c.host+"\r\n\r\n", 1); !strings.HasPrefix(got[0], "200") {
			t.Fatalf("%s before the change = %q", c.host, got)
		}
	}
	t0 := time.Now()
	gw.SetPolicy(Policy{Allow: mustRules(t, "x.wild.test", "other.test")}) // other.test now terminated, not passed
	for _, c := range []net.Conn{terminated, passed} {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, 1)
		if _, err := c.Read(b); err == nil || strings.Contains(err.Error(), "timeout") {
			t.Errorf("a connection the new policy refuses is still open after %v (%v)", time.Since(t0), err)
		}
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("closing took %v, want under a second", took)
	}
	if got := exchange(t, kept, "GET / HTTP/1.1\r\nHost: x.wild.test\r\n\r\n", 1); !strings.HasPrefix(got[0], "200") {
		t.Errorf("a connection the new policy allows = %q after the change", got)
	}
	log.find(t, func(e Event) bool {
		return e.Name == "api.test" && strings.Contains(e.Reason, "closed by a policy change")
	})
	log.find(t, func(e Event) bool {
		return e.Name == "other.test" && e.Mode == ModePassthrough && strings.Contains(e.Reason, "closed by a policy change")
	})
}

// TestHostIsNeverADestination checks that the worker host's own
// addresses, 0.0.0.0/8 and the sandboxes' links are refused through a
// name, a range rule or an IPv6 form, and reached only through a rule
// naming the address exactly.
func TestHostIsNeverADestination(t *testing.T) {
	hostAddr := netip.MustParseAddr("198.51.100.99") // a service on "the host"
	reserved := netip.MustParsePrefix("10.200.0.0/16")
	_, g, u, log := setupWith(t, func(c *Config) {
		c.HostAddr = func(a netip.Addr) bool { return a == hostAddr }
		c.Reserved = []netip.Prefix{reserved}
		c.Resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
			if host == "host.test" {
				return []netip.Addr{hostAddr}, nil
			}
			return []netip.Addr{upstreamIP}, nil
		}
	}, "host.test", "0.0.0.0/0", "198.51.100.0/24")
	listenOn(t, u, hostAddr, 80)

	hostName, _, _ := g.resolve(t, gatewayIP, "host.test")
	if got, err := httpGet(g, hostName[0], "host.test", "/"); err != nil || !strings.HasPrefix(got, "502") {
		t.Errorf("an allowed name resolving to the host = %q, %v; want 502", got, err)
	}
	log.find(t, func(e Event) bool { return strings.Contains(e.Reason, "worker host itself") && e.Name == "host.test" })
	for _, dst := range []string{hostAddr.String(), "0.1.2.3", "10.200.0.5", "10.200.0.1"} {
		a := netip.MustParseAddr(dst)
		if c, err := g.dial(a, 80); err == nil {
			c.Close()
			t.Errorf("a range rule reached %s", dst)
		}
	}
	log.find(t, func(e Event) bool {
		return e.Addr == hostAddr.String() && strings.Contains(e.Reason, "worker host itself")
	})
	log.find(t, func(e Event) bool {
		return e.Addr == "10.200.0.5" && strings.Contains(e.Reason, "sandboxes' own links")
	})

	// A rule naming the address exactly reaches it.
	_, g2, u2, _ := setupWith(t, func(c *Config) { c.HostAddr = func(a netip.Addr) bool { return a == hostAddr } }, hostAddr.String()+":80")
	listenOn(t, u2, hostAddr, 80)
	c, err := g2.dial(hostAddr, 80)
	if err != nil {
		t.Fatalf("a rule naming the host's address exactly: %v", err)
	}
	if got, err := get(c, "x", "/"); err != nil || !strings.HasPrefix(got, "200") {
		t.Errorf("through the exact rule = %q, %v", got, err)
	}

	for _, a := range []string{"::ffff:127.0.0.1", "::127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::", "0.0.0.7", "::ffff:0.0.0.1"} {
		if !hostOnly(netip.MustParseAddr(a)) {
			t.Errorf("hostOnly(%s) = false", a)
		}
	}
	if hostOnly(netip.MustParseAddr("2001:db8::1")) || hostOnly(netip.MustParseAddr("198.51.100.10")) {
		t.Errorf("hostOnly of a network address = true")
	}
}

// listenOn serves "host service" over HTTP on addr:port in the
// upstream's namespace.
func listenOn(t *testing.T, u *egresstest.Upstream, addr netip.Addr, port uint16) {
	t.Helper()
	u.ServeAt(t, addr, port, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "host service") }))
}

// BenchmarkGatewayHTTPS measures, in one run, a 64 MiB HTTPS download and
// the time to a first answer on a new connection from a netstack guest:
// through the gateway terminating TLS (every request decided), through a
// tls=passthrough rule (decided by the SNI only), and directly from the
// upstream's namespace.
//
//	go test -run '^$' -bench GatewayHTTPS -benchtime 1x ./internal/egress
func BenchmarkGatewayHTTPS(b *testing.B) {
	_, g, u, _ := setupWith(b, func(c *Config) { c.MTU = MaxMTU }, "api.test", "other.test tls=passthrough")
	api, _, _ := g.resolve(b, gatewayIP, "api.test")
	other, _, _ := g.resolve(b, gatewayIP, "other.test")
	if len(api) != 1 || len(other) != 1 {
		b.Fatalf("resolve: %v %v", api, other)
	}
	dialer := func(addr netip.Addr, name string, roots *x509.CertPool) func() (net.Conn, error) {
		return func() (net.Conn, error) {
			var c net.Conn
			var err error
			if addr.IsValid() {
				c, err = g.dial(addr, 443)
			} else {
				c, err = u.Dial(context.Background(), "tcp4", netip.AddrPortFrom(upstreamIP, 443).String())
			}
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: roots, NextProtos: []string{"http/1.1"}})
			return tc, tc.Handshake()
		}
	}
	paths := []struct {
		name string
		dial func() (net.Conn, error)
		host string
	}{
		{"direct", dialer(netip.Addr{}, "api.test", u.Pool), "api.test"},
		{"passthrough", dialer(other[0], "other.test", u.Pool), "other.test"},
		{"l7", dialer(api[0], "api.test", g.roots), "api.test"},
	}
	timed := func(dial func() (net.Conn, error), host, path string) (time.Duration, int64) {
		t0 := time.Now()
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(t0), n
	}
	for b.Loop() {
		mbps := map[string]float64{}
		first := map[string]time.Duration{}
		for _, p := range paths {
			d, n := timed(p.dial, p.host, "/big")
			mbps[p.name] = float64(n) / d.Seconds() / 1e6
			best := time.Hour
			for range 20 {
				d, _ := timed(p.dial, p.host, "/")
				best = min(best, d)
			}
			first[p.name] = best
			b.ReportMetric(mbps[p.name], p.name+"-MB/s")
			b.ReportMetric(float64(best.Microseconds()), p.name+"-first-us")
		}
		b.ReportMetric(mbps["l7"]/mbps["passthrough"], "l7/passthrough-throughput")
		b.ReportMetric(mbps["l7"]/mbps["direct"], "l7/direct-throughput")
		b.ReportMetric(float64((first["l7"] - first["passthrough"]).Microseconds()), "l7-added-us")
	}
}

// TestRequestAuthority checks the authority check on requests as net/http
// gives them: an HTTP/2 request may carry an absolute :path whose host
// differs from its :authority (curl --request-target does that).
func TestRequestAuthority(t *testing.T) {
	c := newConn("api.test", netip.Addr{}, 443)
	for _, tc := range []struct {
		host, target string
		ok           bool
	}{
		{"api.test", "/x", true},
		{"API.test.:443", "/x", true},
		{"", "/x", true},
		{"other.test", "/x", false},
		{"api.test:8443", "/x", false},
		{"api.test", "https://other.test/x", false},
		{"api.test", "https://api.test:443/x", true},
	} {
		r := httptestRequest(tc.host, tc.target)
		if _, why := requestAuthority(r, c); (why == "") != tc.ok {
			t.Errorf("requestAuthority(Host %q, target %q) refuses %q, want allowed %v", tc.host, tc.target, why, tc.ok)
		}
	}
}

func httptestRequest(host, target string) *http.Request {
	r, _ := http.NewRequest("GET", "https://api.test/", nil)
	u, _ := url.Parse(target)
	r.URL, r.Host = u, host
	return r
}
