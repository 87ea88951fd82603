package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/server"
	"space/internal/errkind"
)

// agent is an agent server in the test process; connect gives it a new
// host connection over a socketpair, as a virtio-serial port would.
type agent struct {
	t    *testing.T
	srv  *server.Server
	ctx  context.Context
	opts []client.Option
	// guestConn, if not nil, wraps the guest's end of each connection
	// (frozen_test.go stops an agent with it).
	guestConn func(io.ReadWriteCloser) io.ReadWriteCloser
}

// inProcess starts an agent server in the test process and connects a
// client to it. The server is closed when t ends.
func inProcess(t *testing.T) (*agent, *client.Client) {
	t.Helper()
	return inProcessWith(t, server.Config{Version: "test"})
}

// inProcessWith is inProcess with the server's config, and the client's
// dial options.
func inProcessWith(t *testing.T, cfg server.Config, opts ...client.Option) (*agent, *client.Client) {
	t.Helper()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("setup: server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		srv.Close()
	})
	a := &agent{t: t, srv: srv, ctx: ctx, opts: opts}
	c, err := a.connect(t.Context())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return a, c
}

// connect opens one more host connection to the agent. The client and the
// server's side are closed when the test ends.
func (a *agent) connect(ctx context.Context) (*client.Client, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// Non-blocking fds make the files pollable, so Close interrupts reads.
	unix.SetNonblock(fds[0], true)
	unix.SetNonblock(fds[1], true)
	guest, host := os.NewFile(uintptr(fds[0]), "guest"), os.NewFile(uintptr(fds[1]), "host")
	done := make(chan struct{})
	var gc io.ReadWriteCloser = guest
	if a.guestConn != nil {
		gc = a.guestConn(guest)
	}
	go func() {
		defer close(done)
		a.srv.ServeConn(a.ctx, gc)
	}()
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	c, err := client.Dial(hctx, host, a.opts...)
	if err != nil {
		guest.Close()
		<-done
		return nil, fmt.Errorf("dial: %w", err)
	}
	a.t.Cleanup(func() {
		c.Close()
		<-done
	})
	return c, nil
}

func TestAgentInProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Log("not root: exec as another uid will fail")
	}
	a, c := inProcess(t)
	if got := c.AgentVersion(); got != "test" {
		t.Errorf("AgentVersion() = %q, want %q", got, "test")
	}
	agenttest.Run(t, c, agenttest.Options{
		Scratch: t.TempDir(),
		Reconnect: func(ctx context.Context, old *client.Client) (*client.Client, error) {
			old.Close()
			return a.connect(ctx)
		},
	})
}

// TestReclaimMemoryRefused: an agent without access to a guest kernel
// (this one runs on the host) and an agent older than the op both refuse
// a reclaim with a failed precondition, and nothing is dropped.
func TestReclaimMemoryRefused(t *testing.T) {
	_, c := inProcess(t)
	if _, err := c.ReclaimMemory(t.Context()); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("ReclaimMemory on an agent without system access = %v, want FailedPrecondition", err)
	}
	old := oldAgent(t)
	_, err := old.ReclaimMemory(t.Context())
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "built before it") {
		t.Errorf("ReclaimMemory on an old agent = %v, want FailedPrecondition saying it predates the op", err)
	}
}
