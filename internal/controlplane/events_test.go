package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"

	"space/api"
	"space/internal/errkind"
	"space/internal/origin"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/testenv"
	"space/internal/worker"
)

// eventsServer is a lifecycle server on a real loopback listener, with a
// key of the default team (not admin), an admin key, and a key of
// another team.
type eventsServer struct {
	s                    *Server
	st                   store.Store
	url                  string
	key, admin, stranger string // secrets
	keyID                string
}

func newEventsServer(t *testing.T) *eventsServer {
	t.Helper()
	s, st, _ := configuredServer(t, &instantWorker{}, Config{})
	ctx := t.Context()
	_, adminSecret, err := s.newKey(ctx, DefaultTeam, "admin 2", true)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	k, secret, err := s.newKey(ctx, DefaultTeam, "user", false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := st.CreateTeam(ctx, store.Team{ID: "other", Name: "other"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	_, stranger, err := s.newKey(ctx, "other", "stranger", false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &eventsServer{s: s, st: st, url: srv.URL, key: secret, admin: adminSecret, stranger: stranger, keyID: k.ID}
}

// call sends a request with key and returns the status, body and the
// request ID answered.
func (es *eventsServer) call(t *testing.T, key, method, path, body string) (int, []byte, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, es.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp.StatusCode, b, resp.Header.Get(origin.Header)
}

// must is call that wants status want.
func (es *eventsServer) must(t *testing.T, want int, method, path, body string) ([]byte, string) {
	t.Helper()
	code, b, req := es.call(t, es.key, method, path, body)
	if code != want {
		t.Fatalf("%s %s = %d %s, want %d", method, path, code, b, want)
	}
	return b, req
}

func (es *eventsServer) events(t *testing.T, key, query string) (int, api.LifecycleEventList) {
	t.Helper()
	code, b, _ := es.call(t, key, "GET", query, "")
	var out api.LifecycleEventList
	if code == 200 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("GET %s: decode %s: %v", query, b, err)
		}
	}
	return code, out
}

// brief is what the tests compare of an event.
type brief struct{ Type, State, Prev, Actor, RequestID string }

func briefs(evs []api.LifecycleEvent) []brief {
	out := []brief{}
	for _, e := range evs {
		out = append(out, brief{e.Type, e.State, e.PreviousState, e.Actor, e.RequestID})
	}
	return out
}

// TestEvents: a sandbox's create, pause, resume and delete are recorded
// in order with the key that asked and the request ID answered; another
// team sees none of them; the filters, cursor and limit work, and bad
// ones are refused.
func TestEvents(t *testing.T) {
	es := newEventsServer(t)
	b, createReq := es.must(t, 201, "POST", "/v1/sandboxes", `{}`)
	var sb api.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatalf("create: %v", err)
	}
	_, pauseReq := es.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/pause", "")
	_, resumeReq := es.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", "")
	_, deleteReq := es.must(t, 204, "DELETE", "/v1/sandboxes/"+sb.ID, "")

	actor := "api_key:" + es.keyID
	want := []brief{
		{"created", "creating", "", actor, createReq},
		{"running", "running", "creating", actor, createReq},
		{"paused", "paused", "running", actor, pauseReq},
		{"resumed", "running", "paused", actor, resumeReq},
		{"stopping", "stopping", "running", actor, deleteReq},
		{"deleted", "deleted", "stopping", actor, deleteReq},
	}
	code, all := es.events(t, es.key, "/v1/events")
	if code != 200 {
		t.Fatalf("GET /v1/events = %d", code)
	}
	if diff := cmp.Diff(want, briefs(all.Events)); diff != "" {
		t.Fatalf("GET /v1/events (-want +got):\n%s", diff)
	}
	for i, e := range all.Events {
		if e.SandboxID != sb.ID || e.Team != DefaultTeam || e.ID != "evt_"+e.Cursor || e.Time.IsZero() {
			t.Errorf("event %d = %+v, want sandbox %s, team %s, id evt_<cursor>, a time", i, e, sb.ID, DefaultTeam)
		}
	}
	last := all.Events[len(all.Events)-1].Cursor
	if all.Next != last {
		t.Errorf("next = %q, want the last cursor %q", all.Next, last)
	}
	// The sandbox is gone; its history is still served, to its team.
	if code, one := es.events(t, es.key, "/v1/sandboxes/"+sb.ID+"/events"); code != 200 || len(one.Events) != len(want) {
		t.Errorf("GET /v1/sandboxes/{id}/events = %d, %d events; want 200, %d", code, len(one.Events), len(want))
	}

	// Another team sees nothing of it.
	if code, got := es.events(t, es.stranger, "/v1/events"); code != 200 || len(got.Events) != 0 || got.Next != "0" {
		t.Errorf("GET /v1/events as another team = %d %+v, want 200, none, next 0", code, got)
	}
	if code, _ := es.events(t, es.stranger, "/v1/sandboxes/"+sb.ID+"/events"); code != 404 {
		t.Errorf("GET /v1/sandboxes/{id}/events as another team = %d, want 404", code)
	}
	if code, _ := es.events(t, es.stranger, "/v1/events?team="+DefaultTeam); code != 403 {
		t.Errorf("GET /v1/events?team=<another> with a plain key = %d, want 403", code)
	}
	if code, _ := es.events(t, es.key, "/v1/events?all=true"); code != 403 {
		t.Errorf("GET /v1/events?all=true with a plain key = %d, want 403", code)
	}
	// An admin may look at every team, or one.
	if code, got := es.events(t, es.admin, "/v1/events?all=true"); code != 200 || len(got.Events) != len(want) {
		t.Errorf("GET /v1/events?all=true as admin = %d, %d events; want %d", code, len(got.Events), len(want))
	}
	if code, got := es.events(t, es.admin, "/v1/events?team=other"); code != 200 || len(got.Events) != 0 {
		t.Errorf("GET /v1/events?team=other as admin = %d, %d events; want none", code, len(got.Events))
	}

	for _, tc := range []struct {
		query string
		want  []brief
		next  string
	}{
		{"type=paused,resumed", want[2:4], all.Events[3].Cursor},
		{"type=paused&type=deleted", []brief{want[2], want[5]}, last},
		{"after=" + all.Events[3].Cursor, want[4:], last},
		{"limit=2", want[:2], all.Events[1].Cursor},
		{"after=" + last, []brief{}, last},
		{"sandbox=" + sb.ID + "&type=created", want[:1], all.Events[0].Cursor},
		{"sandbox=" + store.NewSandboxID(), []brief{}, "0"},
	} {
		code, got := es.events(t, es.key, "/v1/events?"+tc.query)
		if code != 200 {
			t.Errorf("GET /v1/events?%s = %d, want 200", tc.query, code)
			continue
		}
		if diff := cmp.Diff(tc.want, briefs(got.Events)); diff != "" || got.Next != tc.next {
			t.Errorf("GET /v1/events?%s: next %q (want %q); events (-want +got):\n%s", tc.query, got.Next, tc.next, diff)
		}
	}
	for _, q := range []string{"type=exploded", "type=created,nope", "after=abc", "after=-1", "limit=0", "limit=1001", "sandbox=x", "all=maybe", "follow=perhaps"} {
		if code, b, _ := es.call(t, es.key, "GET", "/v1/events?"+q, ""); code != 400 {
			t.Errorf("GET /v1/events?%s = %d %s, want 400", q, code, b)
		}
	}
}

// sse is one server-sent event.
type sse struct{ id, event, data string }

// readSSE sends the events of a stream to the returned channel until it
// ends, then closes it. Comments (keepalives) are skipped.
func readSSE(body io.Reader) <-chan sse {
	out := make(chan sse)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(body)
		var cur sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur != (sse{}) {
					out <- cur
				}
				cur = sse{}
			case strings.HasPrefix(line, ":"):
			case strings.HasPrefix(line, "id: "):
				cur.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				cur.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				cur.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return out
}

// follow opens the follow stream with key, sending lastID as
// Last-Event-ID unless it is "", and returns its events and a func that
// disconnects.
func (es *eventsServer) follow(t *testing.T, query, lastID string) (<-chan sse, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, "GET", es.url+"/v1/events?follow=true&"+query, nil)
	if err != nil {
		t.Fatalf("follow: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+es.key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("follow: %v", err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("follow = %d %s, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readSSE(resp.Body)
	stop := func() {
		cancel()
		resp.Body.Close()
		for range evs { // the reader ends with the body
		}
	}
	t.Cleanup(stop)
	return evs, stop
}

// next returns the next n events of a stream, failing after a while.
func next(t *testing.T, evs <-chan sse, n int) []sse {
	t.Helper()
	var got []sse
	timeout := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case e, ok := <-evs:
			if !ok {
				t.Fatalf("stream ended after %v, want %d events", got, n)
			}
			got = append(got, e)
		case <-timeout:
			t.Fatalf("got %v within 10s, want %d events", got, n)
		}
	}
	return got
}

