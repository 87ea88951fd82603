package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

// TestEvents serves E2B's lifecycle events from a SPACE API that holds a
// sandbox's create, suspend, resume and delete: renamed, newest first
// unless orderAsc, paged by offset and limit, filtered by E2B type.
func TestEvents(t *testing.T) {
	const sb = idPrefix + "abc123"
	types := []string{"created", "running", "stopping", "suspended", "resuming", "running", "stopping", "deleted"}
	var evs []api.LifecycleEvent
	for i, typ := range types {
		cur := strconv.Itoa(i + 1)
		evs = append(evs, api.LifecycleEvent{ID: "evt_" + cur, Cursor: cur, Type: typ, SandboxID: sb, Team: "t1",
			Time: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC)})
	}
	plane := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" && r.URL.Path != "/v1/sandboxes/"+sb+"/events" {
			http.NotFound(w, r)
			return
		}
		after, _ := strconv.Atoi(r.URL.Query().Get("after"))
		out := api.LifecycleEventList{Events: []api.LifecycleEvent{}, Next: strconv.Itoa(after)}
		for _, e := range evs[after:] {
			out.Events = append(out.Events, e)
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(plane.Close)
	s, err := New(Config{API: plane.URL, Sandboxes: noSandboxes{}, Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, []sandboxEvent) {
		t.Helper()
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-API-KEY", "key")
		rec := httptest.NewRecorder()
		s.api.ServeHTTP(rec, req)
		var out []sandboxEvent
		if rec.Code == 200 {
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatalf("GET %s: %s: %v", path, rec.Body, err)
			}
		}
		return rec.Code, out
	}
	names := func(es []sandboxEvent) []string {
		var out []string
		for _, e := range es {
			out = append(out, fmt.Sprintf("%s %s", e.ID, e.Type))
		}
		return out
	}
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/events/sandboxes/abc123", []string{"evt_8 sandbox.lifecycle.killed", "evt_5 sandbox.lifecycle.resumed",
			"evt_4 sandbox.lifecycle.paused", "evt_1 sandbox.lifecycle.created"}},
		{"/events/sandboxes?orderAsc=true&limit=2", []string{"evt_1 sandbox.lifecycle.created", "evt_4 sandbox.lifecycle.paused"}},
		{"/events/sandboxes?offset=1&limit=2", []string{"evt_5 sandbox.lifecycle.resumed", "evt_4 sandbox.lifecycle.paused"}},
		{"/events/sandboxes?offset=9", nil},
		{"/events/sandboxes?types=sandbox.lifecycle.updated", nil},
	} {
		code, got := get(tc.path)
		if code != 200 {
			t.Errorf("GET %s = %d", tc.path, code)
			continue
		}
		if diff := cmp.Diff(tc.want, names(got)); diff != "" {
			t.Errorf("GET %s (-want +got):\n%s", tc.path, diff)
		}
	}
	_, got := get("/events/sandboxes/abc123")
	if e := got[0]; e.Version != "v1" || e.SandboxID != "abc123" || e.SandboxTeamID != "t1" || !e.Timestamp.Equal(evs[7].Time) {
		t.Errorf("event = %+v, want v1, sandbox abc123 (E2B's ID), team t1, its time", e)
	}
	for _, bad := range []string{"?limit=0", "?limit=101", "?offset=-1", "?orderAsc=maybe", "?types=sandbox.lifecycle.exploded"} {
		if code, _ := get("/events/sandboxes" + bad); code != 400 {
			t.Errorf("GET /events/sandboxes%s = %d, want 400", bad, code)
		}
	}
	if code, _ := get("/events/sandboxes/NOT-AN-ID!"); code != 404 {
		t.Errorf("GET /events/sandboxes/<bad id> = %d, want 404", code)
	}
}
