package guesttest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/testenv"
)

// terminal is a shell on a guest PTY whose output the test can wait on.
type terminal struct {
	p  *client.Process
	mu sync.Mutex
	// +checklocks:mu
	out    bytes.Buffer
	change chan struct{} // a token whenever output arrived
}

func openTerminal(t testing.TB, c *client.Client) *terminal {
	t.Helper()
	term := &terminal{change: make(chan struct{}, 1)}
	p, err := c.Start(t.Context(), proto.ExecRequest{Argv: []string{"/bin/sh"}, PTY: &proto.WinSize{Rows: 24, Cols: 80}}, client.IO{Stdout: term})
	if err != nil {
		t.Fatalf("setup: pty: %v", err)
	}
	t.Cleanup(func() { p.Signal(9); p.Wait() })
	term.p = p
	return term
}

func (term *terminal) Write(b []byte) (int, error) {
	term.mu.Lock()
	term.out.Write(b)
	term.mu.Unlock()
	select {
	case term.change <- struct{}{}:
	default:
	}
	return len(b), nil
}

// echo types a line that prints a fresh marker and returns how long the
// marker took to come back.
func (term *terminal) echo(ctx context.Context, n int) (time.Duration, error) {
	marker := fmt.Sprintf("mark-%d-%d", n, time.Now().UnixNano())
	t0 := time.Now()
	// The shell echoes the typed line too: wait for the marker printf
	// makes from two halves, which only the output contains.
	half := len(marker) / 2
	if err := term.p.WriteStdin([]byte(fmt.Sprintf("printf '%%s%%s\\n' %s %s\n", marker[:half], marker[half:]))); err != nil {
		return 0, err
	}
	for {
		term.mu.Lock()
		found := strings.Contains(term.out.String(), marker+"\r\n")
		term.mu.Unlock()
		if found {
			return time.Since(t0), nil
		}
		select {
		case <-term.change:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// TestPTYDuringBulkTransfer: a terminal in a sandbox answers while a large
// download from the same sandbox is under way. The bulk bytes move through
// the ring, the terminal's through the connection, so its echoes come
// back before the download ends. The latencies are logged; their goal is
// in BenchmarkTransfer.
func TestPTYDuringBulkTransfer(t *testing.T) {
	vm := Boot(t, Options{VCPUs: 1, MemoryMiB: 512})
	c := vm.Client
	if !c.Ring() {
		t.Fatalf("the agent connection has no ring")
	}
	term := openTerminal(t, c)
	if _, err := term.echo(t.Context(), 0); err != nil { // the shell is up
		t.Fatalf("echo = %v", err)
	}
	lat, read, ended := echoesDuringDownload(t, c, term, 1)
	if ended {
		t.Errorf("the download ended (%d bytes) before the terminal's ten echoes came back: bulk and terminal were not interleaved", read)
	}
	t.Logf("terminal echo during a download: p50 %v, max %v (%d MB downloaded meanwhile)", lat[len(lat)/2], lat[len(lat)-1], read>>20)
}

// echoesDuringDownload times ten echoes of term (markers from first on),
// sorted, while a large sparse file downloads from the same guest at most
// about 100 MB/s; it returns them, how much was downloaded, and whether
// the download ended before the last echo.
func echoesDuringDownload(tb testing.TB, c *client.Client, term *terminal, first int) (lat []time.Duration, read int64, ended bool) {
	tb.Helper()
	// A sparse file reads fast in the guest and is large.
	agenttest.Output(tb, c, "truncate -s 2G /root/sparse")
	defer agenttest.Output(tb, c, "rm -f /root/sparse")
	ctx, cancel := context.WithCancel(tb.Context())
	done := make(chan struct{})
	var n atomic.Int64
	go func() {
		defer close(done)
		c.ReadFile(ctx, "/root/sparse", slowDiscard{&n})
	}()
	defer func() { cancel(); <-done }()
	testenv.Eventually(tb, time.Minute, func() bool { return n.Load() >= 8<<20 }) // under way
	for i := range 10 {
		ectx, cancelEcho := context.WithTimeout(ctx, time.Minute)
		d, err := term.echo(ectx, first+i)
		cancelEcho()
		if err != nil {
			tb.Fatalf("echo %d during the download = %v", i, err)
		}
		lat = append(lat, d)
	}
	select {
	case <-done:
		ended = true
	default:
	}
	slices.Sort(lat)
	return lat, n.Load(), ended
}

// slowDiscard counts what it is given, at most about 100 MB/s, so the
// download outlasts the echoes.
type slowDiscard struct{ n *atomic.Int64 }

func (s slowDiscard) Write(p []byte) (int, error) {
	time.Sleep(time.Duration(len(p)) * 10 * time.Nanosecond) // a slow consumer, not a synchronization
	s.n.Add(int64(len(p)))
	return len(p), nil
}

var _ io.Writer = slowDiscard{}
