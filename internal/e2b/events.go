package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"space/api"
	"space/client"
)

// E2B's lifecycle events API (GET /events/sandboxes and
// /events/sandboxes/{id}), served from SPACE's events: each of SPACE's
// types that has an E2B counterpart is renamed (a SPACE suspend is
// E2B's pause, a delete its kill); the others are left out. E2B pages
// by offset, newest first unless orderAsc; SPACE by cursor, oldest first:
// the facade reads the team's (or sandbox's) events whole, up to
// maxE2BEvents of them, and pages that.

// e2bEventTypes maps E2B's event types to the SPACE types they cover.
var e2bEventTypes = map[string][]string{
	"sandbox.lifecycle.created":      {"created"},
	"sandbox.lifecycle.paused":       {"paused", "suspended"},
	"sandbox.lifecycle.resumed":      {"resumed", "resuming"},
	"sandbox.lifecycle.killed":       {"deleted"},
	"sandbox.lifecycle.snapshotted":  {"snapshotted"},
	"sandbox.lifecycle.checkpointed": {"checkpointed"},
	"sandbox.lifecycle.updated":      nil, // SPACE records no such event
}

// e2bEventOf returns the E2B type of SPACE type t, or "".
func e2bEventOf(t string) string {
	for e, ts := range e2bEventTypes {
		if slices.Contains(ts, t) {
			return e
		}
	}
	return ""
}

// maxE2BEvents bounds the events one request reads.
const maxE2BEvents = 10000

// sandboxEvent is an event as E2B's API sends it.
type sandboxEvent struct {
	Version            string          `json:"version"`
	ID                 string          `json:"id"`
	Type               string          `json:"type"`
	EventData          json.RawMessage `json:"eventData"`
	SandboxBuildID     string          `json:"sandboxBuildId"`
	SandboxExecutionID string          `json:"sandboxExecutionId"`
	SandboxID          string          `json:"sandboxId"`
	SandboxTeamID      string          `json:"sandboxTeamId"`
	SandboxTemplateID  string          `json:"sandboxTemplateId"`
	Timestamp          time.Time       `json:"timestamp"`
}

func (s *Server) teamEvents(w http.ResponseWriter, r *http.Request, c *client.Client) {
	s.serveEvents(w, r, func(ctx context.Context, o client.EventOptions) (api.LifecycleEventList, error) {
		return c.Events(ctx, o)
	})
}

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request, c *client.Client) {
	id, ok := pathSandbox(w, r)
	if !ok {
		return
	}
	s.serveEvents(w, r, func(ctx context.Context, o client.EventOptions) (api.LifecycleEventList, error) {
		l, err := c.SandboxEvents(ctx, id, o)
		return l, sandboxErr(err, r)
	})
}

// serveEvents answers E2B's query (offset, limit, orderAsc, types) from
// the events list reads.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request, list func(context.Context, client.EventOptions) (api.LifecycleEventList, error)) {
	q := r.URL.Query()
	offset, limit, asc := 0, 10, false
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeAPIError(w, badRequest("offset %q: want 0 or more", v))
			return
		}
		offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeAPIError(w, badRequest("limit %q: want 1..100", v))
			return
		}
		limit = n
	}
	if v := q.Get("orderAsc"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeAPIError(w, badRequest("orderAsc %q: want true or false", v))
			return
		}
		asc = b
	}
	opts := client.EventOptions{Limit: 1000}
	if types := q["types"]; len(types) > 0 {
		for _, t := range types {
			ts, ok := e2bEventTypes[t]
			if !ok {
				writeAPIError(w, badRequest("unknown event type %q", t))
				return
			}
			opts.Types = append(opts.Types, ts...)
		}
		if len(opts.Types) == 0 { // only types SPACE never records
			writeJSON(w, http.StatusOK, []sandboxEvent{})
			return
		}
	}
	var all []sandboxEvent
	for len(all) < maxE2BEvents {
		l, err := list(r.Context(), opts)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		for _, e := range l.Events {
			if t := e2bEventOf(e.Type); t != "" {
				all = append(all, sandboxEvent{
					Version: "v1", ID: e.ID, Type: t, EventData: e.Data,
					SandboxID: e2bID(e.SandboxID), SandboxTeamID: e.Team, Timestamp: e.Time,
				})
			}
		}
		if len(l.Events) < opts.Limit {
			break
		}
		opts.After = l.Next
	}
	if !asc {
		slices.Reverse(all)
	}
	out := []sandboxEvent{}
	if offset < len(all) {
		out = all[offset:min(len(all), offset+limit)]
	}
	writeJSON(w, http.StatusOK, out)
}
