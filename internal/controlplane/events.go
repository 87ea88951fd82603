package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
)

// Lifecycle events. The store records a sandbox's changes of state
// itself, in the transaction of the change (store.Events); the control
// plane appends what is not a change of state (event), lists them and
// streams them to followers (handleEvents).

// DefaultEventRetention is how long events are kept unless
// Config.EventRetention says otherwise.
const DefaultEventRetention = 30 * 24 * time.Hour

// Follow stream timing.
const (
	followPoll      = 250 * time.Millisecond // how often a follower asks the store (other replicas' events)
	followKeepalive = 15 * time.Second       // a comment line this often keeps proxies from closing an idle stream
)

// bell tells followers on this replica that an event may have been
// recorded, so they ask the store at once rather than at their next
// poll. Ringing closes the current channel and makes a new one.
type bell struct {
	mu sync.Mutex
	// +checklocks:mu
	ch chan struct{}
}

func newBell() *bell { return &bell{ch: make(chan struct{})} }

// wait returns a channel closed at the next ring.
func (b *bell) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *bell) ring() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// ringing is the store with every write that may record an event
// ringing the bell once it succeeds.
type ringing struct {
	store.Store
	b *bell
}

// rang rings b if err is nil, and returns err.
func (b *bell) rang(err error) error {
	if err == nil {
		b.ring()
	}
	return err
}

func (r ringing) CreateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	v, err := r.Store.CreateSandbox(ctx, sb)
	return v, r.b.rang(err)
}

func (r ringing) CreateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	v, err := r.Store.CreateSandboxWithinQuota(ctx, sb, q)
	return v, r.b.rang(err)
}

func (r ringing) UpdateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	v, err := r.Store.UpdateSandbox(ctx, sb)
	return v, r.b.rang(err)
}

func (r ringing) UpdateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	v, err := r.Store.UpdateSandboxWithinQuota(ctx, sb, q)
	return v, r.b.rang(err)
}

func (r ringing) DeleteSandbox(ctx context.Context, teamID, id string) error {
	return r.b.rang(r.Store.DeleteSandbox(ctx, teamID, id))
}

func (r ringing) AppendEvent(ctx context.Context, e store.Event) (store.Event, error) {
	v, err := r.Store.AppendEvent(ctx, e)
	return v, r.b.rang(err)
}

func (r ringing) Fenced(l store.Lease) store.FencedWrites {
	return ringingFenced{r.Store.Fenced(l), r.b}
}

type ringingFenced struct {
	store.FencedWrites
	b *bell
}

func (r ringingFenced) CreateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	v, err := r.FencedWrites.CreateSandbox(ctx, sb)
	return v, r.b.rang(err)
}

func (r ringingFenced) CreateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	v, err := r.FencedWrites.CreateSandboxWithinQuota(ctx, sb, q)
	return v, r.b.rang(err)
}

func (r ringingFenced) UpdateSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	v, err := r.FencedWrites.UpdateSandbox(ctx, sb)
	return v, r.b.rang(err)
}

func (r ringingFenced) UpdateSandboxWithinQuota(ctx context.Context, sb store.Sandbox, q store.Quota) (store.Sandbox, error) {
	v, err := r.FencedWrites.UpdateSandboxWithinQuota(ctx, sb, q)
	return v, r.b.rang(err)
}

func (r ringingFenced) DeleteSandbox(ctx context.Context, teamID, id string) error {
	return r.b.rang(r.FencedWrites.DeleteSandbox(ctx, teamID, id))
}

// event records an event of type typ about sb that is not a change of
// state (a checkpoint completed, a fork made), with ctx's origin and
// reason and data (nil for none). What it records happened already, so a
// failure is logged, not returned; a canceled ctx does not stop it.
func (s *Server) event(ctx context.Context, typ string, sb store.Sandbox, data map[string]string) {
	e := store.NewEvent(ctx, typ, sb)
	if len(data) > 0 {
		e.Data, _ = json.Marshal(data) // strings marshal
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := s.cfg.Store.AppendEvent(ctx, e); err != nil {
		s.log.WarnContext(ctx, "record event", "type", typ, "sandbox_id", sb.ID, "err", err)
	}
}

// pruneEvents removes events past their retention.
func (s *Server) pruneEvents(ctx context.Context) {
	if s.cfg.EventRetention < 0 {
		return
	}
	n, err := s.cfg.Store.DeleteEventsBefore(ctx, s.now().Add(-s.cfg.EventRetention))
	if err != nil {
		s.log.Warn("prune events", "err", err)
	} else if n > 0 {
		s.log.Info("pruned events", "events", n)
	}
}

// Query bounds of the events routes.
const (
	defaultEventLimit = 100
	maxEventLimit     = store.MaxEventLimit
)

// eventQuery reads the query of an events route: which team (the
// caller's; an admin may name another with team= or ask for all with
// all=true), sandbox, types, cursor (after=, or a reconnecting
// EventSource's Last-Event-ID header) and limit.
func eventQuery(r *http.Request) (store.EventQuery, error) {
	c := callerOf(r)
	v := r.URL.Query()
	q := store.EventQuery{TeamID: c.team, Limit: defaultEventLimit}
	if team := v.Get("team"); team != "" && team != c.team {
		if !c.admin {
			return q, fmt.Errorf("events of another team need an admin key: %w", errkind.PermissionDenied)
		}
		if !store.ValidID(team) {
			return q, httpapi.Invalid("team", "%.64q: 1-128 characters of [A-Za-z0-9_.-]", team)
		}
		q.TeamID = team
	}
	if all := v.Get("all"); all != "" {
		b, err := strconv.ParseBool(all)
		if err != nil {
			return q, httpapi.Invalid("all", "%.64q: want true or false", all)
		}
		if b {
			if !c.admin {
				return q, fmt.Errorf("events of every team need an admin key: %w", errkind.PermissionDenied)
			}
			if v.Get("team") != "" {
				return q, httpapi.Invalid("all", "give team or all=true, not both")
			}
			q.TeamID = ""
		}
	}
	if id := v.Get("sandbox"); id != "" {
		if !store.ValidSandboxID(id) {
			return q, httpapi.Invalid("sandbox", "%.64q is not a sandbox id", id)
		}
		q.SandboxID = id
	}
	for _, list := range v["type"] {
		for t := range strings.SplitSeq(list, ",") {
			if t = strings.TrimSpace(t); t == "" {
				continue
			}
			if !sandbox.ValidEventType(t) {
				return q, httpapi.Invalid("type", "unknown event type %.64q (known: %s)", t, strings.Join(sandbox.EventTypes, ", "))
			}
			q.Types = append(q.Types, t)
		}
	}
	after, field := v.Get("after"), "after"
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		// A reconnecting EventSource sends the URL it first used (with
		// its after=) and the last event it got: that one is newer.
		after, field = id, "Last-Event-ID"
	}
	if after != "" {
		n, err := strconv.ParseInt(after, 10, 64)
		if err != nil || n < 0 {
			return q, httpapi.Invalid(field, "%.64q: want a cursor (a non-negative decimal integer)", after)
		}
		q.After = n
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxEventLimit {
			return q, httpapi.Invalid("limit", "%.64q: want 1..%d", l, maxEventLimit)
		}
		q.Limit = n
	}
	return q, nil
}

