package egress

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"space/internal/egress/egresstest"
)

var (
	gatewayIP  = netip.MustParseAddr("10.77.0.1")
	guestIP    = netip.MustParseAddr("10.77.0.2")
	gatewayIP6 = netip.MustParseAddr("fd53:7061:6365:1::1")
	guestIP6   = netip.MustParseAddr("fd53:7061:6365:1::2")
	// upstreamIP is the test upstream's address (see egresstest).
	upstreamIP = egresstest.Addr
)

// guest is a netstack playing the sandbox: the same stack a kernel would
// be as far as the gateway can tell (ARP, IPv4, TCP, UDP over Ethernet).
type guest struct {
	s      *stack.Stack
	frames Frames // its NIC's backend, for frames the stack would not send
	// roots is what the guest trusts: its sandbox's CA, as a real
	// guest does.
	roots *x509.CertPool
}

func newGuest(t testing.TB, frames Frames, mtu int) *guest {
	t.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	link := newFrameLink(frames, mtu, tcpip.LinkAddress(net.HardwareAddr{2, 0, 0, 0, 0, 2}), func([]byte) bool { return true })
	if err := s.CreateNIC(1, ethernet.New(link.ep)); err != nil {
		t.Fatal(err)
	}
	s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(guestIP.As4()), PrefixLen: 24}}, stack.AddressProperties{})
	s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv6.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom16(guestIP6.As16()), PrefixLen: 64}}, stack.AddressProperties{})
	s.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(gatewayIP.As4()), NIC: 1},
		{Destination: header.IPv6EmptySubnet, Gateway: tcpip.AddrFrom16(gatewayIP6.As16()), NIC: 1},
	})
	ctx, cancel := context.WithCancel(context.Background())
	go link.run(ctx)
	t.Cleanup(func() { cancel(); s.Close() })
	return &guest{s: s, frames: frames}
}

// resolve asks the DNS server at server:53 for name's A records.
func (g *guest) resolve(t testing.TB, server netip.Addr, name string) ([]netip.Addr, int, error) {
	t.Helper()
	c, err := gonet.DialUDP(g.s, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(server.As4()), Port: 53}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, _ := q.Pack()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(b); err != nil {
		return nil, 0, err
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return nil, 0, err
	}
	var r dns.Msg
	if err := r.Unpack(buf[:n]); err != nil {
		return nil, 0, err
	}
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			addr, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, addr)
		}
	}
	return out, r.Rcode, nil
}

func (g *guest) dial(addr netip.Addr, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if addr.Is6() {
		return gonet.DialContextTCP(ctx, g.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom16(addr.As16()), Port: port}, ipv6.ProtocolNumber)
	}
	return gonet.DialContextTCP(ctx, g.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(addr.As4()), Port: port}, ipv4.ProtocolNumber)
}

// setup connects a guest to a gateway with policy, resolving names to
// the upstream except loop.test and meta.test.
func setup(t testing.TB, policy ...string) (*Gateway, *guest, *egresstest.Upstream, *auditLog) {
	t.Helper()
	return setupWith(t, func(*Config) {}, policy...)
}

// setupWith is setup with the gateway's configuration edited by edit.
func setupWith(t testing.TB, edit func(*Config), policy ...string) (*Gateway, *guest, *egresstest.Upstream, *auditLog) {
	t.Helper()
	u := egresstest.Start(t)
	rules, err := ParseRules(policy)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	vmmEnd, guestEnd := os.NewFile(uintptr(fds[0]), "vmm"), os.NewFile(uintptr(fds[1]), "guest")
	log := &auditLog{}
	cfg := Config{
		Frames: StreamFrames(vmmEnd), Gateway: gatewayIP, Guest: guestIP, Policy: Policy{Allow: rules}, Audit: log.add, Dial: u.Dial,
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			switch host {
			case "loop.test":
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			case "meta.test":
				return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
			}
			return []netip.Addr{upstreamIP}, nil
		},
	}
	cfg.UpstreamRoots = u.Pool
	ca, err := NewCA("sandbox test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg.CA = ca
	edit(&cfg)
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	gst := newGuest(t, StreamFrames(guestEnd), cmp.Or(cfg.MTU, DefaultMTU))
	gst.trust(cfg.CA)
	return g, gst, u, log
}

