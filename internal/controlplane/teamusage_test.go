package controlplane

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/sandbox"
	"space/internal/store"
)

// TestTeamMetrics: GET /v1/metrics replays the team's events into
// running sandboxes and starts per step; another team's and bad input
// are refused.
func TestTeamMetrics(t *testing.T) {
	es := newEventsServer(t)
	start := time.Now().UTC().Add(-time.Second)
	var ids []string
	for range 3 {
		b, _ := es.must(t, 201, "POST", "/v1/sandboxes", `{}`)
		var sb api.Sandbox
		if err := json.Unmarshal(b, &sb); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	es.must(t, 200, "POST", "/v1/sandboxes/"+ids[0]+"/pause", "")
	es.must(t, 204, "DELETE", "/v1/sandboxes/"+ids[1], "")
	b, _ := es.must(t, 200, "GET", fmt.Sprintf("/v1/metrics?start=%d&step=5s", start.Unix()), "")
	var m api.TeamMetrics
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Team != DefaultTeam || m.StepSeconds != 5 || len(m.Points) == 0 {
		t.Fatalf("metrics = %s", b)
	}
	// The range began before the creates: nothing ran at its start, and
	// its first step saw the three starts.
	if p := m.Points[0]; p.Running != 0 || p.Started != 3 {
		t.Errorf("first point = %+v, want 0 running and 3 started", p)
	}
	// Stranger and bad input.
	if code, _, _ := es.call(t, es.key, "GET", "/v1/metrics?team=other", ""); code != 403 {
		t.Errorf("another team's metrics with a user key = %d, want 403", code)
	}
	if code, _, _ := es.call(t, es.admin, "GET", "/v1/metrics?team=other", ""); code != 200 {
		t.Errorf("another team's metrics with an admin key = %d, want 200", code)
	}
	for _, q := range []string{"start=soon", "step=1s", "step=x", "start=2000000000", "start=0&step=5s"} {
		if code, body, _ := es.call(t, es.key, "GET", "/v1/metrics?"+q, ""); code != 400 {
			t.Errorf("metrics?%s = %d %s, want 400", q, code, body)
		}
	}
}

// TestTeamSeries checks the replay on events laid out by hand.
func TestTeamSeries(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	ev := func(sec int, typ string, prev, state sandbox.State) store.Event {
		return store.Event{Time: t0.Add(time.Duration(sec) * time.Second), Type: typ, Prev: prev, State: state}
	}
	evs := []store.Event{
		ev(1, sandbox.EventCreated, "", sandbox.Creating),
		ev(2, sandbox.EventRunning, sandbox.Creating, sandbox.Running), // a runs
		ev(12, sandbox.EventCreated, "", sandbox.Creating),
		ev(13, sandbox.EventRunning, sandbox.Creating, sandbox.Running), // b runs
		ev(21, sandbox.EventPaused, sandbox.Running, sandbox.Paused),    // a paused
		ev(31, sandbox.EventResumed, sandbox.Paused, sandbox.Running),   // a runs again
		ev(32, sandbox.EventStopping, sandbox.Running, sandbox.Stopping),
	}
	// Now: one runs (b), plus one that ran before the range began.
	got := teamSeries("t", t0, t0.Add(40*time.Second), 10*time.Second, 2, evs)
	want := []api.TeamMetricsPoint{
		{Time: t0, Running: 1, Started: 1},
		{Time: t0.Add(10 * time.Second), Running: 2, Started: 1},
		{Time: t0.Add(20 * time.Second), Running: 3},
		{Time: t0.Add(30 * time.Second), Running: 2},
	}
	if diff := cmp.Diff(want, got.Points); diff != "" {
		t.Errorf("points (-want +got):\n%s", diff)
	}
}
