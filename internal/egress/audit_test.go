package egress

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// longInterval keeps a test's events in one aggregation interval: their
// lines are written at once (the first) or when the gateway closes.
func longInterval(c *Config) { c.AuditInterval = time.Hour }

// events is what the log holds.
func (l *auditLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// count is how many events ev stands for.
func count(ev Event) int { return max(ev.Count, 1) }

// TestAuditScan: a guest scanning 2000 ports of one address, then port 80
// of 500 addresses, is refused every time, and the log says so in a
// bounded number of lines whose counts add up to every attempt; the
// first refusal of a destination is written at once.
func TestAuditScan(t *testing.T) {
	gw, g, _, log := setupWith(t, longInterval, "api.test")
	target := netip.MustParseAddr("203.0.113.7")
	const ports = 2000
	for p := range ports {
		if c, err := g.dial(target, uint16(p+1)); err == nil {
			c.Close()
			t.Fatalf("port %d of %s: connected", p+1, target)
		}
		if p == 0 {
			log.find(t, func(e Event) bool { return e.Addr == target.String() && e.Port == 1 && e.Count == 0 })
		}
	}
	const hosts = 500
	base := netip.MustParseAddr("192.0.2.0").As4()
	inScan := func(a string) bool { return strings.HasPrefix(a, "192.0.2.") || strings.HasPrefix(a, "192.0.3.") }
	for i := range hosts {
		b := base
		b[2], b[3] = byte(2+(i+1)/256), byte((i+1)%256)
		if c, err := g.dial(netip.AddrFrom4(b), 80); err == nil {
			c.Close()
			t.Fatalf("%v: connected", netip.AddrFrom4(b))
		}
	}
	gw.Close() // writes the interval's lines

	var targetLines, targetCount, scanLines, scanCount, refused int
	for _, e := range log.all() {
		if e.Proto != "tcp" || e.Allowed {
			continue
		}
		refused++
		switch {
		case e.Addr == target.String():
			targetLines++
			targetCount += count(e)
		case inScan(e.Addr) || e.Addr == "":
			scanLines++
			scanCount += count(e)
		default:
			t.Errorf("an unexpected refusal: %+v", e)
		}
	}
	if targetCount != ports || targetLines > 2 {
		t.Errorf("scan of %d ports of %s: %d lines counting %d refusals, want at most 2 counting %d", ports, target, targetLines, targetCount, ports)
	}
	// The first line of each destination listed, one line for those
	// beyond; every destination is new, so none has a second line.
	if scanCount != hosts || scanLines > maxAuditKeys+2 {
		t.Errorf("scan of %d addresses: %d lines counting %d refusals, want at most %d counting %d", hosts, scanLines, scanCount, maxAuditKeys+2, hosts)
	}
	t.Logf("%d refusals in %d lines", ports+hosts, refused)
	for _, e := range log.all() {
		if e.Count > 1 {
			t.Logf("aggregated: %+v", e)
		}
	}
}

// TestAuditInterval: repeated refusals are written once per interval,
// and only while they go on.
func TestAuditInterval(t *testing.T) {
	var lines []Event
	a := newAggregator(func(e Event) { lines = append(lines, e) }, time.Hour)
	ev := Event{Proto: "udp", Addr: "1.1.1.1", Port: 443, Reason: "UDP goes only to the gateway's DNS"}
	for range 100 {
		a.add(ev)
	}
	a.flush(false) // the interval's end
	a.flush(false) // an idle interval: nothing, and the key is forgotten
	a.add(ev)      // so this is a first again
	a.add(Event{Proto: "tcp", Allowed: true, Addr: "1.1.1.1", Port: 443, BytesIn: 1})
	var got []int
	for _, l := range lines {
		got = append(got, count(l))
	}
	if want := []int{1, 99, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("lines counting %v, want %v: %+v", got, want, lines)
	}
}

func TestMaskPort(t *testing.T) {
	for _, tc := range []struct {
		reason string
		port   uint16
		want   string
	}{
		{"the policy does not allow x.test on port 1", 1, "the policy does not allow x.test on port #"},
		{"dial: dial tcp4 198.51.100.10:1: refused", 1, "dial: dial tcp4 198.51.100.10:#: refused"},
		{"port 80 of 10.80.0.1", 80, "port # of 10.80.0.1"},
		{"no port", 0, "no port"},
	} {
		if got := maskPort(tc.reason, tc.port); got != tc.want {
			t.Errorf("maskPort(%q, %d) = %q, want %q", tc.reason, tc.port, got, tc.want)
		}
	}
}

// TestCraftedFrames: frames the gateway's stack would drop without a
// word (to loopback, from a forged source, malformed) are dropped and
// audited.
func TestCraftedFrames(t *testing.T) {
	_, g, _, log := setup(t, "0.0.0.0/0")
	loop := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		name   string
		frame  []byte
		reason string
	}{
		{"tcp to 127.0.0.1", tcpSYN(guestIP, loop, 22, true), "a packet to 127.0.0.1"},
		{"tcp to 127.1.2.3", tcpSYN(guestIP, netip.MustParseAddr("127.1.2.3"), 80, true), "a packet to 127.1.2.3"},
		{"tcp to 224.0.0.1", tcpSYN(guestIP, netip.MustParseAddr("224.0.0.1"), 80, true), "a packet to 224.0.0.1"},
		{"tcp to 255.255.255.255", tcpSYN(guestIP, netip.MustParseAddr("255.255.255.255"), 80, true), "a packet to 255.255.255.255"},
		{"tcp from 127.0.0.1", tcpSYN(loop, upstreamIP, 80, true), "a packet from 127.0.0.1"},
		{"tcp from the gateway", tcpSYN(gatewayIP, upstreamIP, 80, true), "a packet from " + gatewayIP.String()},
		{"tcp with a bad checksum", tcpSYN(guestIP, upstreamIP, 81, false), "bad checksum"},
		{"udp to 127.0.0.1:53", ipv4Frame(header.UDPProtocolNumber, "127.0.0.1", 53), "a packet to 127.0.0.1"},
		{"a short frame", []byte{1, 2, 3}, "a frame of 3 bytes"},
		{"another ethertype", append(make([]byte, 12), 0x88, 0xb5, 0, 0), "ethertype 0x88b5"},
		{"a truncated IPv4 header", ipv4Frame(header.UDPProtocolNumber, "1.1.1.1", 53)[:header.EthernetMinimumSize+10], "malformed IPv4"},
	} {
		if err := g.frames.WriteFrame(tc.frame); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		log.find(t, func(e Event) bool { return !e.Allowed && strings.Contains(e.Reason, tc.reason) })
	}
}