func types(evs []sse) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.event)
	}
	return out
}

// TestEventsFollow: a follower gets events as they happen; once it
// reconnects with the last ID it got, it gets exactly those it missed,
// none twice, and then the live ones again.
func TestEventsFollow(t *testing.T) {
	es := newEventsServer(t)
	evs, disconnect := es.follow(t, "after=0", "")
	b, _ := es.must(t, 201, "POST", "/v1/sandboxes", `{}`)
	var sb api.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatalf("create: %v", err)
	}
	first := next(t, evs, 2)
	if diff := cmp.Diff([]string{"created", "running"}, types(first)); diff != "" {
		t.Fatalf("live events (-want +got):\n%s", diff)
	}
	var e api.LifecycleEvent
	if err := json.Unmarshal([]byte(first[1].data), &e); err != nil || e.Cursor != first[1].id || e.SandboxID != sb.ID || e.Type != "running" {
		t.Fatalf("event data %s (%v), want the running event of %s with cursor %s", first[1].data, err, sb.ID, first[1].id)
	}
	disconnect()

	// Missed while away.
	es.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/pause", "")
	es.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", "")

	// A reconnecting EventSource sends its first URL again and the last
	// ID it got: that wins over after=.
	evs, _ = es.follow(t, "after=0", first[1].id)
	missed := next(t, evs, 2)
	if diff := cmp.Diff([]string{"paused", "resumed"}, types(missed)); diff != "" {
		t.Fatalf("events after reconnecting (-want +got):\n%s", diff)
	}
	es.must(t, 204, "DELETE", "/v1/sandboxes/"+sb.ID, "")
	live := next(t, evs, 2)
	if diff := cmp.Diff([]string{"stopping", "deleted"}, types(live)); diff != "" {
		t.Fatalf("live events after reconnecting (-want +got):\n%s", diff)
	}
	seen := map[string]bool{}
	prev := int64(0)
	for _, e := range append(append(first, missed...), live...) {
		n, err := strconv.ParseInt(e.id, 10, 64)
		if err != nil || n <= prev || seen[e.id] {
			t.Errorf("event id %q after %d: want increasing, each once", e.id, prev)
		}
		seen[e.id], prev = true, n
	}
	// Nothing more is pending: a store that has six events sent six.
	all, err := es.st.ListEvents(t.Context(), store.EventQuery{})
	if err != nil || len(all) != 6 {
		t.Errorf("stored events = %d, %v; want 6", len(all), err)
	}
}

