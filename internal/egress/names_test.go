package egress

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"space/internal/testenv"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	// +checklocks:mu
	t time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// resolver is a guest's UDP socket to the gateway's DNS, for many
// queries.
type resolver struct {
	c   *gonet.UDPConn
	buf []byte
}

func (g *guest) resolver(t *testing.T) *resolver {
	t.Helper()
	c, err := gonet.DialUDP(g.s, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(gatewayIP.As4()), Port: 53}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &resolver{c: c, buf: make([]byte, 4096)}
}

// query asks for name's A record, with EDNS if edns.
func (r *resolver) query(name string, edns bool) (*dns.Msg, error) {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	if edns {
		q.SetEdns0(1232, false)
	}
	b, _ := q.Pack()
	r.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.c.Write(b); err != nil {
		return nil, err
	}
	for {
		n, err := r.c.Read(r.buf)
		if err != nil {
			return nil, err
		}
		var m dns.Msg
		if err := m.Unpack(r.buf[:n]); err != nil {
			return nil, err
		}
		if m.Id == q.Id {
			return &m, nil
		}
	}
}

func answer(m *dns.Msg) (netip.Addr, bool) {
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			addr, _ := netip.AddrFromSlice(a.A.To4())
			return addr, true
		}
	}
	return netip.Addr{}, false
}

// TestWildcardLimit: 100,000 distinct names under a wildcard rule get
// addresses up to the limit, and REFUSED (audited) beyond it, until the
// bucket refills; an exact rule's name is not limited; and the gateway's
// resolver sees no more wildcard names than the limit allowed, however
// the guest connects.
func TestWildcardLimit(t *testing.T) {
	const limit, perMinute, names = 50, 2, 100_000
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	var mu sync.Mutex
	resolved := map[string]int{}
	gw, g, _, log := setupWith(t, func(c *Config) {
		longInterval(c)
		c.WildcardNames, c.WildcardNamesPerMinute, c.now = limit, perMinute, clock.now
		next := c.Resolve
		c.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			mu.Lock()
			resolved[host]++
			mu.Unlock()
			return next(ctx, host)
		}
	}, "*.wild.test", "exact.wild.test")
	r := g.resolver(t)
	answered := map[string]netip.Addr{}
	refusedAt := -1
	for i := range names {
		name := fmt.Sprintf("x%d.wild.test", i)
		m, err := r.query(name, i%1000 == 0)
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		a, ok := answer(m)
		switch {
		case m.Rcode == dns.RcodeSuccess && ok:
			answered[name] = a
		case m.Rcode == dns.RcodeRefused:
			if refusedAt < 0 {
				refusedAt = i
			}
			if m.IsEdns0() != nil {
				if !hasEDE(m, dns.ExtendedErrorCodeProhibited) {
					t.Errorf("REFUSED answer to an EDNS query without an extended error: %v", m)
				}
			}
		default:
			t.Fatalf("query %s: rcode %d, answer %v", name, m.Rcode, m.Answer)
		}
		if i == 10 {
			// A name answered before costs nothing.
			if m, _ := r.query("x0.wild.test", false); m == nil || m.Rcode != dns.RcodeSuccess {
				t.Errorf("x0.wild.test a second time: %v", m)
			}
		}
	}
	if len(answered) != limit || refusedAt != limit {
		t.Errorf("%d of %d names answered, the first refused #%d; want %d and #%d", len(answered), names, refusedAt, limit, limit)
	}
	if m, err := r.query("exact.wild.test", false); err != nil || m.Rcode != dns.RcodeSuccess {
		t.Errorf("exact.wild.test (an exact rule) after the limit: %v, %v", m, err)
	}
	clock.advance(time.Minute)
	for i := range perMinute + 1 {
		name := fmt.Sprintf("later%d.wild.test", i)
		m, err := r.query(name, false)
		if err != nil {
			t.Fatal(err)
		}
		if a, ok := answer(m); ok {
			answered[name] = a
		} else if i < perMinute {
			t.Errorf("%s a minute later: rcode %d, want an answer (%d a minute)", name, m.Rcode, perMinute)
		}
	}
	if len(answered) != limit+perMinute {
		t.Errorf("%d names answered after a minute, want %d", len(answered), limit+perMinute)
	}
	log.find(t, func(e Event) bool { return e.Proto == "dns" && !e.Allowed && strings.Contains(e.Reason, "wildcard") })

	// The guest connects to every answered name, and to every other
	// address of the synthetic range's start.
	for name, a := range answered {
		if got, err := httpGet(g, a, name, "/"); err != nil || got != "200 OK hello "+name {
			t.Errorf("http://%s/ = %q, %v", name, got, err)
		}
	}
	for i := range 200 {
		a := syntheticRange.Addr().As4()
		a[3] = byte(i)
		if c, err := g.dial(netip.AddrFrom4(a), 80); err == nil {
			get(c, "y.wild.test", "/")
		}
	}
	mu.Lock()
	wild := 0
	for host, n := range resolved {
		if host != "exact.wild.test" {
			wild++
		}
		if _, ok := answered[host]; !ok && host != "exact.wild.test" {
			t.Errorf("the gateway resolved %s (%d times), a name it did not answer", host, n)
		}
	}
	mu.Unlock()
	if wild > limit+perMinute {
		t.Errorf("the gateway resolved %d wildcard names, want at most %d", wild, limit+perMinute)
	}

	gw.Close()
	var lines, refused int
	for _, e := range log.all() {
		if e.Proto == "dns" {
			lines++
			if !e.Allowed {
				refused += count(e)
			}
		}
	}
	if want := names - limit + 1; refused != want || lines > 3*maxAuditKeys {
		t.Errorf("DNS audit: %d lines counting %d refusals, want at most %d counting %d", lines, refused, 3*maxAuditKeys, want)
	}
}

