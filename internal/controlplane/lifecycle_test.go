package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/testenv"
	"space/internal/worker"
)

// failsNthCreate is an instantWorker whose nth Create (counting from 1;
// 0: none) fails, that takes chunked snapshots of what it runs, and that
// keeps the IDs it was asked to delete; if deleteFails, every Delete
// fails.
type failsNthCreate struct {
	instantWorker
	n           int
	deleteFails bool

	mu sync.Mutex
	// +checklocks:mu
	creates int
	// +checklocks:mu
	deleted []string
}

func (w *failsNthCreate) Create(ctx context.Context, req worker.CreateRequest) (worker.Info, error) {
	w.mu.Lock()
	w.creates++
	nth := w.creates
	w.mu.Unlock()
	if nth == w.n {
		return worker.Info{}, fmt.Errorf("create %s: no room after all: %w", req.ID, errkind.Unavailable)
	}
	return w.instantWorker.Create(ctx, req)
}

func (w *failsNthCreate) Delete(_ context.Context, id string) error {
	fails := w.deleteFails // set before use, never changed
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleted = append(w.deleted, id)
	if fails {
		return fmt.Errorf("delete %s: disk stuck: %w", id, errkind.Unavailable)
	}
	return nil
}

func (w *failsNthCreate) Snapshot(_ context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error) {
	return worker.SnapshotInfo{ID: req.SnapshotID, SandboxID: id, Chunked: true,
		Spec: worker.Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024}}, nil
}

func (w *failsNthCreate) deletes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.deleted)
}

// lifecycleServer returns a server with wk as its one (healthy) worker,
// its store, and a func that sends a request with the admin's API key.
func lifecycleServer(t *testing.T, wk Worker) (*Server, store.Store, func(method, path, body string) (int, []byte)) {
	t.Helper()
	return configuredServer(t, wk, Config{})
}

// configuredServer is lifecycleServer with cfg (its store and templates
// filled in).
func configuredServer(t *testing.T, wk Worker, cfg Config) (*Server, store.Store, func(method, path, body string) (int, []byte)) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	cfg.Store, cfg.Templates = st, []string{"default"}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	s.AddWorker(wk)
	s.mu.Lock()
	s.seen[wk.ID()] = time.Now().Add(time.Hour)
	s.mu.Unlock()
	return s, st, adminCaller(t, s)
}

// mustCreate creates a sandbox through the API.
func mustCreate(t *testing.T, do func(method, path, body string) (int, []byte)) api.Sandbox {
	t.Helper()
	code, body := do("POST", "/v1/sandboxes", `{}`)
	var sb api.Sandbox
	if code != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("setup: POST /v1/sandboxes = %d %s", code, body)
	}
	return sb
}

// ids lists the IDs of the team's sandboxes in the store.
func ids(t *testing.T, st store.Store) []string {
	t.Helper()
	all, err := st.ListSandboxes(t.Context(), DefaultTeam, store.Filter{})
	if err != nil {
		t.Fatalf("ListSandboxes = %v", err)
	}
	var out []string
	for _, sb := range all {
		out = append(out, sb.ID)
	}
	return out
}