// trust makes the guest trust ca (a sandbox's CA), and only it.
func (g *guest) trust(ca *CA) {
	g.roots = x509.NewCertPool()
	if ca != nil {
		g.roots.AddCert(ca.Cert)
	}
}

type auditLog struct {
	mu sync.Mutex
	// +checklocks:mu
	events []Event
}

func (l *auditLog) add(e Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// find waits for an event that matches and returns it.
func (l *auditLog) find(t *testing.T, match func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, e := range l.events {
			if match(e) {
				l.mu.Unlock()
				return e
			}
		}
		l.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Fatalf("no matching audit event among %+v", l.events)
	return Event{}
}

// httpsGet fetches https://name/path through a connection to addr,
// trusting what the guest trusts.
func httpsGet(g *guest, addr netip.Addr, sni, host, path string) (string, error) {
	return httpsGetTrusting(g, g.roots, addr, sni, host, path)
}

// httpsGetTrusting is httpsGet trusting roots alone.
func httpsGetTrusting(g *guest, roots *x509.CertPool, addr netip.Addr, sni, host, path string) (string, error) {
	c, err := g.dial(addr, 443)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots})
	fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Status + " " + string(b), err
}

func httpGet(g *guest, addr netip.Addr, host, path string) (string, error) {
	c, err := g.dial(addr, 80)
	if err != nil {
		return "", err
	}
	return get(c, host, path)
}

// get sends one request over c and reads the answer.
func get(c net.Conn, host, path string) (string, error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Status + " " + string(b), err
}

