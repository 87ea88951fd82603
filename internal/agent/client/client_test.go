package client_test

import (
	"context"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/server"
)

// inProcess starts an agent server in the test process, connected to a
// client over a socketpair, as a virtio-serial port would connect them.
func inProcess(t *testing.T) *client.Client {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("setup: socketpair: %v", err)
	}
	// Non-blocking fds make the files pollable, so Close interrupts reads.
	unix.SetNonblock(fds[0], true)
	unix.SetNonblock(fds[1], true)
	guest, host := os.NewFile(uintptr(fds[0]), "guest"), os.NewFile(uintptr(fds[1]), "host")
	srv, err := server.New(server.Config{Version: "test"})
	if err != nil {
		t.Fatalf("setup: server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeConn(ctx, guest)
	}()
	hctx, hcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer hcancel()
	c, err := client.Dial(hctx, host)
	if err != nil {
		t.Fatalf("setup: Dial: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		srv.Close()
		<-done
	})
	return c
}

func TestAgentInProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Log("not root: exec as another uid will fail")
	}
	c := inProcess(t)
	if got := c.AgentVersion(); got != "test" {
		t.Errorf("AgentVersion() = %q, want %q", got, "test")
	}
	agenttest.Run(t, c, agenttest.Options{Scratch: t.TempDir()})
}