// TestForkFailureRemovesChildren checks a fork of 3 whose 2nd child fails
// removes the 1st through the delete path (the worker is asked, the record
// and its quota use go) and says so; and that a child whose removal fails
// too is named in the error as remaining.
func TestForkFailureRemovesChildren(t *testing.T) {
	t.Run("removed", func(t *testing.T) {
		wk := &failsNthCreate{n: 3} // the parent, child 1, then child 2 fails
		_, st, do := lifecycleServer(t, wk)
		parent := mustCreate(t, do)
		code, body := do("POST", "/v1/sandboxes/"+parent.ID+"/fork", `{"count":3}`)
		if code != 503 || !strings.Contains(string(body), "fork 2 of 3") || !strings.Contains(string(body), "the 1 sandboxes made before it were removed") {
			t.Errorf("fork = %d %s, want 503 naming child 2 of 3 and the removal", code, body)
		}
		if got := ids(t, st); !slices.Equal(got, []string{parent.ID}) {
			t.Errorf("sandboxes after the failed fork = %q, want only the parent %s", got, parent.ID)
		}
		// Delete was called for child 1 (and for the failed child 2 by its
		// own rollback).
		if del := wk.deletes(); len(del) != 2 || slices.Contains(del, parent.ID) {
			t.Errorf("worker deletes = %q, want the two children", del)
		}
		sns, err := st.ListSnapshots(t.Context(), DefaultTeam, "")
		if err != nil || len(sns) != 0 {
			t.Errorf("snapshots after the failed fork = %+v, %v; want none", sns, err)
		}
		_, body = do("GET", "/v1/quota", "")
		var qu api.QuotaUsage
		if err := json.Unmarshal(body, &qu); err != nil || qu.Used.Sandboxes != 1 {
			t.Errorf("GET /v1/quota = %s (%v), want 1 sandbox used", body, err)
		}
	})
	t.Run("removal fails", func(t *testing.T) {
		wk := &failsNthCreate{n: 3, deleteFails: true}
		_, st, do := lifecycleServer(t, wk)
		parent := mustCreate(t, do)
		code, body := do("POST", "/v1/sandboxes/"+parent.ID+"/fork", `{"count":3}`)
		got := ids(t, st)
		if len(got) != 2 || got[0] != parent.ID {
			t.Fatalf("sandboxes after the failed fork = %q, want the parent and child 1 (its removal failed)", got)
		}
		if code != 503 || !strings.Contains(string(body), "fork 2 of 3") || !strings.Contains(string(body), "remain: "+got[1]) {
			t.Errorf("fork = %d %s, want 503 naming child 2 of 3 and %s as remaining", code, body, got[1])
		}
	})
}

// TestReconcileRemovesChildrenOfUnansweredFork checks what a crash between
// a fork's children leaves (its snapshot still creating, a child made) is
// removed by Reconcile, and that a fork that completed leaves its children
// alone.
func TestReconcileRemovesChildrenOfUnansweredFork(t *testing.T) {
	wk := &failsNthCreate{}
	s, st, do := lifecycleServer(t, wk)
	parent := mustCreate(t, do)
	ctx := t.Context()
	rec, err := st.Sandbox(ctx, DefaultTeam, parent.ID)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	// The steps handleFork takes, up to its first crash point.
	sn, err := s.takeSnapshot(ctx, rec, wk, snapshotOpts{id: store.NewSnapshotID(), fork: true})
	if err != nil {
		t.Fatalf("setup: take the fork's snapshot: %v", err)
	}
	child, err := s.createFrom(ctx, DefaultTeam, sn, nil, nil, false)
	if err != nil {
		t.Fatalf("setup: fork child: %v", err)
	}
	if err := s.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	if got := ids(t, st); !slices.Equal(got, []string{parent.ID}) {
		t.Errorf("sandboxes after Reconcile = %q, want only the parent (child %s removed)", got, child.ID)
	}
	if !slices.Contains(wk.deletes(), child.ID) {
		t.Errorf("worker deletes = %q, want child %s", wk.deletes(), child.ID)
	}
	if sns, err := st.ListSnapshots(ctx, DefaultTeam, ""); err != nil || len(sns) != 0 {
		t.Errorf("snapshots after Reconcile = %+v, %v; want none", sns, err)
	}

	// A fork that answered keeps its children through a Reconcile.
	code, body := do("POST", "/v1/sandboxes/"+parent.ID+"/fork", `{"count":2}`)
	if code != 201 {
		t.Fatalf("fork = %d %s", code, body)
	}
	if err := s.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	if got := ids(t, st); len(got) != 3 {
		t.Errorf("sandboxes after a completed fork and Reconcile = %q, want the parent and 2 children", got)
	}
}

// getSandbox reads sandbox id through the API.
func getSandbox(t *testing.T, do func(method, path, body string) (int, []byte), id string) api.Sandbox {
	t.Helper()
	code, body := do("GET", "/v1/sandboxes/"+id, "")
	var sb api.Sandbox
	if code != 200 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("GET /v1/sandboxes/%s = %d %s", id, code, body)
	}
	return sb
}

// listIDs lists the IDs the API lists for query.
func listIDs(t *testing.T, do func(method, path, body string) (int, []byte), query string) []string {
	t.Helper()
	code, body := do("GET", "/v1/sandboxes"+query, "")
	var l api.SandboxList
	if code != 200 || json.Unmarshal(body, &l) != nil {
		t.Fatalf("GET /v1/sandboxes%s = %d %s", query, code, body)
	}
	var out []string
	for _, sb := range l.Sandboxes {
		out = append(out, sb.ID)
	}
	return out
}

