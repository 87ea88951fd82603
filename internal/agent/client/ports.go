package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// PortOpen reports whether something in the guest accepts TCP connections
// on port of its loopback (127.0.0.1 or ::1). Each connect waits until ctx's
// deadline (at most proto.MaxPortProbeTimeout), or proto.PortProbeTimeout
// when ctx has none.
//
// A port outside 1..65535 is InvalidArgument. An agent that predates the
// op gives FailedPrecondition.
func (c *Client) PortOpen(ctx context.Context, port int) (bool, error) {
	op := proto.OpPortProbe
	if port < 1 || port > 65535 {
		return false, fmt.Errorf("%s: port %d, want 1..65535: %w", op, port, errkind.InvalidArgument)
	}
	args := proto.PortProbe{Port: port}
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return false, fmt.Errorf("%s: %w", op, context.DeadlineExceeded)
		}
		args.TimeoutMS = max(1, min(left, proto.MaxPortProbeTimeout).Milliseconds())
	}
	var st proto.PortState
	err := c.simple(ctx, op, args, &st)
	// The arguments are valid, so invalid_argument can only mean that the
	// agent did not understand them: an agent older than the op answers
	// "unknown op". Its message still tells which it was.
	if errors.Is(err, errkind.InvalidArgument) {
		return false, fmt.Errorf("agent %q does not support port probes (built before them): %v: %w",
			c.agentVersion, err, errkind.FailedPrecondition)
	}
	if err != nil {
		return false, err
	}
	if st.Port != port {
		return false, protocolErr(op, "result for port %d, asked for %d", st.Port, port)
	}
	return st.Open, nil
}