// tcpSYN is an Ethernet frame from the guest's MAC holding a TCP
// connection request, with a good checksum or a bad one.
func tcpSYN(src, dst netip.Addr, port uint16, good bool) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+header.TCPMinimumSize)
	header.Ethernet(b).Encode(&header.EthernetFields{Type: header.IPv4ProtocolNumber,
		SrcAddr: tcpip.LinkAddress(net.HardwareAddr{2, 0, 0, 0, 0, 2}), DstAddr: tcpip.LinkAddress(net.HardwareAddr{0x02, 0x53, 0x50, 0, 0, 1})})
	ip := header.IPv4(b[header.EthernetMinimumSize:])
	s, d := tcpip.AddrFrom4(src.As4()), tcpip.AddrFrom4(dst.As4())
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(ip)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber), SrcAddr: s, DstAddr: d})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(ip.Payload())
	tcp.Encode(&header.TCPFields{SrcPort: 40000, DstPort: port, SeqNum: 1, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagSyn, WindowSize: 65535})
	sum := ^tcp.CalculateChecksum(header.PseudoHeaderChecksum(header.TCPProtocolNumber, s, d, uint16(len(tcp))))
	if !good {
		sum ^= 0x5555
	}
	tcp.SetChecksum(sum)
	return b
}
