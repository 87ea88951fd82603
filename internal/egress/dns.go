package egress

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
)

// syntheticRange holds the addresses the gateway's DNS gives allowed
// names (RFC 2544's benchmarking range: never a real destination). A
// connection to one is a connection to its name, whatever the guest
// believes about it.
var syntheticRange = netip.MustParsePrefix("198.18.0.0/15")

// dnsTTL is the TTL of the gateway's answers: short, so that a policy
// change is seen soon by resolvers that cache.
const dnsTTL = 30

// nameTable maps allowed names to synthetic addresses and back.
type nameTable struct {
	mu sync.Mutex
	// +checklocks:mu
	byName map[string]netip.Addr
	// +checklocks:mu
	byAddr map[netip.Addr]string
	// +checklocks:mu
	next netip.Addr
}

func newNameTable() *nameTable {
	return &nameTable{byName: map[string]netip.Addr{}, byAddr: map[netip.Addr]string{}, next: syntheticRange.Addr().Next()}
}

// addr returns name's address, giving it the next free one on first use;
// ok is false when the range is used up.
func (t *nameTable) addr(name string) (netip.Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a, ok := t.byName[name]; ok {
		return a, true
	}
	for t.byAddr[t.next] != "" {
		t.next = t.next.Next()
	}
	if !syntheticRange.Contains(t.next) {
		return netip.Addr{}, false
	}
	a := t.next
	t.byName[name], t.byAddr[a] = a, name
	t.next = a.Next()
	return a, true
}

func (t *nameTable) name(a netip.Addr) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.byAddr[a]
	return n, ok
}

func (t *nameTable) all() map[string]netip.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]netip.Addr, len(t.byName))
	for n, a := range t.byName {
		out[n] = a
	}
	return out
}

func (t *nameTable) load(m map[string]netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for n, a := range m {
		if syntheticRange.Contains(a) && t.byAddr[a] == "" {
			t.byName[n], t.byAddr[a] = a, n
		}
	}
}

// listenDNS opens UDP port 53 on the gateway's address in the stack.
func (g *Gateway) listenDNS() (*gonet.UDPConn, error) {
	return gonet.DialUDP(g.stack, &tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(g.cfg.Gateway.As4()), Port: 53}, nil, ipv4.ProtocolNumber)
}

// serveDNS answers the guest's queries until the connection closes. It
// never forwards one: allowed names get their synthetic address, others
// NXDOMAIN.
func (g *Gateway) serveDNS(c *gonet.UDPConn) {
	buf := make([]byte, 4096)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				g.log.Debug("dns read", "err", err)
			}
			return
		}
		var q dns.Msg
		if q.Unpack(buf[:n]) != nil || q.Response || len(q.Question) != 1 {
			continue
		}
		resp := g.answer(&q)
		if b, err := resp.Pack(); err == nil {
			c.WriteTo(b, from)
		}
	}
}

func (g *Gateway) answer(q *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(q)
	resp.RecursionAvailable = true
	question := q.Question[0]
	name := normalize(question.Name)
	ev := Event{Proto: "dns", Name: name}
	if question.Qclass != dns.ClassINET || q.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeNotImplemented
		return resp
	}
	if !g.Policy().AllowsName(name) {
		resp.Rcode = dns.RcodeNameError
		ev.Reason = "the policy does not allow " + name
		g.audit(ev)
		return resp
	}
	ev.Allowed = true
	switch question.Qtype {
	case dns.TypeA:
		a, ok := g.names.addr(name)
		if !ok {
			resp.Rcode = dns.RcodeServerFailure
			ev.Allowed, ev.Reason = false, "out of synthetic addresses"
			break
		}
		ev.Addr = a.String()
		resp.Answer = append(resp.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
			A:   net.IP(a.AsSlice()),
		})
	default:
		// The name exists, but only as an IPv4 address (no AAAA: IPv6
		// is not routed).
	}
	if question.Qtype == dns.TypeA || !strings.HasPrefix(name, "_") {
		g.audit(ev)
	}
	return resp
}
