package client

import (
	"context"
	"net/http"

	"space/api"
)

// Checkpoints returns sandbox id's checkpoints, newest first, and the
// checkpoint policy in force (the zero policy when it takes none).
func (c *Client) Checkpoints(ctx context.Context, id string) (api.CheckpointList, error) {
	var l api.CheckpointList
	err := c.call(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/checkpoints")}, &l)
	return l, err
}

// CreateCheckpoint takes a checkpoint of sandbox id now (trigger
// "manual"), whatever its policy. A sandbox that is not running or
// paused is a conflict error (IsConflict).
func (c *Client) CreateCheckpoint(ctx context.Context, id string) (api.Checkpoint, error) {
	var cp api.Checkpoint
	err := c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/checkpoints"),
		want: []int{http.StatusCreated}}, &cp)
	return cp, err
}

// SetCheckpointPolicy replaces sandbox id's checkpoint policy and returns
// the sandbox, its Checkpoints the policy as the server filled it in (nil
// when it takes none: the zero policy turns checkpoints off). A bad field
// is invalid (IsInvalid, Field "policy.every" and so on).
func (c *Client) SetCheckpointPolicy(ctx context.Context, id string, p api.CheckpointPolicy) (api.Sandbox, error) {
	body, err := jsonBody(p)
	if err != nil {
		return api.Sandbox{}, err
	}
	var sb api.Sandbox
	err = c.call(ctx, request{method: http.MethodPut, path: sandboxPath(id, "/checkpoints/policy"), body: body}, &sb)
	return sb, err
}

// RestoreCheckpoint rolls sandbox id back to a checkpoint (its ID, from
// Checkpoints) in place; RestoreSandbox does the same from a snapshot.
func (c *Client) RestoreCheckpoint(ctx context.Context, id, checkpoint string) (api.Sandbox, error) {
	body, err := jsonBody(api.RestoreSandbox{Checkpoint: checkpoint})
	if err != nil {
		return api.Sandbox{}, err
	}
	var sb api.Sandbox
	err = c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/restore"), body: body}, &sb)
	return sb, err
}