func hasEDE(m *dns.Msg, code uint16) bool {
	for _, o := range m.IsEdns0().Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok && e.InfoCode == code {
			return true
		}
	}
	return false
}

// TestRecycle: with a range of 15 addresses, 100 names get one each in
// turn (the least recently used is recycled), but never the address of a
// connection still open, which keeps reaching its own name.
func TestRecycle(t *testing.T) {
	small := netip.MustParsePrefix("198.18.0.0/28")
	gw, g, _, _ := setupWith(t, func(c *Config) { c.namesRange = small }, "*.wild.test")
	r := g.resolver(t)
	resolve := func(name string) netip.Addr {
		t.Helper()
		m, err := r.query(name, false)
		if err != nil {
			t.Fatalf("resolve %s: %v", name, err)
		}
		a, ok := answer(m)
		if !ok || !small.Contains(a) {
			t.Fatalf("resolve %s: rcode %d, %v; want an address of %v", name, m.Rcode, m.Answer, small)
		}
		return a
	}
	held := resolve("held.wild.test")
	c, err := g.dial(held, 80)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seen := map[netip.Addr]bool{}
	for i := range 100 {
		a := resolve(fmt.Sprintf("n%d.wild.test", i))
		if a == held {
			t.Fatalf("n%d.wild.test got %v, the address of an open connection to held.wild.test", i, a)
		}
		seen[a] = true
	}
	if len(seen) != 14 {
		t.Errorf("100 names used %d addresses, want the 14 not held", len(seen))
	}
	if a := resolve("held.wild.test"); a != held {
		t.Errorf("held.wild.test now %v, was %v", a, held)
	}
	if got, err := get(c, "held.wild.test", "/"); err != nil || got != "200 OK hello held.wild.test" {
		t.Errorf("the held connection = %q, %v", got, err)
	}
	// Closed, its address goes back to the pool (least recently used
	// once 14 other names have been answered).
	testenv.Eventually(t, 5*time.Second, func() bool { return gw.names.pins(held) == 0 })
	for i := range 15 {
		if a := resolve(fmt.Sprintf("m%d.wild.test", i)); a == held {
			return
		}
	}
	t.Errorf("the held address was not recycled after its connection closed")
}

// TestNamesTakeOver: a fork's table answers its parent's names with
// their addresses, without costing wildcard names.
func TestNamesTakeOver(t *testing.T) {
	now := func() time.Time { return time.Unix(1e9, 0) }
	parent := newNameTable(syntheticRange, 2, 1, now)
	a, _ := parent.addr("a.wild.test", true)
	b, _ := parent.addr("b.wild.test", true)
	child := newNameTable(syntheticRange, 2, 1, now)
	child.load(parent.all())
	for name, want := range map[string]netip.Addr{"a.wild.test": a, "b.wild.test": b} {
		if got, err := child.addr(name, true); got != want || err != nil {
			t.Errorf("child.addr(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	if _, err := child.addr("c.wild.test", true); err != nil {
		t.Errorf("child.addr(c.wild.test) = %v: the parent's names cost the child's bucket", err)
	}
	if c, _ := child.addr("c.wild.test", true); c == a || c == b {
		t.Errorf("c.wild.test got %v, a parent's name's address", c)
	}
}

// pins is how many connections pin a.
func (t *nameTable) pins(a netip.Addr) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byAddr[a]; e != nil {
		return e.pins
	}
	return 0
}
