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
	ctx := t.Context()
	// A sparse file reads fast in the guest and is large.
	agenttest.Output(t, c, "truncate -s 2G /root/sparse")
	term := openTerminal(t, c)
	if _, err := term.echo(ctx, 0); err != nil { // the shell is up
		t.Fatalf("echo = %v", err)
	}
	done := make(chan error, 1)
	var read atomic.Int64
	go func() {
		_, err := c.ReadFile(ctx, "/root/sparse", slowDiscard{&read})
		done <- err
	}()
	testenv.Eventually(t, time.Minute, func() bool { return read.Load() >= 8<<20 }) // under way
	var lat []time.Duration
	for i := range 10 {
		ectx, cancel := context.WithTimeout(ctx, time.Minute)
		d, err := term.echo(ectx, i+1)
		cancel()
		if err != nil {
			t.Fatalf("echo %d during the download = %v", i, err)
		}
		lat = append(lat, d)
	}
	select {
	case err := <-done:
		t.Errorf("the download ended (%v, %d bytes) before the terminal's ten echoes came back: bulk and terminal were not interleaved", err, read.Load())
	default:
	}
	slices.Sort(lat)
	t.Logf("terminal echo during a download: p50 %v, max %v (%d MB downloaded meanwhile)", lat[len(lat)/2], lat[len(lat)-1], read.Load()>>20)
	c.Close() // ends the download
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
