package egress

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// ping sends one echo request from the guest's stack to dst and reports
// whether a reply came within two seconds.
func (g *guest) ping(t *testing.T, dst netip.Addr) bool {
	t.Helper()
	var wq waiter.Queue
	ep, err := g.s.NewEndpoint(icmp.ProtocolNumber4, ipv4.ProtocolNumber, &wq)
	if err != nil {
		t.Fatalf("icmp endpoint: %s", err)
	}
	defer ep.Close()
	if err := ep.Connect(tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(dst.As4())}); err != nil {
		t.Fatalf("icmp connect: %s", err)
	}
	msg := make([]byte, header.ICMPv4MinimumSize+8)
	header.ICMPv4(msg).SetType(header.ICMPv4Echo)
	header.ICMPv4(msg).SetSequence(1)
	copy(header.ICMPv4(msg).Payload(), "space-ok")
	we, ch := waiter.NewChannelEntry(waiter.ReadableEvents)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	var r bytes.Reader
	r.Reset(msg)
	if _, err := ep.Write(&r, tcpip.WriteOptions{}); err != nil {
		t.Fatalf("icmp write: %s", err)
	}
	deadline := time.After(2 * time.Second)
	for {
		var out bytes.Buffer
		if _, err := ep.Read(&out, tcpip.ReadOptions{}); err == nil {
			return strings.HasSuffix(out.String(), "space-ok")
		}
		select {
		case <-ch:
		case <-deadline:
			return false
		}
	}
}

// TestPing: with ICMP allowed, the guest's pings to an allowed name and
// to an address an address rule covers are answered (the gateway pings
// the real upstream); pings the rules do not allow on every port, or
// without ICMP allowed, are not, and each decision is audited.
func TestPing(t *testing.T) {
	gw, g, _, log := setup(t, "api.test", "web.test:443", upstreamIP.String())
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	web, _, _ := g.resolve(t, gatewayIP, "web.test")
	if len(api) != 1 || len(web) != 1 {
		t.Fatalf("resolve: %v %v", api, web)
	}
	if g.ping(t, upstreamIP) || g.ping(t, api[0]) {
		t.Errorf("a ping was answered without ICMP allowed")
	}
	log.find(t, func(e Event) bool { return e.Proto == "icmp" && !e.Allowed })

	p := gw.Policy()
	p.ICMP = true
	gw.SetPolicy(p)
	if !g.ping(t, upstreamIP) {
		t.Errorf("ping %s (an address rule) was not answered", upstreamIP)
	}
	if !g.ping(t, api[0]) {
		t.Errorf("ping api.test (%s) was not answered", api[0])
	}
	log.find(t, func(e Event) bool {
		return e.Proto == "icmp" && e.Allowed && e.Name == "api.test" && e.Addr == upstreamIP.String()
	})
	if g.ping(t, web[0]) {
		t.Errorf("ping web.test, allowed on port 443 only, was answered")
	}
	log.find(t, func(e Event) bool { return e.Proto == "icmp" && !e.Allowed && e.Name == "web.test" })
	if other := netip.MustParseAddr("198.51.100.99"); g.ping(t, other) {
		t.Errorf("ping %s, which no rule covers, was answered", other)
	}
}
