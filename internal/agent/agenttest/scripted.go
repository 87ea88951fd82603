package agenttest

import (
	"bufio"
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"space/internal/agent/client"
	"space/internal/agent/proto"
)

// Serve returns a client connected to serve, which runs on the other end
// of a socketpair as a guest's agent would; serve's ctx ends and its
// conn is closed when the test ends.
func Serve(t testing.TB, serve func(ctx context.Context, conn *os.File)) *client.Client {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("setup: socketpair: %v", err)
	}
	unix.SetNonblock(fds[0], true)
	unix.SetNonblock(fds[1], true)
	guest, host := os.NewFile(uintptr(fds[0]), "guest"), os.NewFile(uintptr(fds[1]), "host")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer guest.Close()
		serve(ctx, guest)
	}()
	dctx, dcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer dcancel()
	c, err := client.Dial(dctx, host)
	if err != nil {
		cancel()
		guest.Close()
		<-done
		t.Fatalf("setup: dial: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-done
	})
	return c
}

// Scripted returns a client connected to a fake agent (an agent of
// another version, say) that speaks the handshake, hands the first frame
// of every call to answer, then closes the call's stream.
func Scripted(t testing.TB, answer func(st net.Conn, req proto.Request)) *client.Client {
	t.Helper()
	return Serve(t, func(_ context.Context, conn *os.File) {
		br := bufio.NewReader(conn)
		hello, err := proto.ReadHello(br, 0)
		if err != nil {
			return
		}
		if _, err := conn.Write(proto.Ready{Version: proto.Version, Nonce: hello.Nonce, AgentVersion: "old"}.Line()); err != nil {
			return
		}
		if next, err := proto.ReadStart(br, hello); err != nil || next != nil {
			return
		}
		sess, err := yamux.Server(proto.Buffered(br, conn), proto.YamuxConfig())
		if err != nil {
			return
		}
		defer sess.Close()
		for {
			st, err := sess.Accept()
			if err != nil {
				return
			}
			var req proto.Request
			if f, err := proto.NewReader(st, 0).Next(); err == nil && proto.DecodeJSON(f, 0, &req) == nil {
				answer(st, req)
			}
			st.Close()
		}
	})
}