// TestGateway exercises the gateway between a real TCP/IP stack playing
// the guest and a real HTTPS server in a network namespace: allowed names
// work; everything else fails, and each decision is audited.
func TestGateway(t *testing.T) {
	gw, g, u, log := setup(t, "api.test", "*.wild.test", "loop.test", "meta.test")

	api, rcode, err := g.resolve(t, gatewayIP, "api.test")
	if err != nil || rcode != dns.RcodeSuccess || len(api) != 1 || !syntheticRange.Contains(api[0]) {
		t.Fatalf("resolve api.test = %v, rcode %d, %v; want one synthetic address", api, rcode, err)
	}
	if got, err := httpsGet(g, api[0], "api.test", "api.test", "/"); err != nil || got != "200 OK hello api.test" {
		t.Errorf("https://api.test/ = %q, %v", got, err)
	}
	ev := log.find(t, func(e Event) bool { return e.Proto == "tcp" && e.Allowed && e.Name == "api.test" })
	if ev.Addr != upstreamIP.String() || ev.Port != 443 || ev.BytesIn == 0 || ev.BytesOut == 0 {
		t.Errorf("audit of the allowed connection: %+v", ev)
	}
	if got, err := httpGet(g, api[0], "api.test", "/plain"); err != nil || got != "200 OK hello api.test" {
		t.Errorf("http://api.test/plain = %q, %v", got, err)
	}
	wild, _, _ := g.resolve(t, gatewayIP, "x.wild.test")
	if got, err := httpsGet(g, wild[0], "x.wild.test", "x.wild.test", "/"); err != nil || got != "200 OK hello x.wild.test" {
		t.Errorf("https://x.wild.test/ (allowed by *.wild.test) = %q, %v", got, err)
	}

	t.Run("unlisted name", func(t *testing.T) {
		addrs, rcode, err := g.resolve(t, gatewayIP, "other.test")
		if err != nil || rcode != dns.RcodeNameError || len(addrs) != 0 {
			t.Errorf("resolve other.test = %v, rcode %d, %v; want NXDOMAIN", addrs, rcode, err)
		}
		log.find(t, func(e Event) bool { return e.Proto == "dns" && !e.Allowed && e.Name == "other.test" })
		if _, rcode, _ := g.resolve(t, gatewayIP, "wild.test"); rcode != dns.RcodeNameError {
			t.Errorf("wild.test itself resolved (rcode %d): *.wild.test covers only names under it", rcode)
		}
	})
	t.Run("raw IP", func(t *testing.T) {
		if c, err := g.dial(upstreamIP, 443); err == nil {
			c.Close()
			t.Errorf("a connection to %s by IP was accepted", upstreamIP)
		}
		log.find(t, func(e Event) bool { return e.Proto == "tcp" && !e.Allowed && e.Addr == upstreamIP.String() })
	})
	t.Run("another resolver", func(t *testing.T) {
		if _, _, err := g.resolve(t, netip.MustParseAddr("8.8.8.8"), "other.test"); err == nil {
			t.Errorf("a DNS server other than the gateway answered")
		}
		log.find(t, func(e Event) bool { return e.Proto == "udp" && e.Addr == "8.8.8.8" && e.Port == 53 })
	})
	t.Run("forged answer", func(t *testing.T) {
		// The guest believes other.test is at api.test's address.
		if got, err := httpsGet(g, api[0], "other.test", "other.test", "/"); err == nil {
			t.Errorf("TLS for other.test through api.test's address = %q", got)
		}
		log.find(t, func(e Event) bool { return e.Name == "api.test" && strings.Contains(e.Reason, `names "other.test"`) })
	})
	t.Run("Host disagrees", func(t *testing.T) {
		if got, err := httpGet(g, api[0], "other.test", "/"); err != nil || !strings.HasPrefix(got, "421 ") {
			t.Errorf("HTTP with Host other.test to api.test = %q, %v; want 421", got, err)
		}
	})
	t.Run("CONNECT to an unlisted host", func(t *testing.T) {
		c, err := g.dial(api[0], 80)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n")
		if b, err := io.ReadAll(c); !strings.HasPrefix(string(b), "HTTP/1.1 421 ") {
			t.Errorf("CONNECT other.test through api.test answered %q (%v), want 421", b, err)
		}
	})
	t.Run("allowed name to loopback or metadata", func(t *testing.T) {
		for _, name := range []string{"loop.test", "meta.test"} {
			addrs, _, _ := g.resolve(t, gatewayIP, name)
			if len(addrs) != 1 {
				t.Fatalf("resolve %s = %v", name, addrs)
			}
			if got, err := httpGet(g, addrs[0], name, "/"); err != nil || !strings.HasPrefix(got, "502 ") {
				t.Errorf("http://%s/ = %q, %v; want refused (502)", name, got, err)
			}
			log.find(t, func(e Event) bool { return e.Name == name && strings.Contains(e.Reason, "does not name") })
		}
	})
	t.Run("redirect to another host", func(t *testing.T) {
		// The guest may follow it only by opening a connection to the
		// other host, which the policy decides.
		got, err := httpsGet(g, api[0], "api.test", "api.test", "/redirect")
		if err != nil || !strings.HasPrefix(got, "302") {
			t.Fatalf("redirect = %q, %v", got, err)
		}
		if _, rcode, _ := g.resolve(t, gatewayIP, "other.test"); rcode != dns.RcodeNameError {
			t.Errorf("the redirect's target resolved")
		}
	})
	t.Run("packets that are not TCP or DNS", func(t *testing.T) {
		for name, frame := range map[string][]byte{
			"icmp echo to 8.8.8.8": ipv4Frame(header.ICMPv4ProtocolNumber, "8.8.8.8", 0),
			"udp to 1.1.1.1:443":   ipv4Frame(header.UDPProtocolNumber, "1.1.1.1", 443),
			"ipv6":                 ipv6Frame(),
		} {
			if gw.admit(frame) {
				t.Errorf("%s passed the gateway's filter", name)
			}
		}
		if !gw.admit(ipv4Frame(header.UDPProtocolNumber, gatewayIP.String(), 53)) {
			t.Errorf("DNS to the gateway was filtered")
		}
	})
	t.Run("policy change", func(t *testing.T) {
		gw.SetPolicy(Policy{Allow: []Rule{{Host: "other.test"}}})
		defer gw.SetPolicy(Policy{Allow: mustRules(t, "api.test", "*.wild.test", "loop.test", "meta.test")})
		if _, err := httpsGet(g, api[0], "api.test", "api.test", "/"); err == nil {
			t.Errorf("api.test still reachable after the policy dropped it")
		}
		other, rcode, _ := g.resolve(t, gatewayIP, "other.test")
		if rcode != dns.RcodeSuccess || len(other) != 1 {
			t.Fatalf("other.test after the policy allowed it: rcode %d", rcode)
		}
		if got, err := httpsGet(g, other[0], "other.test", "other.test", "/"); err != nil || got != "200 OK hello other.test" {
			t.Errorf("https://other.test/ after the change = %q, %v", got, err)
		}
		gw.SetPolicy(Policy{Off: true})
		if _, _, err := g.resolve(t, gatewayIP, "other.test"); err == nil {
			t.Errorf("DNS answered with the network off")
		}
	})
	for _, r := range u.Requests() {
		t.Logf("upstream served %s %s", r.Host, r.Path)
		if r.Host == "other.test" && r.Path != "/" {
			t.Errorf("upstream served a request it should never have seen: %s %s", r.Host, r.Path)
		}
	}
}

