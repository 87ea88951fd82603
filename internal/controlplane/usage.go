package controlplane

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/workerproto"
)

// handleMetrics answers GET /v1/sandboxes/{id}/metrics: the sandbox's
// usage history from its worker (package usage), between the query's
// start and end (unix seconds or RFC 3339; either may be left out). A
// sandbox without a VM now (suspended, stopped) has no samples: the
// history lives with the VM on its worker.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	var req workerproto.UsageRequest
	for _, b := range []struct {
		name string
		t    *time.Time
	}{{"start", &req.Start}, {"end", &req.End}} {
		v := r.URL.Query().Get(b.name)
		if v == "" {
			continue
		}
		t, err := parseInstant(v)
		if err != nil {
			httpapi.WriteError(w, &httpapi.FieldError{Field: b.name, Err: err})
			return
		}
		*b.t = t
	}
	if !req.Start.IsZero() && !req.End.IsZero() && req.End.Before(req.Start) {
		httpapi.WriteError(w, &httpapi.FieldError{Field: "end", Err: fmt.Errorf("end is before start: %w", errkind.InvalidArgument)})
		return
	}
	sb, err := s.load(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.SandboxMetrics{SandboxID: sb.ID, Samples: []api.UsageSample{}}
	if sb.WorkerID != "" && !lostWith(sb) {
		wk, err := s.worker(sb.WorkerID)
		if err == nil {
			var m api.SandboxMetrics
			m, err = wk.Usage(r.Context(), sb.ID, req)
			if err == nil {
				out = m
			}
		}
		if err != nil && !errors.Is(err, errkind.NotFound) {
			httpapi.WriteError(w, fmt.Errorf("usage of %s: %w", sb.ID, err))
			return
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// parseInstant reads a time given as unix seconds or RFC 3339.
func parseInstant(v string) (time.Time, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > 1<<40 {
			return time.Time{}, fmt.Errorf("%d: out of range: %w", n, errkind.InvalidArgument)
		}
		return time.Unix(n, 0).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%.40q: want unix seconds or RFC 3339: %w", v, errkind.InvalidArgument)
	}
	return t, nil
}
