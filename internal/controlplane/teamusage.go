package controlplane

import (
	"fmt"
	"net/http"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
)

// Bounds of GET /v1/metrics.
const (
	defaultTeamRange = time.Hour
	maxTeamPoints    = 1000
	minTeamStep      = 5 * time.Second
	// maxTeamEvents bounds the events one answer reads: past it the range
	// is too busy to replay and the caller is asked for a shorter one.
	maxTeamEvents = 200_000
)

// handleTeamMetrics answers GET /v1/metrics: a team's running sandboxes
// and sandbox starts over time. Both come from the lifecycle events: the
// number running now is counted in the store, and the events since the
// range's start are replayed backwards from it, so the series is exact
// for as long as events are kept (Config.EventRetention; the range is
// cut there).
func (s *Server) handleTeamMetrics(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	v := r.URL.Query()
	team := c.team
	if t := v.Get("team"); t != "" && t != c.team {
		if !c.admin {
			httpapi.WriteError(w, fmt.Errorf("metrics of another team need an admin key: %w", errkind.PermissionDenied))
			return
		}
		if !store.ValidID(t) {
			httpapi.WriteError(w, httpapi.Invalid("team", "%.64q: 1-128 characters of [A-Za-z0-9_.-]", t))
			return
		}
		team = t
	}
	now := s.now().UTC()
	end, start := now, time.Time{}
	for _, b := range []struct {
		name string
		t    *time.Time
	}{{"start", &start}, {"end", &end}} {
		if q := v.Get(b.name); q != "" {
			t, err := parseInstant(q)
			if err != nil {
				httpapi.WriteError(w, &httpapi.FieldError{Field: b.name, Err: err})
				return
			}
			*b.t = t
		}
	}
	end = minTime(end, now)
	if start.IsZero() {
		start = end.Add(-defaultTeamRange)
	}
	if s.cfg.EventRetention > 0 {
		start = maxTime(start, now.Add(-s.cfg.EventRetention))
	}
	if !start.Before(end) {
		httpapi.WriteError(w, &httpapi.FieldError{Field: "start", Err: fmt.Errorf("start must be before end (and now): %w", errkind.InvalidArgument)})
		return
	}
	step := max((end.Sub(start)+maxTeamPoints-1)/maxTeamPoints, minTeamStep)
	if q := v.Get("step"); q != "" {
		d, err := time.ParseDuration(q)
		if err != nil || d < minTeamStep {
			httpapi.WriteError(w, httpapi.Invalid("step", "%.32q: want a duration of at least %s", q, minTeamStep))
			return
		}
		if end.Sub(start)/d > maxTeamPoints {
			httpapi.WriteError(w, httpapi.Invalid("step", "%s gives more than %d points over the range", d, maxTeamPoints))
			return
		}
		step = d
	}
	ctx := r.Context()
	running, err := s.cfg.Store.ListSandboxes(ctx, team, store.Filter{States: []store.SandboxState{sandbox.Running}})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var evs []store.Event
	for after := int64(0); ; {
		page, err := s.cfg.Store.ListEvents(ctx, store.EventQuery{TeamID: team, Since: start, After: after, Limit: store.MaxEventLimit})
		if err != nil {
			httpapi.WriteError(w, err)
			return
		}
		evs = append(evs, page...)
		if len(evs) > maxTeamEvents {
			httpapi.WriteError(w, &httpapi.FieldError{Field: "start", Err: fmt.Errorf("more than %d events since %s: ask for a shorter range: %w", maxTeamEvents, start.Format(time.RFC3339), errkind.InvalidArgument)})
			return
		}
		if len(page) < store.MaxEventLimit {
			break
		}
		after = page[len(page)-1].Seq
	}
	httpapi.WriteJSON(w, http.StatusOK, teamSeries(team, start, end, step, len(running), evs))
}

// teamSeries builds the points of [start, end) every step: running is
// the number of sandboxes in state running at the point's time (replayed
// back from runningNow through evs, every event since start in Seq
// order), started the creates in the step from it.
func teamSeries(team string, start, end time.Time, step time.Duration, runningNow int, evs []store.Event) api.TeamMetrics {
	out := api.TeamMetrics{Team: team, StepSeconds: step.Seconds(), Points: []api.TeamMetricsPoint{}}
	var times []time.Time
	for t := start; t.Before(end); t = t.Add(step) {
		times = append(times, t)
	}
	out.Points = make([]api.TeamMetricsPoint, len(times))
	// Walk back from now: each event after a point's time is undone.
	running, j := runningNow, len(evs)-1
	for i := len(times) - 1; i >= 0; i-- {
		for ; j >= 0 && evs[j].Time.After(times[i]); j-- {
			e := evs[j]
			if e.State == sandbox.Running {
				running--
			}
			if e.Prev == sandbox.Running {
				running++
			}
		}
		out.Points[i] = api.TeamMetricsPoint{Time: times[i], Running: max(running, 0)}
	}
	for _, e := range evs {
		if e.Type != sandbox.EventCreated || e.Time.Before(start) || !e.Time.Before(end) {
			continue
		}
		if i := int(e.Time.Sub(start) / step); i < len(out.Points) {
			out.Points[i].Started++
		}
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
