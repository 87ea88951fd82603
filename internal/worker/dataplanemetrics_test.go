package worker

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCountedWebSocket checks that a WebSocket served through the
// data plane's byte counting still works, and that its bytes are
// counted both ways through the hijacked connection.
func TestCountedWebSocket(t *testing.T) {
	m := &metrics{dataPlaneIO: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_bytes_total", Help: "t"}, []string{"path", "direction"}),
		dataIn: map[string]prometheus.Counter{}, dataOut: map[string]prometheus.Counter{}}
	m.dataIn[pathTerminal], m.dataOut[pathTerminal] = m.dataPlaneIO.WithLabelValues(pathTerminal, "in"), m.dataPlaneIO.WithLabelValues(pathTerminal, "out")
	srv := httptest.NewServer(m.counted(pathTerminal, func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, b); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	ctx := t.Context()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatalf("Dial() = %v", err)
	}
	defer c.CloseNow()
	msg := strings.Repeat("x", 1000)
	// Sent at once, so that the server may have read some before its
	// handler hijacked the connection.
	for range 3 {
		if err := c.Write(ctx, websocket.MessageBinary, []byte(msg)); err != nil {
			t.Fatalf("Write() = %v", err)
		}
	}
	for range 3 {
		if _, b, err := c.Read(ctx); err != nil || string(b) != msg {
			t.Fatalf("Read() = %d bytes, %v; want the echo", len(b), err)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
	if in, out := testutil.ToFloat64(m.dataIn[pathTerminal]), testutil.ToFloat64(m.dataOut[pathTerminal]); in < 3000 || out < 3000 {
		t.Errorf("bytes in, out = %v, %v; want at least 3000 each way", in, out)
	}
}

// TestCountedHijackReadAhead checks that bytes the server read ahead
// with the request reach a handler that reads the hijacked connection
// itself rather than the reader it was given, and are counted.
func TestCountedHijackReadAhead(t *testing.T) {
	m := &metrics{dataPlaneIO: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_bytes_total", Help: "t"}, []string{"path", "direction"}),
		dataIn: map[string]prometheus.Counter{}, dataOut: map[string]prometheus.Counter{}}
	m.dataIn[pathExec], m.dataOut[pathExec] = m.dataPlaneIO.WithLabelValues(pathExec, "in"), m.dataPlaneIO.WithLabelValues(pathExec, "out")
	got := make(chan string, 1)
	srv := httptest.NewServer(m.counted(pathExec, func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			got <- "hijack: " + err.Error()
			return
		}
		defer c.Close()
		b := make([]byte, 5)
		_, err = io.ReadFull(c, b)
		got <- string(b)
		c.Write([]byte("world"))
	}))
	t.Cleanup(srv.Close)
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatalf("Dial() = %v", err)
	}
	defer c.Close()
	// One write: the server reads "hello" with the request.
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\nhello")); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	if s := <-got; s != "hello" {
		t.Errorf("handler read %q, want hello", s)
	}
	b, _ := io.ReadAll(c)
	if !strings.HasSuffix(string(b), "world") {
		t.Errorf("client read %q, want world", b)
	}
	if in, out := testutil.ToFloat64(m.dataIn[pathExec]), testutil.ToFloat64(m.dataOut[pathExec]); in != 5 || out != 5 {
		t.Errorf("bytes in, out = %v, %v; want 5, 5", in, out)
	}
}
