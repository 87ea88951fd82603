package client

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"space/internal/agent/proto"
	"space/internal/errkind"
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