func mustRules(t *testing.T, ss ...string) []Rule {
	r, err := ParseRules(ss)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ipv4Frame is an Ethernet frame holding an IPv4 packet of proto to dst.
func ipv4Frame(proto tcpip.TransportProtocolNumber, dst string, port uint16) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+8)
	header.Ethernet(b).Encode(&header.EthernetFields{Type: header.IPv4ProtocolNumber})
	ip := header.IPv4(b[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b) - header.EthernetMinimumSize), TTL: 64, Protocol: uint8(proto),
		SrcAddr: tcpip.AddrFrom4(guestIP.As4()), DstAddr: tcpip.AddrFrom4(netip.MustParseAddr(dst).As4())})
	ip.SetChecksum(^ip.CalculateChecksum())
	p := ip.Payload()
	p[2], p[3] = byte(port>>8), byte(port)
	return b
}

func ipv6Frame() []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv6MinimumSize)
	header.Ethernet(b).Encode(&header.EthernetFields{Type: header.IPv6ProtocolNumber})
	return b
}

func TestParseRule(t *testing.T) {
	for in, want := range map[string]string{
		"API.Example.com.": "api.example.com", "*.example.com:443": "*.example.com:443",
		"10.0.0.0/8:5432": "10.0.0.0/8:5432", "10.1.2.3": "10.1.2.3/32", "10.1.2.3/24": "10.1.2.0/24",
		"2001:db8::7": "2001:db8::7/128", "2001:db8::1/32": "2001:db8::/32", "[2001:db8::7]:443": "[2001:db8::7/128]:443",
		"[2001:db8::/48]:5432": "[2001:db8::/48]:5432", "[::1]": "::1/128",
		"pinned.example.com:443 tls=passthrough": "pinned.example.com:443 tls=passthrough",
		" *.example.com  tls=passthrough ":       "*.example.com tls=passthrough",
	} {
		r, err := ParseRule(in)
		if err != nil || r.String() != want {
			t.Errorf("ParseRule(%q) = %v, %v; want %s", in, r, err, want)
		}
	}
	for _, bad := range []string{"", "*", "a..b", "*.*.x", "x:0", "x:65536", "-a.b", "a b", "10.0.0.0/33",
		"[2001:db8::7]:0", "[2001:db8::7", "[2001:db8::7]443", "::ffff:10.1.2.3", "2001:db8::/129", "[10.1.2.3]:80", "fe80::1%eth0", "a:b:c",
		"10.0.0.0/8 tls=passthrough", "x.test tls=terminate", "x.test y.test", "[2001:db8::7]:443 tls=passthrough"} {
		if r, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) = %v, want an error", bad, r)
		}
	}
}

