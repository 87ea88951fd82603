package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/origin"
	"space/internal/sandbox"
	"space/internal/store"
)

// ev is what the tests compare of an event: all but Seq and Time, which
// the store sets (they are checked apart).
type ev struct {
	Type, Team, Sandbox, State, Prev, Actor, RequestID, Reason, Data string
}

func evOf(e store.Event) ev {
	return ev{e.Type, e.TeamID, e.SandboxID, string(e.State), string(e.Prev), e.Actor, e.RequestID, e.Reason, string(e.Data)}
}

func evs(es []store.Event) []ev {
	out := []ev{}
	for _, e := range es {
		out = append(out, evOf(e))
	}
	return out
}

func listEvents(t *testing.T, s store.Store, q store.EventQuery) []store.Event {
	t.Helper()
	got, err := s.ListEvents(t.Context(), q)
	if err != nil {
		t.Fatalf("ListEvents(%+v) = %v", q, err)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Fatalf("ListEvents(%+v): seq %d after %d, want increasing", q, got[i].Seq, got[i-1].Seq)
		}
	}
	return got
}

// asKey is a context of a request by API key key with request ID req.
func asKey(ctx context.Context, key, req string) context.Context {
	return origin.With(ctx, origin.Origin{RequestID: req, Kind: origin.KindKey, ID: key})
}

// testEventsWithStateChanges: every write that changes a sandbox's state
// records one event, in its transaction, with the context's actor,
// request ID and reason; a write that fails or changes no state records
// none.
func testEventsWithStateChanges(t *testing.T, h Harness) {
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	ctx := asKey(t.Context(), "key_a", "req_1")

	sb, err := s.CreateSandbox(ctx, newSandbox("t1"))
	if err != nil {
		t.Fatalf("CreateSandbox() = %v", err)
	}
	id := sb.ID
	want := []ev{{Type: "created", Team: "t1", Sandbox: id, State: "creating", Actor: "api_key:key_a", RequestID: "req_1"}}

	sb.State = store.StateRunning
	if sb, err = s.UpdateSandbox(asKey(t.Context(), "key_a", "req_2"), sb); err != nil {
		t.Fatalf("UpdateSandbox(running) = %v", err)
	}
	want = append(want, ev{Type: "running", Team: "t1", Sandbox: id, State: "running", Prev: "creating", Actor: "api_key:key_a", RequestID: "req_2"})

	// No change of state: no event.
	sb.Labels = map[string]string{"a": "b"}
	if sb, err = s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatalf("UpdateSandbox(labels) = %v", err)
	}
	// A compare-and-set that fails records nothing.
	stale := sb
	stale.Version--
	stale.State = store.StatePaused
	if _, err := s.UpdateSandbox(ctx, stale); !errors.Is(err, store.ErrVersionConflict) {
		t.Fatalf("UpdateSandbox(stale) = %v, want version conflict", err)
	}
	// Nor does an update of a sandbox that does not exist.
	ghost := newSandbox("t1")
	ghost.Version, ghost.State = 1, store.StateRunning
	if _, err := s.UpdateSandbox(ctx, ghost); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("UpdateSandbox(ghost) = %v, want not found", err)
	}

	bg := origin.Background(t.Context(), origin.KindPolicy, "timeout")
	bgReq := origin.From(bg).RequestID
	sb.State = store.StatePaused
	if sb, err = s.UpdateSandboxWithinQuota(bg, sb, store.Quota{}); err != nil {
		t.Fatalf("UpdateSandboxWithinQuota(paused) = %v", err)
	}
	want = append(want, ev{Type: "paused", Team: "t1", Sandbox: id, State: "paused", Prev: "running", Actor: "policy:timeout", RequestID: bgReq})
	sb.State = store.StateRunning
	if sb, err = s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatalf("UpdateSandbox(resume) = %v", err)
	}
	want = append(want, ev{Type: "resumed", Team: "t1", Sandbox: id, State: "running", Prev: "paused", Actor: "api_key:key_a", RequestID: "req_1"})

	lost := store.WithReason(origin.Background(t.Context(), origin.KindLeader, "r1"), "worker w1 lost")
	lostReq := origin.From(lost).RequestID
	sb.State = store.StateFailed
	if sb, err = s.UpdateSandbox(lost, sb); err != nil {
		t.Fatalf("UpdateSandbox(failed) = %v", err)
	}
	want = append(want, ev{Type: "failed", Team: "t1", Sandbox: id, State: "failed", Prev: "running", Actor: "leader:r1", RequestID: lostReq, Reason: "worker w1 lost"})

	if err := s.DeleteSandbox(ctx, "t1", id); err != nil {
		t.Fatalf("DeleteSandbox() = %v", err)
	}
	want = append(want, ev{Type: "deleted", Team: "t1", Sandbox: id, State: "deleted", Prev: "failed", Actor: "api_key:key_a", RequestID: "req_1"})
	if err := s.DeleteSandbox(ctx, "t1", id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeleteSandbox() again = %v, want not found", err)
	}
	// A create that fails (the ID is taken) records nothing; a quota
	// refusal neither.
	if _, err := s.CreateSandbox(ctx, ghost); err != nil {
		t.Fatalf("CreateSandbox(ghost) = %v", err)
	}
	want = append(want, ev{Type: "created", Team: "t1", Sandbox: ghost.ID, State: "running", Actor: "api_key:key_a", RequestID: "req_1"})
	if _, err := s.CreateSandbox(ctx, ghost); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("CreateSandbox(ghost) again = %v, want already exists", err)
	}
	if _, err := s.CreateSandboxWithinQuota(ctx, newSandbox("t1"), store.Quota{Sandboxes: 1}); !errors.Is(err, errkind.ResourceExhausted) {
		t.Fatalf("CreateSandboxWithinQuota(over quota) = %v, want resource exhausted", err)
	}
	// A context without origin records an event without actor.
	plain, err := s.CreateSandboxWithinQuota(t.Context(), newSandbox("t1"), store.Quota{})
	if err != nil {
		t.Fatalf("CreateSandboxWithinQuota() = %v", err)
	}
	want = append(want, ev{Type: "created", Team: "t1", Sandbox: plain.ID, State: "creating"})

	got := listEvents(t, s, store.EventQuery{TeamID: "t1"})
	if diff := cmp.Diff(want, evs(got)); diff != "" {
		t.Errorf("ListEvents(t1) (-want +got):\n%s", diff)
	}
	for _, e := range got {
		if e.Time.IsZero() || e.Time.Location() != time.UTC || time.Since(e.Time) > time.Minute {
			t.Errorf("event %d time = %v, want about now, UTC", e.Seq, e.Time)
		}
	}
}

