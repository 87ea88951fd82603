package guesttest

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/guestvm"
	"space/internal/testenv"
)

// healthLatencies times n health calls of c, sorted.
func healthLatencies(t *testing.T, c *client.Client, n int) []time.Duration {
	t.Helper()
	var lat []time.Duration
	for range n {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		start := time.Now()
		_, err := c.Health(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Health = %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	return lat
}

// TestHeartbeatOnRealGuest measures what the worker's heartbeat (a
// health call on a new stream) costs on a real guest, idle and behind a
// bulk download on the same session, for the choice of its timeout
// (worker: 15 s by default). Then it stops the VMM with SIGSTOP, as a
// frozen agent looks to the host: a health call ends at its deadline,
// the host closes the client with its cause, and once the VMM is
// continued a new connection (what the worker's heartbeat makes) serves.
func TestHeartbeatOnRealGuest(t *testing.T) {
	vm := Boot(t, Options{VCPUs: 1, MemoryMiB: 512})
	c := vm.Client
	idle := healthLatencies(t, c, 20)
	t.Logf("health call, idle guest: p50 %v, max %v", idle[len(idle)/2], idle[len(idle)-1])

	agenttest.Output(t, c, "truncate -s 4G /root/sparse")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var n atomic.Int64
	go func() {
		defer close(done)
		c.ReadFile(ctx, "/root/sparse", atomicCount{&n})
	}()
	testenv.Eventually(t, time.Minute, func() bool { return n.Load() >= 8<<20 })
	busy := healthLatencies(t, c, 20)
	read := n.Load()
	cancel()
	<-done
	t.Logf("health call during a download: p50 %v, max %v (%d MB downloaded meanwhile)", busy[len(busy)/2], busy[len(busy)-1], read>>20)
	agenttest.Output(t, c, "rm -f /root/sparse")

	pid := vm.VMM.Handle().PID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP vmm: %v", err)
	}
	continued := false
	defer func() {
		if !continued {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	hctx, hcancel := context.WithTimeout(t.Context(), time.Second)
	_, err := c.Health(hctx)
	hcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Health on a stopped guest = %v, want its deadline exceeded", err)
	}
	c.CloseWithCause(&client.UnresponsiveError{Silent: time.Second})
	if _, err := c.Health(t.Context()); !errors.Is(err, client.ErrUnresponsive) {
		t.Errorf("Health after CloseWithCause = %v, want ErrUnresponsive", err)
	}
	syscall.Kill(pid, syscall.SIGCONT)
	continued = true
	cctx, ccancel := context.WithTimeout(t.Context(), time.Minute)
	defer ccancel()
	start := time.Now()
	c2, err := guestvm.Connect(cctx, vm.VMM)
	if err != nil {
		t.Fatalf("Connect after SIGCONT = %v", err)
	}
	defer c2.Close()
	t.Logf("new connection after the guest was continued: %v", time.Since(start))
	if got := agenttest.Output(t, c2, "echo back"); got != "back\n" {
		t.Errorf("exec on the new connection = %q, want back", got)
	}
	vm.Client = c2 // closed with the VM
}

// atomicCount counts what it is given, for another goroutine to read.
type atomicCount struct{ n *atomic.Int64 }

func (w atomicCount) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }
