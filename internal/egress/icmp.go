package egress

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Pings. With Policy.ICMP, an echo request the guest sends to what the
// rules allow on any port (an allowed name's synthetic address, or an
// address an address rule covers) is sent on by the gateway itself, from
// a socket of its own to the name's real address, and the answer comes
// back to the guest from the address it pinged. Nothing else of ICMP
// leaves: other types, and echoes the policy does not allow, are dropped
// and audited.

// maxPings bounds the echo requests in flight per gateway; more are
// dropped.
const maxPings = 8

// pingTimeout is how long an echo reply is waited for.
const pingTimeout = 3 * time.Second

// echoRequest is what the gateway keeps of a guest's echo request.
type echoRequest struct {
	guestMAC tcpip.LinkAddress
	guest    netip.Addr // its source
	dst      netip.Addr // where the guest sent it
	ident    uint16
	seq      uint16
	payload  []byte
}

// parseEcho reads an ICMPv4 echo request out of an Ethernet frame; ok is
// false for anything else.
func parseEcho(frame []byte) (echoRequest, bool) {
	eth := header.Ethernet(frame)
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) || ip.FragmentOffset() != 0 || ip.More() {
		return echoRequest{}, false
	}
	icmp := header.ICMPv4(ip.Payload())
	if len(icmp) < header.ICMPv4MinimumSize || icmp.Type() != header.ICMPv4Echo || icmp.Code() != 0 {
		return echoRequest{}, false
	}
	return echoRequest{
		guestMAC: eth.SourceAddress(),
		guest:    netip.AddrFrom4(ip.SourceAddress().As4()),
		dst:      netip.AddrFrom4(ip.DestinationAddress().As4()),
		ident:    icmp.Ident(),
		seq:      icmp.Sequence(),
		payload:  append([]byte(nil), icmp.Payload()...),
	}, true
}

// ping decides an echo request from the guest and, if allowed, answers it
// with the real target's reply. It runs on its own goroutine.
func (g *Gateway) ping(req echoRequest) {
	defer func() { <-g.pings }()
	ev := Event{Proto: "icmp", Addr: req.dst.String()}
	p := g.Policy()
	target := req.dst
	name, synthetic := g.names.name(req.dst)
	ctx, cancel := context.WithTimeout(g.ctx, 15*time.Second)
	defer cancel()
	why := refusedNotAllowed
	switch {
	case !p.ICMP:
		ev.Reason = "the policy allows no ICMP"
	case synthetic && !p.allowsHostPort(name, 0):
		ev.Name, ev.Reason = name, "no rule allows "+name+" on every port"
	case !synthetic && !p.allowsAddr(req.dst, 0):
		ev.Reason = "no address rule covers " + req.dst.String() + " on every port"
	case !synthetic && hostOnly(req.dst) && !p.namesExactly(req.dst):
		ev.Reason, why = "a loopback, link-local or metadata address: only a rule naming it exactly allows it", refusedSpecialAddress
	case synthetic:
		ev.Name = name
		addrs, err := g.cfg.Resolve(ctx, name)
		if err != nil || len(addrs) == 0 {
			ev.Reason, why = fmt.Sprintf("resolving %s: %v", name, err), refusedFailed
			break
		}
		target = addrs[0].Unmap()
		ev.Addr = target.String()
		if special(target) && !p.namesExactly(target) {
			ev.Reason, why = name+" resolves to "+target.String()+", which the policy does not name", refusedSpecialAddress
		}
	}
	if ev.Reason == "" {
		why = refusedFailed
		var reply []byte
		reply, ev.Reason = g.echo(ctx, target, req)
		if ctx.Err() != nil && g.ctx.Err() != nil {
			return // the gateway closed
		}
		if ev.Reason == "" {
			ev.Allowed = true
			ev.BytesOut, ev.BytesIn = int64(len(req.payload)), int64(len(reply))
			if err := g.link.frames.WriteFrame(g.echoReplyFrame(req, reply)); err != nil {
				g.log.Debug("echo reply to the guest", "err", err)
			}
		}
	}
	g.audit(ev, why)
}

// echo sends the guest's echo request to target from the gateway's own
// socket and returns the reply's payload, or why there is none.
func (g *Gateway) echo(ctx context.Context, target netip.Addr, req echoRequest) (payload []byte, reason string) {
	c, err := g.cfg.Dial(ctx, "ip4:icmp", target.String())
	if err != nil {
		return nil, "ping socket: " + err.Error()
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })() // a gateway that closes ends the wait
	msg := make([]byte, header.ICMPv4MinimumSize+len(req.payload))
	icmp := header.ICMPv4(msg)
	icmp.SetType(header.ICMPv4Echo)
	icmp.SetIdent(req.ident)
	icmp.SetSequence(req.seq)
	copy(icmp.Payload(), req.payload)
	icmp.SetChecksum(^checksum.Checksum(msg, 0))
	if _, err := c.Write(msg); err != nil {
		return nil, "ping: " + err.Error()
	}
	c.SetReadDeadline(time.Now().Add(pingTimeout))
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return nil, "no echo reply"
			}
			return nil, "ping: " + err.Error()
		}
		msg := buf[:n]
		if n >= header.IPv4MinimumSize && msg[0]>>4 == 4 {
			// A raw socket's read keeps the IP header (an ICMP
			// type never starts with 4 in its high nibble).
			msg = msg[min(int(msg[0]&0x0f)*4, n):]
		}
		r := header.ICMPv4(msg)
		if len(r) >= header.ICMPv4MinimumSize && r.Type() == header.ICMPv4EchoReply && r.Ident() == req.ident && r.Sequence() == req.seq {
			return append([]byte(nil), r.Payload()...), ""
		}
	}
}

// echoReplyFrame is the frame that answers req with payload, from the
// address the guest pinged.
func (g *Gateway) echoReplyFrame(req echoRequest, payload []byte) []byte {
	icmpLen := header.ICMPv4MinimumSize + len(payload)
	frame := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+icmpLen)
	header.Ethernet(frame).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress(g.cfg.MAC), DstAddr: req.guestMAC, Type: header.IPv4ProtocolNumber,
	})
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	var id [2]byte
	rand.Read(id[:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(header.IPv4MinimumSize + icmpLen), ID: binary.BigEndian.Uint16(id[:]), TTL: 64,
		Protocol: uint8(header.ICMPv4ProtocolNumber),
		SrcAddr:  tcpip.AddrFrom4(req.dst.As4()), DstAddr: tcpip.AddrFrom4(req.guest.As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(ip.Payload())
	icmp.SetType(header.ICMPv4EchoReply)
	icmp.SetIdent(req.ident)
	icmp.SetSequence(req.seq)
	copy(icmp.Payload(), payload)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	return frame
}