// TestSuspendRoundTrip checks suspend → suspended (its snapshot recorded,
// no VM, no quota use) → resume → running, and that a record an older
// server left stopped with its snapshot in the handle behaves the same.
func TestSuspendRoundTrip(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			wk := &failsNthCreate{}
			_, st, do := lifecycleServer(t, wk)
			sb := mustCreate(t, do)
			code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/suspend", "")
			var got api.Sandbox
			if code != 200 || json.Unmarshal(body, &got) != nil {
				t.Fatalf("suspend = %d %s", code, body)
			}
			if got.State != "suspended" || got.SuspendedSnapshot == "" || got.VM != nil || got.Worker != "" {
				t.Errorf("suspend = %+v, want suspended with its snapshot, no VM, no worker", got)
			}
			if legacy {
				rec, err := st.Sandbox(t.Context(), DefaultTeam, sb.ID)
				if err != nil {
					t.Fatalf("setup: %v", err)
				}
				rec.State = sandbox.Stopped
				rec.Handle = json.RawMessage(fmt.Sprintf(`{"suspended":%q}`, got.SuspendedSnapshot))
				if _, err := st.UpdateSandbox(t.Context(), rec); err != nil {
					t.Fatalf("setup: write an old-style record: %v", err)
				}
			}
			if g := getSandbox(t, do, sb.ID); g.State != "suspended" || g.SuspendedSnapshot != got.SuspendedSnapshot {
				t.Errorf("GET = state %s, snapshot %q; want suspended, %q", g.State, g.SuspendedSnapshot, got.SuspendedSnapshot)
			}
			if l := listIDs(t, do, "?state=suspended"); !slices.Equal(l, []string{sb.ID}) {
				t.Errorf("list state=suspended = %q, want [%s]", l, sb.ID)
			}
			for _, q := range []string{"?state=running", "?state=stopped"} {
				if l := listIDs(t, do, q); len(l) != 0 {
					t.Errorf("list %s = %q, want none", q, l)
				}
			}
			_, body = do("GET", "/v1/quota", "")
			var qu api.QuotaUsage
			if err := json.Unmarshal(body, &qu); err != nil || qu.Used.Sandboxes != 0 {
				t.Errorf("GET /v1/quota while suspended = %s (%v), want none used", body, err)
			}
			code, body = do("POST", "/v1/sandboxes/"+sb.ID+"/resume", "")
			got = api.Sandbox{}
			if code != 200 || json.Unmarshal(body, &got) != nil || got.State != "running" || got.SuspendedSnapshot != "" {
				t.Errorf("resume = %d %s, want running without a suspend snapshot", code, body)
			}
			if sns, err := st.ListSnapshots(t.Context(), DefaultTeam, ""); err != nil || len(sns) != 0 {
				t.Errorf("snapshots after resume = %+v, %v; want none", sns, err)
			}
			// Suspended again, a delete takes its snapshot too.
			if code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/suspend", ""); code != 200 {
				t.Fatalf("suspend again = %d %s", code, body)
			}
			if code, body := do("DELETE", "/v1/sandboxes/"+sb.ID, ""); code != 204 {
				t.Errorf("DELETE a suspended sandbox = %d %s", code, body)
			}
			if sns, err := st.ListSnapshots(t.Context(), DefaultTeam, ""); err != nil || len(sns) != 0 {
				t.Errorf("snapshots after delete = %+v, %v; want none (the suspend snapshot goes with it)", sns, err)
			}
		})
	}
}

