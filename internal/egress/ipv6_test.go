package egress

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"

	"space/internal/egress/egresstest"
)

// TestGatewayIPv6: on a link with IPv6, a connection to an IPv6 address
// works on the port an address rule names, and nowhere else; names still
// resolve to IPv4 only; UDP over IPv6 is dropped and audited. Without
// IPv6 on the link, nothing of it passes.
func TestGatewayIPv6(t *testing.T) {
	six := func(c *Config) { c.Gateway6, c.Guest6 = gatewayIP6, guestIP6 }
	_, g, _, log := setupWith(t, six, "["+egresstest.Addr6.String()+"]:80", "api.test")
	if got, err := httpGet(g, egresstest.Addr6, "up6", "/"); err != nil || got != "200 OK hello up6" {
		t.Errorf("GET http://[%s]/ = %q, %v", egresstest.Addr6, got, err)
	}
	log.find(t, func(e Event) bool { return e.Allowed && e.Addr == egresstest.Addr6.String() && e.Port == 80 })
	if got, err := httpGet(g, egresstest.Addr6, "up6", "/"); err != nil || !strings.HasPrefix(got, "200") {
		t.Errorf("a second connection = %q, %v", got, err)
	}
	if c, err := g.dial(egresstest.Addr6, 443); err == nil {
		c.Close()
		t.Errorf("IPv6 on a port no rule names: connected")
	}
	if c, err := g.dial(netip.MustParseAddr("2001:db8::11"), 80); err == nil {
		c.Close()
		t.Errorf("an IPv6 address no rule covers: connected")
	}
	log.find(t, func(e Event) bool { return !e.Allowed && e.Addr == "2001:db8::11" })
	if addrs, rcode, err := g.resolve(t, gatewayIP, "api.test"); err != nil || rcode != dns.RcodeSuccess || len(addrs) != 1 || !addrs[0].Is4() {
		t.Errorf("resolve api.test = %v, %d, %v; want one IPv4 address", addrs, rcode, err)
	}

	u, err := gonet.DialUDP(g.s, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom16(egresstest.Addr6.As16()), Port: 53}, ipv6.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	u.Write([]byte("query"))
	u.Close()
	log.find(t, func(e Event) bool { return e.Proto == "udp6" && !e.Allowed && e.Addr == egresstest.Addr6.String() })

	// Without IPv6 on the link the same rule buys nothing.
	_, g4, _, log4 := setup(t, "["+egresstest.Addr6.String()+"]:80")
	if c, err := g4.dial(egresstest.Addr6, 80); err == nil {
		c.Close()
		t.Errorf("IPv6 on a link without it: connected")
	}
	log4.find(t, func(e Event) bool { return e.Proto == "ipv6" && !e.Allowed })
}

// TestHostOnlyAddresses: a rule covering every address reaches the
// network but not the gateway host's link-local or metadata addresses (a
// guest's own loopback and IPv6 link-local never reach the gateway: they
// are local to it, or on a link where the gateway answers only for
// itself); a rule naming such an address exactly does.
func TestHostOnlyAddresses(t *testing.T) {
	six := func(c *Config) { c.Gateway6, c.Guest6 = gatewayIP6, guestIP6 }
	gw, g, _, log := setupWith(t, six, "0.0.0.0/0", "::/0")
	if got, err := httpGet(g, upstreamIP, "up", "/"); err != nil || got != "200 OK hello up" {
		t.Errorf("GET http://%s/ under 0.0.0.0/0 = %q, %v", upstreamIP, got, err)
	}
	for _, a := range []string{"169.254.169.254", "169.254.0.1", "0.0.0.1"} {
		addr := netip.MustParseAddr(a)
		if c, err := g.dial(addr, 80); err == nil {
			c.Close()
			t.Errorf("%s under a rule covering every address: connected", a)
		}
		log.find(t, func(e Event) bool { return e.Addr == a && strings.Contains(e.Reason, "exactly") })
	}
	// Named exactly, the metadata address is allowed (here the dial then
	// fails: nothing listens there in the test's namespace).
	p := gw.Policy()
	p.Allow = mustRules(t, "169.254.169.254")
	gw.SetPolicy(p)
	if c, err := g.dial(netip.MustParseAddr("169.254.169.254"), 80); err == nil {
		c.Close()
	}
	log.find(t, func(e Event) bool {
		return e.Addr == "169.254.169.254" && e.Reason != "" && !strings.Contains(e.Reason, "exactly") && !strings.Contains(e.Reason, "policy")
	})
}