// eventView is e on the wire.
func eventView(e store.Event) api.LifecycleEvent {
	cur := strconv.FormatInt(e.Seq, 10)
	return api.LifecycleEvent{
		ID: "evt_" + cur, Cursor: cur, Time: e.Time, Type: e.Type,
		SandboxID: e.SandboxID, Team: e.TeamID,
		State: string(e.State), PreviousState: string(e.Prev),
		Actor: e.Actor, RequestID: e.RequestID, Reason: e.Reason, Data: e.Data,
	}
}

// handleEvents lists events (GET /v1/events), or with follow=true
// streams them.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	q, err := eventQuery(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.serveEvents(w, r, q)
}

// handleSandboxEvents lists or streams one sandbox's events
// (GET /v1/sandboxes/{id}/events): the caller's team's sandbox, or one
// that is gone but whose events are kept.
func (s *Server) handleSandboxEvents(w http.ResponseWriter, r *http.Request) {
	q, err := eventQuery(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	id := r.PathValue("id")
	if !store.ValidSandboxID(id) {
		httpapi.WriteError(w, fmt.Errorf("sandbox %.64q: %w", id, store.ErrNotFound))
		return
	}
	c := callerOf(r)
	q.TeamID, q.SandboxID = c.team, id
	if _, err := s.cfg.Store.Sandbox(r.Context(), c.team, id); errors.Is(err, store.ErrNotFound) {
		// Gone, or never the team's: its history is served while kept.
		old, err := s.cfg.Store.ListEvents(r.Context(), store.EventQuery{TeamID: c.team, SandboxID: id, Limit: 1})
		if err == nil && len(old) == 0 {
			err = fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			httpapi.WriteError(w, err)
			return
		}
	} else if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.serveEvents(w, r, q)
}

func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request, q store.EventQuery) {
	if f := r.URL.Query().Get("follow"); f != "" {
		follow, err := strconv.ParseBool(f)
		if err != nil {
			httpapi.WriteError(w, httpapi.Invalid("follow", "%.64q: want true or false", f))
			return
		}
		if follow {
			s.follow(w, r, q)
			return
		}
	}
	evs, err := s.cfg.Store.ListEvents(r.Context(), q)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.LifecycleEventList{Events: make([]api.LifecycleEvent, 0, len(evs)), Next: strconv.FormatInt(q.After, 10)}
	for _, e := range evs {
		out.Events = append(out.Events, eventView(e))
	}
	if len(evs) > 0 {
		out.Next = strconv.FormatInt(evs[len(evs)-1].Seq, 10)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// follow streams the events q selects as server-sent events, from
// q.After on, until the client goes: each as "id: <cursor>", "event:
// <type>", "data: <JSON>", and a comment every followKeepalive. It asks
// the store every followPoll (events other replicas record), and at once
// when this replica records one (the bell).
func (s *Server) follow(w http.ResponseWriter, r *http.Request, q store.EventQuery) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // nginx: pass it through as it comes
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	q.Limit = maxEventLimit
	poll := time.NewTicker(followPoll)
	defer poll.Stop()
	keep := time.NewTicker(followKeepalive)
	defer keep.Stop()
	for {
		wake := s.bell.wait() // before the query: a ring during it is not missed
		evs, err := s.cfg.Store.ListEvents(ctx, q)
		if err != nil {
			if ctx.Err() == nil {
				s.log.WarnContext(ctx, "follow events", "err", err)
			}
			return // the client reconnects from its last event
		}
		for _, e := range evs {
			b, err := json.Marshal(eventView(e))
			if err != nil {
				s.log.ErrorContext(ctx, "follow events: encode", "err", err)
				return
			}
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Type, b); err != nil {
				return
			}
			q.After = e.Seq
		}
		if len(evs) > 0 {
			if err := rc.Flush(); err != nil {
				return
			}
			if len(evs) == q.Limit {
				continue // more are waiting
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-poll.C:
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}
}
