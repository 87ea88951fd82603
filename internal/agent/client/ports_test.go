package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
)

// listen opens a TCP listener on addr for the test's lifetime and returns
// its port.
func listen(t *testing.T, network, addr string) (int, error) {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		return 0, err
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().(*net.TCPAddr).Port, nil
}

// closedPort returns a port that nothing listens on: one the kernel just
// handed out and the test gave back.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

func TestPortOpen(t *testing.T) {
	_, c := inProcess(t)
	v4, err := listen(t, "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	tests := []struct {
		name string
		port int
		want bool
	}{
		{"open on 127.0.0.1", v4, true},
		{"closed", closedPort(t), false},
	}
	// A listener on ::1 only is open too; a host without IPv6 loopback
	// cannot have one.
	if v6, err := listen(t, "tcp6", "[::1]:0"); err == nil {
		tests = append(tests, struct {
			name string
			port int
			want bool
		}{"open on ::1 only", v6, true})
	} else {
		t.Logf("no IPv6 loopback, the ::1 case does not run: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			got, err := c.PortOpen(ctx, tt.port)
			if err != nil || got != tt.want {
				t.Errorf("PortOpen(%d) = %v, %v; want %v, nil", tt.port, got, err, tt.want)
			}
		})
	}
}

func TestPortOpenBadPort(t *testing.T) {
	_, c := inProcess(t)
	for _, port := range []int{0, -1, 65536} {
		if _, err := c.PortOpen(t.Context(), port); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("PortOpen(%d) = %v, want InvalidArgument", port, err)
		}
	}
}

// TestPortProbeBadArgs sends what PortOpen never would: the agent refuses
// it with an invalid_argument error frame.
func TestPortProbeBadArgs(t *testing.T) {
	_, c := inProcess(t)
	for _, args := range []string{`{"port":0}`, `{"port":-1}`, `{"port":65536}`, `{}`,
		`{"port":80,"timeout_ms":-5}`, `{"port":"80"}`} {
		t.Run(args, func(t *testing.T) {
			st, err := c.OpenRaw()
			if err != nil {
				t.Fatalf("OpenRaw = %v", err)
			}
			defer st.Close()
			req := fmt.Appendf(nil, `{"op":%q,"args":%s}`, proto.OpPortProbe, args)
			if err := proto.WriteFrame(st, proto.TypeRequest, req); err != nil {
				t.Fatalf("write request = %v", err)
			}
			f, err := proto.NewReader(st, 0).Next()
			if err != nil {
				t.Fatalf("reply = %v, want an error frame", err)
			}
			var e proto.Error
			if f.Type != proto.TypeError || proto.DecodeJSON(f, 0, &e) != nil || e.Code != errkind.InvalidArgument.String() {
				t.Errorf("port.probe %s = %s %q, want an invalid_argument error", args, f.Type, f.Payload)
			}
		})
	}
}

// TestPortOpenOldAgent checks that an agent which predates port.probe, and
// answers it as an unknown op, gives a FailedPrecondition error at once.
func TestPortOpenOldAgent(t *testing.T) {
	c := oldAgent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := c.PortOpen(ctx, 8080)
	if !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("PortOpen(8080) on an old agent = %v, want FailedPrecondition", err)
	}
}

// oldAgent returns a client connected to a fake agent that answers every
// call as an agent that knows no op would: invalid_argument, unknown op.
func oldAgent(t *testing.T) *client.Client {
	t.Helper()
	return agenttest.Scripted(t, func(st net.Conn, req proto.Request) {
		proto.WriteJSON(st, proto.TypeError, proto.Error{
			Code: errkind.InvalidArgument.String(), Message: fmt.Sprintf("unknown op %q", req.Op)})
	})
}
