package egress

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"space/internal/netns"
)

// OpenTap attaches to the host side of tap device ifname in the network
// namespace at nsPath ("" = ours), for a VMM that holds the tap itself
// (Firecracker opens its tap by name). Frames go through a packet socket
// bound to the device: what the guest sends arrives on it, and what the
// gateway writes to it goes out to the guest. The namespace should hold
// nothing else (see tap.Create): its kernel sees the guest's frames too,
// but with no address, route or forwarding it answers none of them.
//
// The guest must not use segmentation or checksum offloads (the agent
// turns them off): a frame larger than the link is dropped.
func OpenTap(nsPath, ifname string) (Frames, error) {
	var f *os.File
	err := netns.Do(nsPath, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("tap %s: %w", ifname, err)
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, proto)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		// Our own frames to the guest would come back as outgoing ones.
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil && !errors.Is(err, unix.ENOPROTOOPT) {
			unix.Close(fd)
			return fmt.Errorf("packet socket: ignore outgoing: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %s: %w", ifname, err)
		}
		f = os.NewFile(uintptr(fd), "packet:"+ifname)
		return nil
	})
	if err != nil {
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &packetFrames{f: f, rc: rc}, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// packetFrames is a packet socket on a tap, registered with the runtime's
// poller (so Close ends a blocked read).
type packetFrames struct {
	f  *os.File
	rc interface {
		Read(func(fd uintptr) bool) error
		Write(func(fd uintptr) bool) error
	}
}

func (p *packetFrames) ReadFrame(buf []byte) (int, error) {
	for {
		var n int
		var from unix.Sockaddr
		var rerr error
		err := p.rc.Read(func(fd uintptr) bool {
			// MSG_TRUNC: the frame's own length, even past buf.
			n, from, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_TRUNC)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			return 0, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // a kernel without PACKET_IGNORE_OUTGOING
		}
		return min(n, len(buf)), nil // past the link's frame size: the link drops it
	}
}

func (p *packetFrames) WriteFrame(frame []byte) error {
	var werr error
	err := p.rc.Write(func(fd uintptr) bool {
		_, werr = unix.Write(int(fd), frame)
		return werr != unix.EAGAIN
	})
	if err == nil {
		err = werr
	}
	if errors.Is(err, unix.ENETDOWN) || errors.Is(err, unix.ENOBUFS) {
		return nil // no VMM on the tap yet, or its queue is full: the frame is lost, as on a wire
	}
	return err
}

func (p *packetFrames) Close() error { return p.f.Close() }
