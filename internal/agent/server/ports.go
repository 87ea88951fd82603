package server

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// probePort reports whether something accepts TCP connections on a.Port of
// the guest's loopback. It dials 127.0.0.1 and ::1 at once; either
// connecting is open. A refused, unreachable (no IPv6) or timed-out connect
// is closed, not an error.
func probePort(ctx context.Context, a proto.PortProbe) (proto.PortState, error) {
	if a.Port < 1 || a.Port > 65535 {
		return proto.PortState{}, fmt.Errorf("port.probe: port %d, want 1..65535: %w", a.Port, errkind.InvalidArgument)
	}
	if a.TimeoutMS < 0 {
		return proto.PortState{}, fmt.Errorf("port.probe: timeout_ms %d is negative: %w", a.TimeoutMS, errkind.InvalidArgument)
	}
	timeout := proto.PortProbeTimeout
	if a.TimeoutMS > 0 {
		timeout = time.Duration(min(a.TimeoutMS, proto.MaxPortProbeTimeout.Milliseconds())) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hosts := []string{"127.0.0.1", "::1"}
	open := make(chan bool, len(hosts))
	for _, h := range hosts {
		go func() { open <- dialOK(ctx, net.JoinHostPort(h, strconv.Itoa(a.Port))) }()
	}
	st := proto.PortState{Port: a.Port}
	for range hosts {
		if <-open && !st.Open {
			st.Open = true
			cancel() // the other dial need not wait for its answer
		}
	}
	return st, nil
}

// dialOK reports whether a TCP connect to addr succeeds before ctx ends.
func dialOK(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
