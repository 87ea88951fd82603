package egress

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// maxFrame bounds one Ethernet frame on the NIC (no jumbo frames).
const maxFrame = 1514

// mtu is the guest's IP MTU.
const mtu = 1500

// frameLink carries Ethernet frames between a netstack NIC and the VMM's
// end of the guest NIC: each frame after its length, 4 bytes big endian,
// as QEMU's stream and socket netdevs write them.
type frameLink struct {
	ep     *channel.Endpoint
	conn   io.ReadWriteCloser
	filter func(frame []byte) bool // false drops a frame from the guest
	wmu    sync.Mutex
}

func newFrameLink(conn io.ReadWriteCloser, mac tcpip.LinkAddress, filter func([]byte) bool) *frameLink {
	return &frameLink{ep: channel.New(512, mtu+header.EthernetMinimumSize, mac), conn: conn, filter: filter}
}

// run moves frames both ways until the connection or ctx ends.
func (l *frameLink) run(ctx context.Context) error {
	errc := make(chan error, 2)
	go func() { errc <- l.fromGuest() }()
	go func() { errc <- l.toGuest(ctx) }()
	err := <-errc
	l.conn.Close()
	l.ep.Close()
	return err
}

func (l *frameLink) fromGuest() error {
	r := bufio.NewReaderSize(l.conn, 64<<10)
	var hdr [4]byte
	buf := make([]byte, maxFrame)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame {
			return fmt.Errorf("frame of %d bytes from the guest", n)
		}
		frame := buf[:n]
		if _, err := io.ReadFull(r, frame); err != nil {
			return err
		}
		if n < header.EthernetMinimumSize || !l.filter(frame) {
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), frame...))})
		l.ep.InjectInbound(0, pkt) // the ethernet endpoint reads the type
		pkt.DecRef()
	}
}

func (l *frameLink) toGuest(ctx context.Context) error {
	for {
		pkt := l.ep.ReadContext(ctx)
		if pkt == nil {
			return ctx.Err()
		}
		v := pkt.ToView()
		pkt.DecRef()
		frame := v.AsSlice()
		out := make([]byte, 4+len(frame))
		binary.BigEndian.PutUint32(out, uint32(len(frame)))
		copy(out[4:], frame)
		v.Release()
		l.wmu.Lock()
		_, err := l.conn.Write(out)
		l.wmu.Unlock()
		if err != nil {
			return err
		}
	}
}

// packetInfo is what the filter reads of a frame from the guest.
type packetInfo struct {
	ethType tcpip.NetworkProtocolNumber
	proto   tcpip.TransportProtocolNumber // IPv4 only
	src     netip.Addr
	dst     netip.Addr
	dstPort uint16 // TCP and UDP
}

var errShort = errors.New("short packet")

func parseFrame(frame []byte) (packetInfo, error) {
	eth := header.Ethernet(frame)
	info := packetInfo{ethType: eth.Type()}
	if info.ethType != header.IPv4ProtocolNumber {
		return info, nil
	}
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) {
		return info, errShort
	}
	info.proto = ip.TransportProtocol()
	info.src = netip.AddrFrom4(ip.SourceAddress().As4())
	info.dst = netip.AddrFrom4(ip.DestinationAddress().As4())
	payload := ip.Payload()
	switch info.proto {
	case header.TCPProtocolNumber, header.UDPProtocolNumber:
		if len(payload) < 4 || ip.FragmentOffset() != 0 {
			return info, nil // a later fragment: no ports
		}
		info.dstPort = binary.BigEndian.Uint16(payload[2:4])
	}
	return info, nil
}
