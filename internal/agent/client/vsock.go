package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"space/internal/agent/proto"
	"space/internal/errkind"

	"golang.org/x/sys/unix"
)

// DialHybridVsock connects to the guest's vsock port through Firecracker's
// hybrid vsock: the VMM listens on a unix socket (the vsock device's
// uds_path) and forwards a connection to a guest port after a
// "CONNECT <port>\n" line, answered with "OK <host port>\n". Then it runs
// the agent handshake on that connection.
func DialHybridVsock(ctx context.Context, udsPath string, port uint32) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", udsPath)
	if err != nil {
		return nil, fmt.Errorf("dial vsock: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// One write: the VMM reads the command line from a single packet.
	if _, err := conn.Write([]byte("CONNECT " + strconv.FormatUint(uint64(port), 10) + "\n")); err != nil {
		conn.Close()
		return nil, fmt.Errorf("vsock connect to port %d: %w", port, err)
	}
	// Read the reply byte by byte: what follows it belongs to the agent.
	br := bufio.NewReaderSize(conn, 16)
	var line []byte
	for len(line) < 64 {
		b, err := br.ReadByte()
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("vsock connect to port %d: no reply (is the agent listening?): %v: %w", port, err, errkind.Unavailable)
		}
		if b == '\n' {
			break
		}
		line = append(line, b)
	}
	if !strings.HasPrefix(string(line), "OK ") {
		conn.Close()
		return nil, fmt.Errorf("vsock connect to port %d: reply %.64q: %w", port, line, errkind.Unavailable)
	}
	conn.SetDeadline(time.Time{})
	return Dial(ctx, proto.Buffered(br, conn))
}

// DialVsock connects to the guest agent at an AF_VSOCK address (a guest
// with a vhost-vsock device) and runs the handshake.
func DialVsock(ctx context.Context, cid, port uint32) (*Client, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %v: %w", err, errkind.Unavailable)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("vsock:%d:%d", cid, port))
	// A non-blocking connect completes in the background; wait for it
	// through the runtime poller so ctx is honoured.
	err = unix.Connect(fd, &unix.SockaddrVM{CID: cid, Port: port})
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		f.Close()
		return nil, fmt.Errorf("vsock connect %d:%d: %v: %w", cid, port, err, errkind.Unavailable)
	}
	if errors.Is(err, unix.EINPROGRESS) {
		rc, err := f.SyscallConn()
		if err != nil {
			f.Close()
			return nil, err
		}
		if dl, ok := ctx.Deadline(); ok {
			f.SetWriteDeadline(dl)
		}
		var soErr int
		waited := false
		werr := rc.Write(func(fd uintptr) bool {
			if !waited { // wait for writability: the connect's end
				waited = true
				return false
			}
			soErr, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
			return true
		})
		f.SetWriteDeadline(time.Time{})
		if werr == nil && err == nil && soErr != 0 {
			err = unix.Errno(soErr)
		}
		if werr != nil || err != nil {
			f.Close()
			return nil, fmt.Errorf("vsock connect %d:%d: %v: %w", cid, port, errors.Join(werr, err), errkind.Unavailable)
		}
	}
	return Dial(ctx, f)
}
