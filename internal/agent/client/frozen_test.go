package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/agent/server"
	"space/internal/errkind"
)

// freezer stops an agent as a SIGSTOP of its process would: while frozen,
// nothing it sends leaves and nothing sent to it is read.
type freezer struct {
	mu     sync.Mutex
	thawed *sync.Cond
	// +checklocks:mu
	frozen bool
}

func newFreezer() *freezer {
	f := &freezer{}
	f.thawed = sync.NewCond(&f.mu)
	return f
}

func (f *freezer) set(frozen bool) {
	f.mu.Lock()
	f.frozen = frozen
	f.mu.Unlock()
	f.thawed.Broadcast()
}

func (f *freezer) wait() {
	f.mu.Lock()
	for f.frozen {
		f.thawed.Wait()
	}
	f.mu.Unlock()
}

// conn wraps the agent's end of a connection.
func (f *freezer) conn(c io.ReadWriteCloser) io.ReadWriteCloser { return frozenConn{c, f} }

type frozenConn struct {
	io.ReadWriteCloser
	f *freezer
}

func (c frozenConn) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	c.f.wait() // what was read is handled only once thawed
	return n, err
}

func (c frozenConn) Write(p []byte) (int, error) {
	c.f.wait()
	return c.ReadWriteCloser.Write(p)
}

// frozenAgent starts an in-process agent that the test can freeze.
func frozenAgent(t *testing.T) (*freezer, *agent, *client.Client) {
	t.Helper()
	f := newFreezer()
	t.Cleanup(func() { f.set(false) }) // lets the agent end
	srv, err := server.New(server.Config{Version: "test"})
	if err != nil {
		t.Fatalf("setup: server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		srv.Close()
	})
	a := &agent{t: t, srv: srv, ctx: ctx, guestConn: f.conn}
	c, err := a.connect(t.Context())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return f, a, c
}

// TestFrozenAgentCallDeadline: a call with a deadline on a frozen agent
// ends at its deadline, not when the agent (never) closes its side.
func TestFrozenAgentCallDeadline(t *testing.T) {
	f, _, c := frozenAgent(t)
	if _, err := c.Health(t.Context()); err != nil {
		t.Fatalf("Health before freezing = %v", err)
	}
	f.set(true)
	for _, call := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"Health", func(ctx context.Context) error { _, err := c.Health(ctx); return err }},
		{"Stat", func(ctx context.Context) error { _, err := c.Stat(ctx, "/"); return err }},
		{"List", func(ctx context.Context) error { _, err := c.List(ctx, "/", 0); return err }},
		{"Processes", func(ctx context.Context) error { _, err := c.Processes(ctx); return err }},
	} {
		t.Run(call.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			if err := call.do(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s on a frozen agent = %v, want the deadline exceeded", call.name, err)
			}
		})
	}
	f.set(false)
	if _, err := c.Health(t.Context()); err != nil {
		t.Errorf("Health after thawing = %v, want an answer", err)
	}
}

// TestFrozenAgentClosedWithCause: once the host declares a frozen agent
// unresponsive (CloseWithCause), an exec waiting for output and later
// calls fail at once with that cause, not ErrClosed, and never hang.
func TestFrozenAgentClosedWithCause(t *testing.T) {
	f, a, c := frozenAgent(t)
	p, err := c.Start(t.Context(), proto.ExecRequest{Argv: []string{"sleep", "60"}}, client.IO{})
	if err != nil {
		t.Fatalf("Start(sleep 60) = %v", err)
	}
	f.set(true)
	cause := fmt.Errorf("no heartbeat answer for 10s: %w", client.ErrUnresponsive)
	c.CloseWithCause(cause)
	if _, err := p.Wait(); !errors.Is(err, client.ErrUnresponsive) || !errors.Is(err, errkind.Unavailable) {
		t.Errorf("Wait of an exec on an agent declared unresponsive = %v, want ErrUnresponsive (Unavailable)", err)
	}
	if _, err := c.Stat(t.Context(), "/"); !errors.Is(err, client.ErrUnresponsive) {
		t.Errorf("Stat after the declaration = %v, want ErrUnresponsive", err)
	}
	// The agent continued: a new connection serves again.
	f.set(false)
	c2, err := a.connect(t.Context())
	if err != nil {
		t.Fatalf("connect after thawing = %v", err)
	}
	if _, err := c2.Health(t.Context()); err != nil {
		t.Errorf("Health on the new connection = %v", err)
	}
}
