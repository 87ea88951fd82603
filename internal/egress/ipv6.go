package egress

import (
	"net/netip"
	"strconv"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// IPv6. A link with IPv6 addresses (Config.Gateway6) carries TCP to IPv6
// addresses the policy's address rules allow: the forwarder decides each
// connection as for IPv4, and the gateway dials the address itself. Names
// stay IPv4 (DNS answers only A records, with synthetic addresses). What
// else the guest may send is neighbour discovery for the gateway's
// address and pings to the gateway; all other IPv6 is dropped and audited.

// admit6 is admit for an IPv6 frame.
func (g *Gateway) admit6(frame []byte) bool {
	if !g.cfg.Gateway6.IsValid() {
		g.drop(refusedNotRouted, "ipv6", "", 0, "IPv6 is not routed")
		return false
	}
	ip := header.IPv6(frame[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) {
		g.drop(refusedNotRouted, "ipv6", "", 0, "a malformed IPv6 packet")
		return false
	}
	dst := netip.AddrFrom16(ip.DestinationAddress().As16())
	switch ip.TransportProtocol() {
	case header.TCPProtocolNumber:
		if why := martian6(dst); why != "" {
			g.drop(refusedSpecialAddress, "tcp", dst.String(), 0, why)
			return false
		}
		return true // the forwarder decides
	case header.ICMPv6ProtocolNumber:
		icmp := header.ICMPv6(ip.Payload())
		if len(icmp) < header.ICMPv6MinimumSize {
			return false
		}
		switch icmp.Type() {
		case header.ICMPv6NeighborSolicit:
			// Only for the gateway's address: the guest's own checks
			// for duplicates must not be answered.
			ns := header.NDPNeighborSolicit(icmp.MessageBody())
			return len(icmp.MessageBody()) >= header.NDPNSMinimumSize &&
				netip.AddrFrom16(ns.TargetAddress().As16()) == g.cfg.Gateway6
		case header.ICMPv6NeighborAdvert:
			return true // the guest's answers to the gateway
		case header.ICMPv6EchoRequest:
			if dst == g.cfg.Gateway6 {
				return true
			}
			g.drop(refusedNotRouted, "icmp6", dst.String(), 0, "ICMPv6 goes only to the gateway")
		case header.ICMPv6RouterSolicit, header.ICMPv6MulticastListenerReport, header.ICMPv6MulticastListenerV2Report,
			header.ICMPv6MulticastListenerDone:
			// What a kernel sends when its link comes up: no one answers.
		default:
			g.drop(refusedNotRouted, "icmp6", dst.String(), 0, "ICMPv6 type "+strconv.Itoa(int(icmp.Type()))+" is not routed")
		}
	case header.UDPProtocolNumber:
		g.drop(refusedNotRouted, "udp6", dst.String(), 0, "UDP goes only to the gateway's DNS, over IPv4")
	default:
		g.drop(refusedNotRouted, "ipv6", dst.String(), 0, "IPv6 next header "+strconv.Itoa(int(ip.NextHeader()))+" is not routed (extension headers included)")
	}
	return false
}
