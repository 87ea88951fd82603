package worker

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// counted counts the bytes h's requests move on the data plane as path:
// the request body read (in), the answer written (out), and, once a
// handler hijacks the connection (a WebSocket), what passes through it.
// Each read and write adds to a counter (an atomic add), so a stream is
// counted while it flows.
func (m *metrics) counted(path string, h http.HandlerFunc) http.HandlerFunc {
	in, out := m.dataIn[path], m.dataOut[path]
	return func(rw http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &countingBody{ReadCloser: r.Body, n: in}
		}
		h(&countingWriter{ResponseWriter: rw, in: in, out: out}, r)
	}
}

// countingBody counts what is read of a request body.
type countingBody struct {
	io.ReadCloser
	n prometheus.Counter
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.n.Add(float64(n))
	}
	return n, err
}

// countingWriter counts what is written of an answer. It unwraps (for
// http.ResponseController), flushes and hijacks through the writer it
// wraps; a hijacked connection is counted both ways.
type countingWriter struct {
	http.ResponseWriter
	in, out prometheus.Counter
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	if n > 0 {
		w.out.Add(float64(n))
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the wrapped writer.
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher for handlers that assert it.
func (w *countingWriter) Flush() {
	http.NewResponseController(w.ResponseWriter).Flush() // a writer that cannot flush buffers the answer
}

// Hijack implements http.Hijacker; the connection it returns counts
// what passes through it.
func (w *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return c, rw, err
	}
	// What the server read ahead already comes first, from the
	// connection itself: a caller may read the connection rather than
	// the reader (websocket.Accept does, for golang/go#32314).
	if err := rw.Writer.Flush(); err != nil {
		c.Close()
		return nil, nil, err
	}
	buffered, _ := rw.Reader.Peek(rw.Reader.Buffered())
	cc := &countingConn{Conn: c, ahead: bytes.Clone(buffered), in: w.in, out: w.out}
	rw.Reader.Reset(cc)
	rw.Writer.Reset(cc)
	return cc, rw, nil
}

// countingConn counts a hijacked connection's bytes.
type countingConn struct {
	net.Conn
	ahead   []byte // read by the server before the hijack, not yet returned
	in, out prometheus.Counter
}

// Read returns what was read ahead first, then reads the connection.
// Like the net.Conn it wraps, it is for one reader at a time.
func (c *countingConn) Read(p []byte) (int, error) {
	var n int
	var err error
	if len(c.ahead) > 0 {
		n = copy(p, c.ahead)
		c.ahead = c.ahead[n:]
	} else {
		n, err = c.Conn.Read(p)
	}
	if n > 0 {
		c.in.Add(float64(n))
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.out.Add(float64(n))
	}
	return n, err
}