// testEventsFenced: the Fenced writes record their events, and a fenced
// write refused for a lost lease records none.
func testEventsFenced(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sb := mustSandbox(t, s, newSandbox("t1"))
	l := mustAcquire(t, s, "leader", "r1", time.Minute)
	f := s.Fenced(l)
	sb.State = store.StateRunning
	sb, err := f.UpdateSandbox(ctx, sb)
	if err != nil {
		t.Fatalf("Fenced(live).UpdateSandbox() = %v", err)
	}
	other, err := f.CreateSandboxWithinQuota(ctx, newSandbox("t1"), store.Quota{})
	if err != nil {
		t.Fatalf("Fenced(live).CreateSandboxWithinQuota() = %v", err)
	}
	if err := f.DeleteSandbox(ctx, "t1", other.ID); err != nil {
		t.Fatalf("Fenced(live).DeleteSandbox() = %v", err)
	}
	before := listEvents(t, s, store.EventQuery{})
	if diff := cmp.Diff([]string{"created", "running", "created", "deleted"}, eventTypes(before)); diff != "" {
		t.Fatalf("events after fenced writes (-want +got):\n%s", diff)
	}

	// Released, the lease fences every write made with it.
	if err := s.ReleaseLease(ctx, l); err != nil {
		t.Fatalf("ReleaseLease() = %v", err)
	}
	sb.State = store.StatePaused
	if _, err := f.UpdateSandbox(ctx, sb); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Fenced(lost).UpdateSandbox() = %v, want lease lost", err)
	}
	if _, err := f.CreateSandbox(ctx, newSandbox("t1")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Fenced(lost).CreateSandbox() = %v, want lease lost", err)
	}
	if err := f.DeleteSandbox(ctx, "t1", sb.ID); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Fenced(lost).DeleteSandbox() = %v, want lease lost", err)
	}
	if after := listEvents(t, s, store.EventQuery{}); len(after) != len(before) {
		t.Errorf("events after refused fenced writes = %v, want %v", eventTypes(after), eventTypes(before))
	}
}

func eventTypes(es []store.Event) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Type)
	}
	return out
}

func mustAppend(t *testing.T, s store.Store, e store.Event) store.Event {
	t.Helper()
	got, err := s.AppendEvent(t.Context(), e)
	if err != nil {
		t.Fatalf("setup: AppendEvent(%s %s): %v", e.Type, e.SandboxID, err)
	}
	return got
}