// lostVMs is an instantWorker that has no VM any more.
type lostVMs struct{ instantWorker }

func (w *lostVMs) Sandbox(_ context.Context, id string) (worker.Info, error) {
	return worker.Info{}, fmt.Errorf("sandbox %s: %w", id, errkind.NotFound)
}

// TestEventsOfBackgroundWork: what the control plane does on its own is
// recorded with its actor: a timeout (policy:timeout, expired first),
// a VM reconcile found gone (leader:<replica>, with the reason).
func TestEventsOfBackgroundWork(t *testing.T) {
	s, st, do := configuredServer(t, &instantWorker{}, Config{ReplicaID: "cp-1", ReapInterval: time.Minute})
	lost := mustCreate(t, do)
	s.AddWorker(&lostVMs{}) // the same ID: the VMs are gone
	if err := s.Reconcile(t.Context()); err != nil {
		t.Fatalf("Reconcile() = %v", err)
	}
	evs, err := st.ListEvents(t.Context(), store.EventQuery{SandboxID: lost.ID, Types: []string{"failed"}})
	if err != nil || len(evs) != 1 {
		t.Fatalf("failed events = %v, %v; want one", evs, err)
	}
	if e := evs[0]; e.Actor != "leader:cp-1" || e.RequestID == "" || !strings.Contains(e.Reason, "no longer has the VM") {
		t.Errorf("failed event = %+v, want actor leader:cp-1, a request ID, a reason saying the VM is gone", e)
	}

	s.AddWorker(&instantWorker{})
	code, body := do("POST", "/v1/sandboxes", `{"timeout_seconds":1}`)
	var short api.Sandbox
	if code != 201 || json.Unmarshal(body, &short) != nil {
		t.Fatalf("setup: create = %d %s", code, body)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var got []store.Event
	testenv.Eventually(t, 10*time.Second, func() bool {
		got, err = st.ListEvents(t.Context(), store.EventQuery{SandboxID: short.ID, Types: []string{"expired", "stopping", "deleted"}})
		return err == nil && len(got) == 3
	})
	for i, want := range []string{"expired", "stopping", "deleted"} {
		if e := got[i]; e.Type != want || e.Actor != "policy:timeout" || e.RequestID != got[0].RequestID {
			t.Errorf("event %d = %+v, want %s by policy:timeout in one request", i, e, want)
		}
	}
	if got[0].Reason == "" {
		t.Errorf("expired event has no reason")
	}
}

// TestEventRetention: the leader's prune removes events older than the
// retention, and keeps them all when it is negative.
func TestEventRetention(t *testing.T) {
	later := time.Now().Add(3 * time.Hour)
	for _, tc := range []struct {
		retention time.Duration
		left      int
	}{{-1, 2}, {time.Hour, 0}, {5 * time.Hour, 2}} {
		s, st, do := configuredServer(t, &instantWorker{}, Config{EventRetention: tc.retention})
		mustCreate(t, do) // created, running
		s.now = func() time.Time { return later }
		s.pruneEvents(t.Context())
		if evs, err := st.ListEvents(t.Context(), store.EventQuery{}); err != nil || len(evs) != tc.left {
			t.Errorf("retention %v, 3h later: %d events left (%v), want %d", tc.retention, len(evs), err, tc.left)
		}
	}
}

// TestEventTypesDocumented: the OpenAPI document lists exactly the
// event types the server knows.
func TestEventTypesDocumented(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []string `yaml:"enum"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	got := doc.Components.Schemas["LifecycleEvent"].Properties["type"].Enum
	if diff := cmp.Diff(sandbox.EventTypes, got); diff != "" {
		t.Errorf("LifecycleEvent.type enum (-sandbox.EventTypes +openapi.yaml):\n%s", diff)
	}
}

// TestEventsOfSnapshots: a snapshot, a restore from it, a checkpoint and
// a fork each record their event, with the snapshot or child in data.
func TestEventsOfSnapshots(t *testing.T) {
	_, st, do := configuredServer(t, &failsNthCreate{}, Config{})
	sb := mustCreate(t, do)
	code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/snapshots", `{"name":"snap"}`)
	var sn api.Snapshot
	if code != 201 || json.Unmarshal(body, &sn) != nil {
		t.Fatalf("snapshot = %d %s", code, body)
	}
	if code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/restore", `{"snapshot":"snap"}`); code != 200 {
		t.Fatalf("restore = %d %s", code, body)
	}
	code, body = do("POST", "/v1/sandboxes/"+sb.ID+"/checkpoints", "")
	var cp api.Checkpoint
	if code != 201 || json.Unmarshal(body, &cp) != nil {
		t.Fatalf("checkpoint = %d %s", code, body)
	}
	code, body = do("POST", "/v1/sandboxes/"+sb.ID+"/fork", `{"count":2}`)
	var kids api.SandboxList
	if code != 201 || json.Unmarshal(body, &kids) != nil || len(kids.Sandboxes) != 2 {
		t.Fatalf("fork = %d %s", code, body)
	}
	evs, err := st.ListEvents(t.Context(), store.EventQuery{SandboxID: sb.ID})
	if err != nil {
		t.Fatalf("ListEvents() = %v", err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Type+" "+string(e.Data))
	}
	want := []string{
		"created ", "running ",
		`snapshotted {"snapshot_id":"` + sn.ID + `"}`,
		"restoring ", "running ",
		`restored {"snapshot_id":"` + sn.ID + `"}`,
		`checkpointed {"snapshot_id":"` + cp.ID + `","trigger":"manual"}`,
		`forked {"child_id":"` + kids.Sandboxes[0].ID + `"}`,
		`forked {"child_id":"` + kids.Sandboxes[1].ID + `"}`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
