package client_test

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/server"
)

// TestDialHybridVsockFakeMuxer runs the CONNECT exchange against an
// in-process stand-in for Firecracker's vsock muxer (no firecracker binary
// runs here): it checks the command line, answers OK and hands the
// connection to an in-process agent server.
func TestDialHybridVsockFakeMuxer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	defer l.Close()
	srv, err := server.New(server.Config{Version: "vsock-test"})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer srv.Close()
	got := make(chan string, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		line, _ := bufio.NewReader(conn).ReadString('\n') // the agent speaks only after the hello
		got <- line
		conn.Write([]byte("OK 1073741824\n"))
		srv.ServeConn(context.Background(), conn)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := client.DialHybridVsock(ctx, sock, 1024)
	if err != nil {
		t.Fatalf("DialHybridVsock = %v", err)
	}
	defer c.Close()
	if line := <-got; line != "CONNECT 1024\n" {
		t.Errorf("muxer got %q, want %q", line, "CONNECT 1024\n")
	}
	if h, err := c.Health(ctx); err != nil || h.AgentVersion != "vsock-test" {
		t.Errorf("Health = %+v, %v", h, err)
	}
}

func TestDialHybridVsockRefused(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		bufio.NewReader(conn).ReadString('\n')
		conn.Close() // what the muxer does when nothing listens on the port
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := client.DialHybridVsock(ctx, sock, 1024); err == nil {
		t.Errorf("DialHybridVsock(no listener) = nil error")
	}
}
