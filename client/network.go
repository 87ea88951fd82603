package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"space/api"
)

// SetNetwork replaces sandbox id's egress policy and returns the sandbox.
// New DNS queries and connections follow it; open connections are left
// alone. A sandbox created without a network, or neither running nor
// paused, is a conflict error (IsConflict); a bad rule is invalid
// (IsInvalid, Field "allow").
func (c *Client) SetNetwork(ctx context.Context, id string, n api.Network) (api.Sandbox, error) {
	body, err := jsonBody(n)
	if err != nil {
		return api.Sandbox{}, err
	}
	var sb api.Sandbox
	err = c.call(ctx, request{method: http.MethodPut, path: sandboxPath(id, "/network"), body: body}, &sb)
	return sb, err
}

// EgressLog returns sandbox id's egress log, oldest first: the decisions
// its egress gateway has made so far. A sandbox without a network has
// none; one that is not running is a conflict error (IsConflict).
func (c *Client) EgressLog(ctx context.Context, id string) ([]api.EgressEvent, error) {
	r := request{method: http.MethodGet, path: sandboxPath(id, "/egress"), accept: "application/x-ndjson"}
	resp, err := c.do(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var evs []api.EgressEvent
	dec := json.NewDecoder(resp.Body)
	for {
		var ev api.EgressEvent
		err := dec.Decode(&ev)
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			return nil, fmt.Errorf("%s %s: decode event %d: %w", r.method, r.path, len(evs)+1, err)
		}
		evs = append(evs, ev)
	}
}
