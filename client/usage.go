package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"space/api"
)

// Metrics returns sandbox id's usage history from start to end, oldest
// first; a zero time leaves that side open. A sandbox without a VM
// (suspended, stopped) has no samples.
func (c *Client) Metrics(ctx context.Context, id string, start, end time.Time) (api.SandboxMetrics, error) {
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", start.UTC().Format(time.RFC3339Nano))
	}
	if !end.IsZero() {
		q.Set("end", end.UTC().Format(time.RFC3339Nano))
	}
	var m api.SandboxMetrics
	err := c.call(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/metrics"), query: q}, &m)
	return m, err
}

// TeamMetrics returns the caller's team's running sandboxes and starts
// over time, from start to end every step; zero values take the
// server's defaults (the last hour, at most 1000 points).
func (c *Client) TeamMetrics(ctx context.Context, start, end time.Time, step time.Duration) (api.TeamMetrics, error) {
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", start.UTC().Format(time.RFC3339Nano))
	}
	if !end.IsZero() {
		q.Set("end", end.UTC().Format(time.RFC3339Nano))
	}
	if step > 0 {
		q.Set("step", step.String())
	}
	var m api.TeamMetrics
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/metrics", query: q}, &m)
	return m, err
}