// testEventsQuery: the cursor, the filters, the limit and team isolation.
func testEventsQuery(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	a, b, c := store.NewSandboxID(), store.NewSandboxID(), store.NewSandboxID()
	data := json.RawMessage(`{"snapshot_id": "snp_x",  "trigger":"interval"}`)
	var all []store.Event
	for _, p := range []struct{ team, sb, typ string }{
		{"t1", a, "checkpointed"}, {"t2", c, "forked"}, {"t1", b, "snapshotted"},
		{"t1", a, "expired"}, {"t2", c, "checkpointed"}, {"t1", b, "checkpointed"},
	} {
		e := mustAppend(t, s, store.Event{Type: p.typ, TeamID: p.team, SandboxID: p.sb, Data: data, Actor: "policy:checkpoints", Reason: "why"})
		if e.Seq <= 0 || (len(all) > 0 && e.Seq <= all[len(all)-1].Seq) || e.Time.IsZero() {
			t.Fatalf("AppendEvent() = seq %d time %v, want increasing seq, time set", e.Seq, e.Time)
		}
		all = append(all, e)
	}
	if !json.Valid(all[0].Data) || string(all[0].Data) != string(data) {
		t.Errorf("AppendEvent() data = %s, want %s byte for byte", all[0].Data, data)
	}
	pick := func(is ...int) []store.Event {
		out := []store.Event{}
		for _, i := range is {
			out = append(out, all[i])
		}
		return out
	}
	for _, tc := range []struct {
		name string
		q    store.EventQuery
		want []store.Event
	}{
		{"every team", store.EventQuery{}, all},
		{"team t1", store.EventQuery{TeamID: "t1"}, pick(0, 2, 3, 5)},
		{"team t2", store.EventQuery{TeamID: "t2"}, pick(1, 4)},
		{"team without events", store.EventQuery{TeamID: "t3"}, pick()},
		{"sandbox", store.EventQuery{TeamID: "t1", SandboxID: a}, pick(0, 3)},
		{"another team's sandbox", store.EventQuery{TeamID: "t1", SandboxID: c}, pick()},
		{"sandbox of every team", store.EventQuery{SandboxID: c}, pick(1, 4)},
		{"type", store.EventQuery{TeamID: "t1", Types: []string{"checkpointed"}}, pick(0, 5)},
		{"types", store.EventQuery{Types: []string{"checkpointed", "forked"}}, pick(0, 1, 4, 5)},
		{"after", store.EventQuery{After: all[2].Seq}, pick(3, 4, 5)},
		{"after, team", store.EventQuery{TeamID: "t2", After: all[1].Seq}, pick(4)},
		{"after the last", store.EventQuery{After: all[5].Seq}, pick()},
		{"limit", store.EventQuery{Limit: 2}, pick(0, 1)},
		{"limit after", store.EventQuery{After: all[0].Seq, Limit: 2}, pick(1, 2)},
		{"limit over the cap", store.EventQuery{Limit: 5000}, all},
		{"since the first", store.EventQuery{Since: all[0].Time}, all},
		{"since after the last", store.EventQuery{Since: all[5].Time.Add(time.Millisecond)}, pick()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := listEvents(t, s, tc.q)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ListEvents(%+v) (-want +got):\n%s", tc.q, diff)
			}
		})
	}

	for _, tc := range []struct {
		name string
		e    store.Event
	}{
		{"unknown type", store.Event{Type: "exploded", TeamID: "t1", SandboxID: a}},
		{"no team", store.Event{Type: "forked", SandboxID: a}},
		{"bad sandbox", store.Event{Type: "forked", TeamID: "t1", SandboxID: "x"}},
		{"bad state", store.Event{Type: "forked", TeamID: "t1", SandboxID: a, State: "dancing"}},
		{"data not an object", store.Event{Type: "forked", TeamID: "t1", SandboxID: a, Data: json.RawMessage(`[1]`)}},
		{"data not JSON", store.Event{Type: "forked", TeamID: "t1", SandboxID: a, Data: json.RawMessage(`{`)}},
		{"data too big", store.Event{Type: "forked", TeamID: "t1", SandboxID: a,
			Data: json.RawMessage(`{"a":"` + strings.Repeat("x", store.MaxEventData) + `"}`)}},
		{"reason too long", store.Event{Type: "forked", TeamID: "t1", SandboxID: a, Reason: strings.Repeat("x", store.MaxEventReason+1)}},
	} {
		if _, err := s.AppendEvent(ctx, tc.e); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("AppendEvent(%s) = %v, want invalid", tc.name, err)
		}
	}
	for _, q := range []store.EventQuery{
		{Types: []string{"created", "exploded"}}, {SandboxID: "x"}, {After: -1}, {Limit: -1},
	} {
		if _, err := s.ListEvents(ctx, q); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ListEvents(%+v) = %v, want invalid", q, err)
		}
	}
	if got := listEvents(t, s, store.EventQuery{}); len(got) != len(all) {
		t.Errorf("events after bad input = %d, want %d", len(got), len(all))
	}
}