// TestCorruptBlobs checks a record whose stored JSON does not decode
// fails what needs it with an internal error naming it, and lists leave
// the others (and it) listed.
func TestCorruptBlobs(t *testing.T) {
	wk := &failsNthCreate{}
	_, st, do := lifecycleServer(t, wk)
	ctx := t.Context()
	good, bad := mustCreate(t, do), mustCreate(t, do)
	code, body := do("POST", "/v1/sandboxes/"+good.ID+"/snapshots", `{"name":"snap"}`)
	var snap api.Snapshot
	if code != 201 || json.Unmarshal(body, &snap) != nil {
		t.Fatalf("setup: snapshot = %d %s", code, body)
	}
	sn, err := st.Snapshot(ctx, DefaultTeam, snap.ID)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	sn.Meta = json.RawMessage(`{"spec":"not an object"}`)
	if _, err := st.UpdateSnapshot(ctx, sn); err != nil {
		t.Fatalf("setup: %v", err)
	}
	code, body = do("POST", "/v1/sandboxes", `{"from_snapshot":"snap"}`)
	if code != 500 || !strings.Contains(string(body), "snapshot "+snap.ID+": stored metadata") {
		t.Errorf("create from a snapshot with corrupt metadata = %d %s, want 500 naming it", code, body)
	}
	if got := ids(t, st); len(got) != 2 {
		t.Errorf("sandboxes after the failed create = %q, want the 2 there were", got)
	}
	code, body = do("GET", "/v1/snapshots", "")
	if code != 200 || !strings.Contains(string(body), snap.ID) {
		t.Errorf("GET /v1/snapshots = %d %s, want it listed", code, body)
	}

	rec, err := st.Sandbox(ctx, DefaultTeam, bad.ID)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	rec.Spec = json.RawMessage(`{"vcpus":"many"}`)
	if _, err := st.UpdateSandbox(ctx, rec); err != nil {
		t.Fatalf("setup: %v", err)
	}
	code, body = do("GET", "/v1/sandboxes/"+bad.ID, "")
	if code != 500 || !strings.Contains(string(body), "sandbox "+bad.ID+": stored spec") {
		t.Errorf("GET a sandbox with a corrupt spec = %d %s, want 500 naming it", code, body)
	}
	if l := listIDs(t, do, ""); len(l) != 2 {
		t.Errorf("list = %q, want both listed", l)
	}
}

// adminCaller bootstraps s and returns a func that calls its API with
// the admin key, answering the status and body.
func adminCaller(t *testing.T, s *Server) func(method, path, body string) (int, []byte) {
	t.Helper()
	admin, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	h := s.Handler()
	return func(method, path, body string) (int, []byte) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+admin)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes()
	}
}

// TestDefaultTimeoutPolicy checks the server-wide timeout defaults: a
// sandbox created without on_timeout gets the server's (suspend: an idle
// fleet leaves memory), one that names it keeps its own, and a bad
// default is refused before the server exists.
func TestDefaultTimeoutPolicy(t *testing.T) {
	l := DefaultLimits
	l.DefaultTTL = 10 * time.Minute
	_, _, do := configuredServer(t, &failsNthCreate{}, Config{Limits: l, DefaultOnTimeout: onTimeoutSuspend})
	before := time.Now()
	sb := mustCreate(t, do)
	if sb.OnTimeout != onTimeoutSuspend || sb.ExpiresAt == nil ||
		sb.ExpiresAt.Before(before.Add(9*time.Minute)) || sb.ExpiresAt.After(time.Now().Add(11*time.Minute)) {
		t.Errorf("create {} = on_timeout %q, expires %v; want suspend in 10m", sb.OnTimeout, sb.ExpiresAt)
	}
	code, body := do("POST", "/v1/sandboxes", `{"on_timeout":"delete","timeout_seconds":60}`)
	var own api.Sandbox
	if code != 201 || json.Unmarshal(body, &own) != nil || own.OnTimeout != onTimeoutDelete {
		t.Errorf("create with on_timeout delete = %d %s, want its own on_timeout", code, body)
	}
	for _, bad := range []Config{
		{DefaultOnTimeout: "later"},
		{Limits: Limits{DefaultTTL: time.Millisecond, MaxTTL: time.Hour, DefaultVCPUs: 1}},
		{Limits: Limits{DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour, DefaultVCPUs: 1}},
	} {
		bad.Store, bad.Templates = nil, []string{"default"}
		st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		bad.Store = st
		if _, err := New(bad); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(on_timeout %q, timeout %v) = %v, want invalid argument", bad.DefaultOnTimeout, bad.Limits.DefaultTTL, err)
		}
		st.Close()
	}
}

