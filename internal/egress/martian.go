package egress

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Martians. The stack drops some packets without a word: to a loopback
// or multicast address, to the broadcast or unspecified address (TCP),
// from an address not the guest's, TCP with a bad header or checksum.
// admit drops them first, and audits them, so that a guest probing the
// gateway's own host or its stack leaves a trace. (A rule naming such an
// address exactly lets a name resolve to it, the gateway dialing it;
// never a packet to it.) Other reserved destinations (0.0.0.0/8,
// 240.0.0.0/4) reach the TCP forwarder, which refuses and audits them.

// martian4 says why the stack would drop an IPv4 packet from the guest
// without a word, or "" when it would not.
func (g *Gateway) martian4(frame []byte, info packetInfo) string {
	switch {
	case info.src != g.cfg.Guest:
		return "a packet from " + info.src.String() + ", not the guest's address"
	case info.dst.IsLoopback() || info.dst.IsMulticast() || info.dst.IsUnspecified() || info.dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "a packet to " + info.dst.String() + " (loopback, unspecified, multicast or broadcast) never leaves the guest's link"
	case info.proto == header.TCPProtocolNumber:
		return badTCP4(header.IPv4(frame[header.EthernetMinimumSize:]))
	}
	return ""
}

// badTCP4 says what is wrong with the TCP header of an IPv4 packet, or
// "". The checksum is checked for connection requests only (cheap, and
// what a scan sends); the stack checks every segment's.
func badTCP4(ip header.IPv4) string {
	if ip.FragmentOffset() != 0 || ip.More() {
		return "" // reassembled first
	}
	tcp := header.TCP(ip.Payload())
	if len(tcp) < header.TCPMinimumSize || int(tcp.DataOffset()) < header.TCPMinimumSize || int(tcp.DataOffset()) > len(tcp) {
		return "a malformed TCP header"
	}
	if f := tcp.Flags(); f.Contains(header.TCPFlagSyn) && !f.Contains(header.TCPFlagAck) {
		payload := tcp[tcp.DataOffset():]
		if !tcp.IsChecksumValid(ip.SourceAddress(), ip.DestinationAddress(), checksum.Checksum(payload, 0), uint16(len(payload))) {
			return "a TCP connection request with a bad checksum"
		}
	}
	return ""
}

// martian6 is martian4 for IPv6 TCP: loopback, unspecified, multicast
// and IPv4-mapped destinations.
func martian6(dst netip.Addr) string {
	if dst.IsLoopback() || dst.IsUnspecified() || dst.IsMulticast() || dst.Is4In6() {
		return "a packet to " + dst.String() + " (loopback, unspecified, multicast or IPv4-mapped) never leaves the guest's link"
	}
	return ""
}

// protoName is an IPv4 transport protocol as events name it.
func protoName(p tcpip.TransportProtocolNumber) string {
	switch p {
	case header.TCPProtocolNumber:
		return "tcp"
	case header.UDPProtocolNumber:
		return "udp"
	case header.ICMPv4ProtocolNumber:
		return "icmp"
	}
	return "ip"
}
