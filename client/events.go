package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"space/api"
)

// EventOptions select lifecycle events.
type EventOptions struct {
	Sandbox string   // one sandbox's; "" = every sandbox of the team
	Types   []string // only these types; nil = any
	After   string   // a cursor: only events after it; "" = from the oldest kept
	Limit   int      // the most to return; 0 = the server's default (100)
	Team    string   // another team's (admin keys); "" = the key's team
	All     bool     // every team's (admin keys)
}

func (o EventOptions) query() url.Values {
	q := url.Values{}
	if o.Sandbox != "" {
		q.Set("sandbox", o.Sandbox)
	}
	if len(o.Types) > 0 {
		q.Set("type", strings.Join(o.Types, ","))
	}
	if o.After != "" {
		q.Set("after", o.After)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Team != "" {
		q.Set("team", o.Team)
	}
	if o.All {
		q.Set("all", "true")
	}
	return q
}

// Events lists lifecycle events, oldest first. Pass the reply's Next as
// After to get the ones that follow.
func (c *Client) Events(ctx context.Context, opts EventOptions) (api.LifecycleEventList, error) {
	var l api.LifecycleEventList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/events", query: opts.query()}, &l)
	return l, err
}

// FollowEvents streams the lifecycle events opts selects (Limit aside),
// from opts.After on and then live, calling fn with each, until ctx ends
// (it then returns nil), fn returns an error (returned) or the stream
// breaks (an error; resume from the last event's Cursor).
func (c *Client) FollowEvents(ctx context.Context, opts EventOptions, fn func(api.LifecycleEvent) error) error {
	q := opts.query()
	q.Del("limit")
	q.Set("follow", "true")
	r := request{method: http.MethodGet, path: "/v1/events", query: q, accept: "text/event-stream"}
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var data []byte
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) == 0 {
				continue
			}
			var e api.LifecycleEvent
			if err := json.Unmarshal(data, &e); err != nil {
				return fmt.Errorf("follow events: decode %q: %w", data, err)
			}
			data = data[:0]
			if err := fn(e); err != nil {
				return err
			}
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")...)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("follow events: %w", err)
	}
	return fmt.Errorf("follow events: the server ended the stream")
}

// SandboxEvents lists sandbox id's lifecycle events, as Events does
// (opts.Sandbox, Team and All aside). A sandbox that is gone is listed
// while its events are kept.
func (c *Client) SandboxEvents(ctx context.Context, id string, opts EventOptions) (api.LifecycleEventList, error) {
	opts.Sandbox, opts.Team, opts.All = "", "", false
	var l api.LifecycleEventList
	err := c.call(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/events"), query: opts.query()}, &l)
	return l, err
}