// TestSetTimeout checks POST .../timeout: it moves the expiry to the
// time given from now, sooner or later; a suspended sandbox that suspends
// on its timeout keeps no expiry but takes the new idle time at its
// resume; bad values and unknown sandboxes change nothing.
func TestSetTimeout(t *testing.T) {
	_, _, do := lifecycleServer(t, &failsNthCreate{})
	sb := mustCreate(t, do)
	for _, secs := range []int64{7200, 30} {
		before := time.Now()
		code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/timeout", fmt.Sprintf(`{"timeout_seconds":%d}`, secs))
		var got api.Sandbox
		if code != 200 || json.Unmarshal(body, &got) != nil || got.ExpiresAt == nil {
			t.Fatalf("timeout %d = %d %s", secs, code, body)
		}
		want := time.Duration(secs) * time.Second
		if got.ExpiresAt.Before(before.Add(want-time.Second)) || got.ExpiresAt.After(time.Now().Add(want+time.Second)) {
			t.Errorf("timeout %d: expires %v, want %v from now", secs, got.ExpiresAt, want)
		}
	}
	kept := getSandbox(t, do, sb.ID).ExpiresAt
	for _, bad := range []string{`{"timeout_seconds":0}`, `{"timeout_seconds":604801}`, `{"timeout":5}`, `nope`} {
		if code, body := do("POST", "/v1/sandboxes/"+sb.ID+"/timeout", bad); code != 400 {
			t.Errorf("timeout %s = %d %s, want 400", bad, code, body)
		}
	}
	if now := getSandbox(t, do, sb.ID).ExpiresAt; now == nil || !now.Equal(*kept) {
		t.Errorf("after refused timeouts expires %v, want %v unchanged", now, kept)
	}
	if code, body := do("POST", "/v1/sandboxes/sbx_nosuchsandboxxxxxxxx/timeout", `{"timeout_seconds":5}`); code != 404 {
		t.Errorf("timeout of an unknown sandbox = %d %s, want 404", code, body)
	}

	code, body := do("POST", "/v1/sandboxes", `{"on_timeout":"suspend","timeout_seconds":60}`)
	var idle api.Sandbox
	if code != 201 || json.Unmarshal(body, &idle) != nil {
		t.Fatalf("setup: create = %d %s", code, body)
	}
	if code, body := do("POST", "/v1/sandboxes/"+idle.ID+"/suspend", ""); code != 200 {
		t.Fatalf("setup: suspend = %d %s", code, body)
	}
	code, body = do("POST", "/v1/sandboxes/"+idle.ID+"/timeout", `{"timeout_seconds":3600}`)
	var got api.Sandbox
	if code != 200 || json.Unmarshal(body, &got) != nil || got.ExpiresAt != nil {
		t.Errorf("timeout of a suspended idle sandbox = %d %s, want no expiry", code, body)
	}
	code, body = do("POST", "/v1/sandboxes/"+idle.ID+"/resume", "")
	if code != 200 || json.Unmarshal(body, &got) != nil || got.ExpiresAt == nil || got.ExpiresAt.Before(time.Now().Add(59*time.Minute)) {
		t.Errorf("resume = %d %s, want an idle time of the new hour", code, body)
	}
}

// TestShortTimeoutReapedOnTime: a sandbox goes at its expiry, not at the
// reaper's next regular round: created with a 1 s timeout, or given one,
// it is deleted within a few seconds although rounds are a minute apart.
func TestShortTimeoutReapedOnTime(t *testing.T) {
	s, st, do := configuredServer(t, &failsNthCreate{}, Config{ReapInterval: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 10*time.Second, s.Leading)

	code, body := do("POST", "/v1/sandboxes", `{"timeout_seconds":1}`)
	var short api.Sandbox
	if code != 201 || json.Unmarshal(body, &short) != nil {
		t.Fatalf("setup: create = %d %s", code, body)
	}
	later := mustCreate(t, do)
	if code, body := do("POST", "/v1/sandboxes/"+later.ID+"/timeout", `{"timeout_seconds":1}`); code != 200 {
		t.Fatalf("setup: timeout = %d %s", code, body)
	}
	kept := mustCreate(t, do)
	start := time.Now()
	testenv.Eventually(t, 5*time.Second, func() bool {
		return slices.Equal(ids(t, st), []string{kept.ID})
	})
	t.Logf("both gone %v after their 1 s timeouts were set", time.Since(start).Round(10*time.Millisecond))
}
