package egress

import (
	"errors"
	"net"
	"net/netip"
	"strings"

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
		g.audit(ev, refusedNotAllowed)
		return resp
	}
	ev.Allowed = true
	why := refusedFailed
	switch question.Qtype {
	case dns.TypeA:
		a, err := g.names.addr(name, !g.Policy().allowsExactName(name))
		if errors.Is(err, errWildcardLimit) {
			g.refuseName(q, resp, &ev)
			why = refusedWildcardLimit
			break
		}
		if err != nil {
			resp.Rcode = dns.RcodeServerFailure
			ev.Allowed, ev.Reason = false, err.Error()
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
		g.audit(ev, why)
	}
	return resp
}