// testEventsRetention: DeleteEventsBefore removes what was recorded
// before a time, of every team, and the cursor never goes back.
func testEventsRetention(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	if n, err := s.DeleteEventsBefore(ctx, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("DeleteEventsBefore(now+1h) of none = %d, %v; want 0", n, err)
	}
	sb := store.NewSandboxID()
	var all []store.Event
	for i := range 4 {
		all = append(all, mustAppend(t, s, store.Event{Type: "forked", TeamID: fmt.Sprintf("t%d", i%2+1), SandboxID: sb}))
	}
	// Keep those recorded at or after the third's time (two may share
	// a microsecond: count from what the store says).
	cut := all[2].Time
	var kept []store.Event
	for _, e := range all {
		if !e.Time.Before(cut) {
			kept = append(kept, e)
		}
	}
	n, err := s.DeleteEventsBefore(ctx, cut)
	if err != nil || n != len(all)-len(kept) {
		t.Fatalf("DeleteEventsBefore(third) = %d, %v; want %d", n, err, len(all)-len(kept))
	}
	if diff := cmp.Diff(kept, listEvents(t, s, store.EventQuery{})); diff != "" {
		t.Errorf("events kept (-want +got):\n%s", diff)
	}
	if n, err := s.DeleteEventsBefore(ctx, time.Now().Add(time.Hour)); err != nil || n != len(kept) {
		t.Fatalf("DeleteEventsBefore(now+1h) = %d, %v; want %d", n, err, len(kept))
	}
	// With every event gone, the next still gets a higher Seq: a
	// follower's cursor stays valid.
	next := mustAppend(t, s, store.Event{Type: "forked", TeamID: "t1", SandboxID: sb})
	if next.Seq <= all[3].Seq {
		t.Errorf("AppendEvent() after deleting all: seq %d, want more than %d", next.Seq, all[3].Seq)
	}
}

// testEventsFollow: while several writers record events at once, a
// reader that keeps asking for what comes after the last event it saw
// gets each exactly once: events become visible in Seq order.
func testEventsFollow(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	const writers, each = 4, 15
	sbs := make([]store.Sandbox, writers)
	for i := range sbs {
		sbs[i] = mustSandbox(t, s, newSandbox("t1"))
	}
	start := listEvents(t, s, store.EventQuery{})
	cursor := start[len(start)-1].Seq

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := sbs[i]
			for j := range each {
				var err error
				if j%2 == 0 {
					// A state change: the event rides on the update.
					if sb.State == store.StateRunning {
						sb.State = store.StatePaused
					} else {
						sb.State = store.StateRunning
					}
					sb, err = s.UpdateSandbox(ctx, sb)
				} else {
					_, err = s.AppendEvent(ctx, store.Event{Type: sandbox.EventCheckpointed, TeamID: "t1", SandboxID: sb.ID})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	seen := map[int64]bool{}
	var order []int64
	for finished := false; ; {
		select {
		case <-done:
			finished = true
		default:
		}
		got, err := s.ListEvents(ctx, store.EventQuery{After: cursor, Limit: 7})
		if err != nil {
			t.Fatalf("ListEvents(after %d) = %v", cursor, err)
		}
		for _, e := range got {
			if seen[e.Seq] {
				t.Fatalf("event %d seen twice", e.Seq)
			}
			seen[e.Seq] = true
			order = append(order, e.Seq)
			cursor = e.Seq
		}
		if finished && len(got) == 0 {
			break
		}
	}
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	all := listEvents(t, s, store.EventQuery{After: start[len(start)-1].Seq})
	if len(all) != writers*each || len(order) != len(all) {
		t.Fatalf("follower saw %d events, store has %d, want %d", len(order), len(all), writers*each)
	}
	for i, e := range all {
		if order[i] != e.Seq {
			t.Fatalf("follower's event %d is seq %d, store's is %d", i, order[i], e.Seq)
		}
	}
}
