package proto

import (
	"bufio"
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// YamuxConfig is the session configuration both sides use. Keep-alives are
// off: an idle guest must not wake up, and the host checks health itself.
// The stream window bounds how much one call can buffer on either side.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.MaxStreamWindowSize = 1 << 20
	c.AcceptBacklog = 256
	c.StreamCloseTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}

// Buffered returns conn with reads served from br first: the handshake
// reads through a bufio.Reader that may already hold the first session
// bytes.
func Buffered(br *bufio.Reader, conn io.ReadWriteCloser) io.ReadWriteCloser {
	return &bufferedConn{r: br, ReadWriteCloser: conn}
}

type bufferedConn struct {
	r *bufio.Reader
	io.ReadWriteCloser
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
