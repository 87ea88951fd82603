package server

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/egress/egresstest"
	"space/internal/testenv"
)

// TestNetworkWall plays a guest with root that is allowed one site
// (api.test) on an upstream address that also serves other.test and
// x.wild.test with one certificate, as a shared CDN address does, and is
// granted a secret for api.test. From a real VM, with the guest's own
// curl and Python: every way of asking the upstream for another site on
// a connection opened to api.test is refused and logged; api.test itself
// works over HTTP/1.1 and HTTP/2; an echo of the secret comes back as its
// placeholder; the worker host's own addresses are unreachable through a
// name or a range rule; a passthrough rule serves a client that pins its
// own CA; a policy change closes an open connection it refuses.
func TestNetworkWall(t *testing.T) {
	u := egresstest.Start(t)
	hostIP := hostAddress(t)
	hostPort := listenOnHost(t)
	up := []netip.Addr{egresstest.Addr}
	ts := startServerWith(t, Config{Egress: Egress{Netns: u.Netns, Roots: u.Pool, Hosts: map[string][]netip.Addr{
		"api.test": up, "other.test": up, "x.wild.test": up, "host.test": {hostIP},
	}}})
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	secret := "sk-wall-" + rand.Text()
	if _, err := c.CreateSecret(ctx, api.CreateSecret{Name: "apikey", Value: []byte(secret), Hosts: []string{"api.test"}}); err != nil {
		t.Fatalf("CreateSecret: %v", err)
	}
	rules := []string{"api.test", "host.test", fmt.Sprintf("0.0.0.0/0:%d", hostPort)}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256, Secrets: []string{"apikey"}, Network: &api.Network{Allow: rules}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	run := func(cmd string) (string, int) {
		out, errOut, code := execOut(t, c, sb.ID, sh(cmd))
		return strings.TrimSpace(out + errOut), code
	}
	curl := func(args string) (string, int) { return run("curl -sS -f --max-time 15 " + args) }

	// The allowed site works, over HTTP/1.1 and HTTP/2, with keep-alive.
	if out, code := curl("--http1.1 https://api.test/ https://api.test/"); code != 0 || out != "hello api.testhello api.test" {
		t.Errorf("two requests to api.test over HTTP/1.1 = %q (exit %d)", out, code)
	}
	if out, code := curl("--http2 -w ' %{http_version}' https://api.test/ https://api.test/"); code != 0 || out != "hello api.test 2hello api.test 2" {
		t.Errorf("two requests to api.test over HTTP/2 = %q (exit %d)", out, code)
	}
	if out, code := curl("http://api.test/plain"); code != 0 || out != "hello api.test" {
		t.Errorf("plain HTTP to api.test = %q (exit %d)", out, code)
	}

	// Another site on a connection opened to api.test.
	pyRaw := func(tls bool, raw string) string {
		py := `import socket, ssl, sys
s = socket.create_connection(("api.test", PORT), timeout=10)
if TLS:
    ctx = ssl.create_default_context(); ctx.set_alpn_protocols(["http/1.1"])
    s = ctx.wrap_socket(s, server_hostname="api.test")
s.sendall(RAW)
out = b""
try:
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
except OSError as e:
    out += b" [" + str(e).encode() + b"]"
print(" | ".join(l.decode() for l in out.split(b"\r\n") if l.startswith(b"HTTP/")))`
		port, pyTLS := "80", "False"
		if tls {
			port, pyTLS = "443", "True"
		}
		py = strings.NewReplacer("PORT", port, "TLS", pyTLS, "RAW", fmt.Sprintf("%q.encode()", raw)).Replace(py)
		out, _, _ := execOut(t, c, sb.ID, api.Exec{Command: []string{"python3", "-c", py}})
		return strings.TrimSpace(out)
	}
	get := func(host, extra string) string {
		return "GET / HTTP/1.1\r\nHost: " + host + "\r\n" + extra + "\r\n"
	}
	for _, tc := range []struct {
		what string
		out  func() (string, int)
	}{
		{"a second request with another Host (keep-alive)", func() (string, int) {
			return curl("--http1.1 https://api.test/ --next -sS -f --http1.1 -H 'Host: other.test' https://api.test/")
		}},
		{"another Host inside TLS", func() (string, int) { return curl("--http1.1 -H 'Host: other.test' https://api.test/") }},
		{"another :authority on HTTP/2", func() (string, int) { return curl("--http2 -H 'Host: other.test' https://api.test/") }},
		{"an HTTP/2 connection's second stream for another site", func() (string, int) {
			return curl("--http2 https://api.test/ --next -sS -f --http2 -H 'Host: x.wild.test' https://api.test/")
		}},
		{"another Host over plain HTTP", func() (string, int) { return curl("-H 'Host: other.test' http://api.test/") }},
		{"a forged DNS answer", func() (string, int) {
			return curl("--resolve other.test:443:$(getent hosts api.test | cut -d' ' -f1) https://other.test/")
		}},
		{"CONNECT through the allowed name", func() (string, int) { return curl("-p -x http://api.test:80 https://other.test/") }},
		{"an absolute target for another host", func() (string, int) {
			return curl("--request-target https://other.test/ https://api.test/")
		}},
	} {
		if out, code := tc.out(); code == 0 || strings.Contains(out, "hello other.test") || strings.Contains(out, "hello x.wild.test") {
			t.Errorf("%s = %q (exit %d), want refused", tc.what, out, code)
		}
	}
	for what, raw := range map[string]string{
		"pipelined, another Host second": get("api.test", "") + get("other.test", ""),
		"a WebSocket upgrade to another Host": "GET /ws HTTP/1.1\r\nHost: other.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
	} {
		for _, tls := range []bool{true, false} {
			out := pyRaw(tls, raw)
			if strings.Contains(out, "101") || strings.Count(out, "200") > 1 || !strings.Contains(out, "421") {
				t.Errorf("%s (TLS %v): responses %q, want the other site refused with 421", what, tls, out)
			}
		}
	}
	for _, r := range u.Requests() {
		if r.Host != "api.test" && !strings.HasPrefix(r.Host, "api.test:") {
			t.Errorf("the upstream was asked for %q %s", r.Host, r.Path)
		}
	}

	// The secret goes to api.test and never comes back.
	for _, args := range []string{`-H "Authorization: Bearer $APIKEY" "https://api.test/echo?k=$APIKEY"`,
		`--compressed -H "Authorization: Bearer $APIKEY" https://api.test/echo`,
		`--http1.1 -H "Authorization: Bearer $APIKEY" https://api.test/echo`} {
		out, code := curl("-i " + args)
		if code != 0 || strings.Contains(out, secret) || !strings.Contains(out, "SPACE_SECRET_") {
			t.Errorf("echo of the secret (%s) = %q (exit %d): want the placeholder, never the value", args, out, code)
		}
	}
	if got := u.Requests(); !strings.Contains(got[len(got)-1].Header.Get("Authorization"), secret) {
		t.Errorf("the upstream did not get the secret: %v", got[len(got)-1])
	}
	if out, code := curl(`-X TRACE -H "Authorization: Bearer $APIKEY" https://api.test/`); code == 0 || strings.Contains(out, secret) {
		t.Errorf("TRACE to the secret's host = %q (exit %d), want refused", out, code)
	}

	// The worker host: through a name, a range rule, and the guest's
	// own gateway address.
	gw, _ := run("ip route show default | cut -d' ' -f3")
	for what, url := range map[string]string{
		"a name resolving to the host":  fmt.Sprintf("http://host.test:%d/", hostPort),
		"the host by a range rule":      fmt.Sprintf("http://%s:%d/", hostIP, hostPort),
		"the gateway's own address":     fmt.Sprintf("http://%s:%d/", gw, hostPort),
		"the host in an IPv6 form (v4)": fmt.Sprintf("http://[::ffff:%s]:%d/", hostIP, hostPort),
	} {
		if out, code := curl("-g --connect-timeout 5 " + url); code == 0 || strings.Contains(out, "host service") {
			t.Errorf("%s (%s) = %q (exit %d), want refused", what, url, out, code)
		}
	}

	// A passthrough rule, for a client that pins its own CA; and an open
	// connection the next policy refuses is closed.
	if _, err := c.WriteFile(ctx, sb.ID, "/tmp/upstream-ca.pem", strings.NewReader(string(u.CAPEM)), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetNetwork(ctx, sb.ID, api.Network{Allow: append(rules, "x.wild.test:443 tls=passthrough")}); err != nil {
		t.Fatalf("SetNetwork: %v", err)
	}
	if out, code := curl("--cacert /tmp/upstream-ca.pem https://x.wild.test/"); code != 0 || out != "hello x.wild.test" {
		t.Errorf("a pinned client through a passthrough rule = %q (exit %d)", out, code)
	}
	const holder = `import socket, ssl, os, time
s = ssl.create_default_context().wrap_socket(socket.create_connection(("api.test", 443), timeout=30), server_hostname="api.test")
req = b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"
s.sendall(req); first = b""
while not (first.endswith(b"hello api.test") or first.endswith(b"\r\n0\r\n\r\n")): first += s.recv(4096)
open("/tmp/held", "w").write(first.split(b"\r\n")[0].decode())
while not os.path.exists("/tmp/go"): time.sleep(0.05)
t0 = time.time()
try:
    s.sendall(req); b = s.recv(4096)
    res = "answered" if b else "closed"
except OSError as e:
    res = "closed"
open("/tmp/after", "w").write(res)`
	if _, err := c.StartDetached(ctx, sb.ID, api.Exec{Command: []string{"python3", "-c", holder}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { out, _ := run("cat /tmp/held"); return strings.Contains(out, "200") })
	if _, err := c.SetNetwork(ctx, sb.ID, api.Network{Allow: []string{"x.wild.test"}}); err != nil {
		t.Fatalf("SetNetwork: %v", err)
	}
	run("touch /tmp/go")
	testenv.Eventually(t, 30*time.Second, func() bool { out, _ := run("cat /tmp/after"); return out != "" && !strings.Contains(out, "No such") })
	if out, _ := run("cat /tmp/after"); out != "closed" {
		t.Errorf("a connection to api.test after a policy dropped it: %q, want closed", out)
	}

	// A port scan of an address no rule covers: a few lines, with counts
	// that add up, not one line per port.
	const scan = `import socket
for p in range(20000, 20400):
    try: socket.create_connection(("` + "198.51.100.10" + `", p), timeout=2).close()
    except OSError: pass`
	if _, _, code := execOut(t, c, sb.ID, api.Exec{Command: []string{"python3", "-c", scan}}); code != 0 {
		t.Fatalf("the scan failed to run (exit %d)", code)
	}
	var events []api.EgressEvent
	scanned := func() (lines, count int) {
		for _, e := range events {
			if e.Addr == egresstest.Addr.String() && !e.Allowed && e.Proto == "tcp" && (e.Port == 0 || e.Port >= 20000 && e.Port < 20400) {
				lines, count = lines+1, count+max(e.Count, 1)
			}
		}
		return lines, count
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		var err error
		if events, err = c.EgressLog(ctx, sb.ID); err != nil {
			t.Fatalf("EgressLog: %v", err)
		}
		_, n := scanned()
		return n >= 400
	})
	if lines, n := scanned(); lines > 10 || n != 400 {
		t.Errorf("a scan of 400 ports wrote %d lines counting %d refusals, want a few lines counting 400", lines, n)
	}
	has := func(what string, match func(api.EgressEvent) bool) {
		t.Helper()
		for _, e := range events {
			if match(e) {
				return
			}
		}
		t.Errorf("the egress log has no line for %s", what)
	}
	has("a refused request for other.test", func(e api.EgressEvent) bool {
		return e.Proto == "http" && e.Name == "other.test" && strings.Contains(e.Reason, "opened to api.test")
	})
	has("an HTTP/2 connection to api.test", func(e api.EgressEvent) bool { return e.Allowed && e.Mode == "https" && e.Name == "api.test" })
	has("the host refused", func(e api.EgressEvent) bool { return strings.Contains(e.Reason, "worker host itself") })
	has("the passthrough connection", func(e api.EgressEvent) bool { return e.Allowed && e.Mode == "tls-passthrough" })
	has("the connection closed by the policy change", func(e api.EgressEvent) bool {
		return e.Name == "api.test" && strings.Contains(e.Reason, "closed by a policy change")
	})
	for _, e := range events {
		if strings.Contains(fmt.Sprint(e), secret) {
			t.Errorf("the egress log holds the secret: %+v", e)
		}
	}
}

// hostAddress is a non-loopback IPv4 address of this host (the worker's).
func hostAddress(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr()
		}
	}
	t.Fatalf("setup: this host has no IPv4 address but loopback")
	return netip.Addr{}
}

// listenOnHost serves "host service" on every address of the host, as a
// careless service on a worker host would, and returns its port.
func listenOnHost(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "host service") })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return uint16(l.Addr().(*net.TCPAddr).Port)
}