// BenchmarkGateway measures, in one run, a 64 MiB HTTP download and the
// time to a first answer through the gateway (from a netstack playing the
// guest) against the same from a direct connection in the upstream's
// namespace.
//
//	go test -run '^$' -bench Gateway -benchtime 1x ./internal/egress
func BenchmarkGateway(b *testing.B) {
	_, g, u, _ := setupWith(b, func(c *Config) { c.MTU = MaxMTU }, "api.test") // as the worker's socket NICs
	api, _, err := g.resolve(b, gatewayIP, "api.test")
	if err != nil || len(api) != 1 {
		b.Fatalf("resolve: %v %v", api, err)
	}
	via := func() (net.Conn, error) { return g.dial(api[0], 80) }
	direct := func() (net.Conn, error) {
		return u.Dial(context.Background(), "tcp4", netip.AddrPortFrom(upstreamIP, 80).String())
	}
	timed := func(dial func() (net.Conn, error), path string) (time.Duration, int) {
		t0 := time.Now()
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body) // the reading costs the same on both paths
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(t0), int(n)
	}
	best := func(dial func() (net.Conn, error)) time.Duration {
		m := time.Hour
		for range 20 {
			m = min(m, first(timed(dial, "/")))
		}
		return m
	}
	for b.Loop() {
		dBig, n := timed(direct, "/big")
		gBig, _ := timed(via, "/big")
		dFirst, gFirst := best(direct), best(via)
		b.ReportMetric(float64(n)/dBig.Seconds()/1e6, "direct-MB/s")
		b.ReportMetric(float64(n)/gBig.Seconds()/1e6, "gateway-MB/s")
		b.ReportMetric(dBig.Seconds()/gBig.Seconds(), "gateway/direct-throughput")
		b.ReportMetric(float64(dFirst.Microseconds()), "direct-request-us")
		b.ReportMetric(float64(gFirst.Microseconds()), "gateway-request-us")
		b.ReportMetric(float64((gFirst - dFirst).Microseconds()), "added-us")
	}
}

func first[A, B any](a A, _ B) A { return a }

// TestLimits checks the connection limit refuses what goes beyond it and
// the bandwidth limit slows a download to at most its rate.
func TestLimits(t *testing.T) {
	gw, g, _, log := setup(t, "api.test")
	gw.SetPolicy(Policy{Allow: mustRules(t, "api.test"), MaxConns: 1})
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	held, err := g.dial(api[0], 80)
	if err != nil {
		t.Fatal(err)
	}
	// The first connection is accepted once its handler runs; wait for
	// the gateway to count it by sending half a request.
	fmt.Fprintf(held, "GET / HTTP/1.1\r\n")
	time.Sleep(200 * time.Millisecond)
	if got, err := httpGet(g, api[0], "api.test", "/"); err == nil {
		t.Errorf("a second connection beyond max_conns 1 = %q", got)
	}
	log.find(t, func(e Event) bool { return strings.Contains(e.Reason, "too many connections") })
	held.Close()

	const rate = 4 << 20 // bytes per second; the download is 64 MiB
	gw.SetPolicy(Policy{Allow: mustRules(t, "api.test"), BytesPerSecond: rate})
	t0 := time.Now()
	c, err := g.dial(api[0], 80)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
	n, _ := io.Copy(io.Discard, io.LimitReader(c, 16<<20))
	c.Close()
	took := time.Since(t0)
	// 16 MiB at 4 MiB/s, less the first burst (1 MiB): at least 3.5 s.
	if n != 16<<20 || took < 3500*time.Millisecond {
		t.Errorf("read %d bytes in %v through a %d B/s limit, want 16 MiB in at least 3.5 s", n, took, rate)
	}
	t.Logf("16 MiB in %v at a limit of 4 MiB/s", took.Round(time.Millisecond))
}
