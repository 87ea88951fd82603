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

// DefaultMTU is the guest link's IP MTU unless Config.MTU says otherwise;
// MaxMTU is the most it may be (a frame then fills a 64 KiB read).
const (
	DefaultMTU = 1500
	MaxMTU     = 65520
)

// Frames carries whole Ethernet frames between the gateway and the
// guest NIC's backend.
type Frames interface {
	// ReadFrame reads the next frame from the guest into buf (at least
	// maxReadFrame bytes). A stream framing cannot go on after a frame
	// too large for the link (an error); a packet socket returns it and
	// the link drops it.
	ReadFrame(buf []byte) (int, error)
	// WriteFrame sends one frame to the guest.
	WriteFrame(frame []byte) error
	// Close ends both directions; a ReadFrame in progress returns.
	Close() error
}

// maxReadFrame is the buffer ReadFrame gets: a guest may send frames
// larger than the link's (a segmentation offload it should not use); they
// are read whole and dropped.
const maxReadFrame = 64 << 10

// StreamFrames frames a byte stream as QEMU's stream and socket netdevs
// do: each frame after its length, 4 bytes big endian.
func StreamFrames(conn io.ReadWriteCloser) Frames {
	return &streamFrames{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
}

type streamFrames struct {
	conn io.ReadWriteCloser
	r    *bufio.Reader // ReadFrame's alone
	wmu  sync.Mutex
}

func (s *streamFrames) ReadFrame(buf []byte) (int, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int(n) > len(buf) {
		return 0, fmt.Errorf("frame of %d bytes from the guest", n)
	}
	_, err := io.ReadFull(s.r, buf[:n])
	return int(n), err
}

func (s *streamFrames) WriteFrame(frame []byte) error { return s.WriteFrames([][]byte{frame}) }

// WriteFrames sends frames in one write.
func (s *streamFrames) WriteFrames(frames [][]byte) error {
	n := 0
	for _, f := range frames {
		n += 4 + len(f)
	}
	out := make([]byte, 0, n)
	for _, f := range frames {
		out = binary.BigEndian.AppendUint32(out, uint32(len(f)))
		out = append(out, f...)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.conn.Write(out)
	return err
}

func (s *streamFrames) Close() error { return s.conn.Close() }

// frameLink moves Ethernet frames between a netstack NIC and the guest
// NIC's backend.
type frameLink struct {
	ep       *channel.Endpoint
	frames   Frames
	maxFrame int                     // the link's MTU and an Ethernet header
	filter   func(frame []byte) bool // false drops a frame from the guest; it sees every frame, of whatever size
}

func newFrameLink(frames Frames, mtu int, mac tcpip.LinkAddress, filter func([]byte) bool) *frameLink {
	max := mtu + header.EthernetMinimumSize
	return &frameLink{ep: channel.New(512, uint32(max), mac), frames: frames, maxFrame: max, filter: filter}
}

// run moves frames both ways until the backend or ctx ends.
func (l *frameLink) run(ctx context.Context) error {
	errc := make(chan error, 2)
	go func() { errc <- l.fromGuest() }()
	go func() { errc <- l.toGuest(ctx) }()
	err := <-errc
	l.frames.Close()
	l.ep.Close()
	return err
}

func (l *frameLink) fromGuest() error {
	buf := make([]byte, maxReadFrame)
	for {
		n, err := l.frames.ReadFrame(buf)
		if err != nil {
			return err
		}
		frame := buf[:n]
		if !l.filter(frame) || n < header.EthernetMinimumSize || n > l.maxFrame { // the filter sees (and audits) every frame
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), frame...))})
		l.ep.InjectInbound(0, pkt) // the ethernet endpoint reads the type
		pkt.DecRef()
	}
}

// maxBatch bounds the frames toGuest hands a batching backend at once.
const maxBatch = 64

func (l *frameLink) toGuest(ctx context.Context) error {
	batcher, _ := l.frames.(frameBatcher)
	batch := make([][]byte, 0, maxBatch)
	for {
		pkt := l.ep.ReadContext(ctx)
		if pkt == nil {
			return ctx.Err()
		}
		if batcher == nil {
			v := pkt.ToView()
			pkt.DecRef()
			err := l.frames.WriteFrame(v.AsSlice())
			v.Release()
			if err != nil {
				return err
			}
			continue
		}
		// What else is queued goes in the same write.
		batch = batch[:0]
		for pkt != nil {
			batch = append(batch, pkt.ToView().ToSlice())
			pkt.DecRef()
			if len(batch) == maxBatch {
				break
			}
			pkt = l.ep.Read()
		}
		if err := batcher.WriteFrames(batch); err != nil {
			return err
		}
	}
}

// frameBatcher is a backend that sends several frames in one go.
type frameBatcher interface {
	WriteFrames(frames [][]byte) error
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
