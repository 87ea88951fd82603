package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"space/api"
	"space/internal/audit"
	"space/internal/dataplane"
	"space/internal/secrets"
	"space/internal/store"
	"space/internal/store/sqlite"
)

// auditServer is a server on a SQLite file (its path is returned, for
// tampering) with a secrets box, a worker that runs everything, and the
// admin key's secret.
type auditServer struct {
	s     *Server
	st    store.Store
	path  string
	admin string
	reg   *prometheus.Registry
}

func newAuditServer(t *testing.T, wrap func(store.Store) store.Store, workerToken string) *auditServer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "space.db")
	st, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	box, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), "secrets.key"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var cst store.Store = st
	if wrap != nil {
		cst = wrap(st)
	}
	reg := prometheus.NewRegistry()
	s, err := New(Config{Store: cst, Templates: []string{"default"}, Secrets: box, Metrics: reg, WorkerToken: workerToken})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	wk := &failsNthCreate{}
	s.AddWorker(wk)
	s.mu.Lock()
	s.seen[wk.ID()] = time.Now().Add(time.Hour)
	s.mu.Unlock()
	admin, err := s.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return &auditServer{s: s, st: st, path: path, admin: admin, reg: reg}
}

// do sends a request with key (none if "") and header pairs.
func (a *auditServer) do(key, method, path, body string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	a.s.Handler().ServeHTTP(rec, req)
	return rec
}

func (a *auditServer) entries(t *testing.T) []store.AuditEntry {
	t.Helper()
	es, err := a.st.ListAudit(t.Context(), store.AuditQuery{})
	if err != nil {
		t.Fatalf("ListAudit() = %v", err)
	}
	return es
}

// export fetches the whole log as NDJSON with the admin key.
func (a *auditServer) export(t *testing.T, header ...string) []byte {
	t.Helper()
	path := "/v1/audit?format=ndjson"
	if len(header) > 0 {
		path = "/v1/audit"
	}
	rec := a.do(a.admin, "GET", path, "", header...)
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("GET %s = %d %s (%s), want 200 NDJSON", path, rec.Code, rec.Body, rec.Header().Get("Content-Type"))
	}
	return rec.Body.Bytes()
}

// verifyExport checks an NDJSON export as `space audit verify` does.
func verifyExport(t *testing.T, b []byte) (audit.Result, error) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(b))
	if !sc.Scan() {
		t.Fatalf("export is empty, want its anchor line")
	}
	var head api.AuditExportHead
	if err := json.Unmarshal(sc.Bytes(), &head); err != nil {
		t.Fatalf("export's first line %s: %v", sc.Bytes(), err)
	}
	anchor, err := audit.AnchorFromAPI(head.Anchor)
	if err != nil {
		t.Fatalf("export's anchor: %v", err)
	}
	v := audit.NewVerifier(anchor)
	for sc.Scan() {
		var e api.AuditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("export line %s: %v", sc.Bytes(), err)
		}
		se, err := audit.FromAPI(e)
		if err != nil {
			t.Fatalf("export line %s: %v", sc.Bytes(), err)
		}
		v.Add(se)
	}
	return v.Result()
}

// entryView is what TestAuditRecords compares of an entry.
type entryView struct {
	KeyID, TeamID, Method, Route string
	Targets                      map[string]string
	Code                         int
	Outcome                      string
}

// TestAuditRecords drives the API and checks what the audit log holds:
// mutating calls with their key, team, route template, targets and
// status; refused authentication (401) and authorisation (403) whatever
// the method; no GET; never a secret, a key or a body; and a chain that
// verifies from an export until a row is edited in the database.
func TestAuditRecords(t *testing.T) {
	ctx := t.Context()
	a := newAuditServer(t, nil, "")
	keys, err := a.st.ListAPIKeys(ctx, DefaultTeam)
	if err != nil || len(keys) != 1 {
		t.Fatalf("setup: ListAPIKeys = %v, %v", keys, err)
	}
	adminID := keys[0].ID

	// Reads leave no trace.
	for _, p := range []string{"/v1/sandboxes", "/v1/health", "/v1/secrets", "/v1/quota"} {
		if rec := a.do(a.admin, "GET", p, ""); rec.Code != 200 {
			t.Fatalf("setup: GET %s = %d %s", p, rec.Code, rec.Body)
		}
	}
	if es := a.entries(t); len(es) != 0 {
		t.Errorf("audit log after GETs = %+v, want empty", es)
	}

	rec := a.do(a.admin, "POST", "/v1/sandboxes", `{}`, "X-Request-Id", "my-request-1")
	var sb api.Sandbox
	if rec.Code != 201 || json.Unmarshal(rec.Body.Bytes(), &sb) != nil {
		t.Fatalf("setup: POST /v1/sandboxes = %d %s", rec.Code, rec.Body)
	}
	if rec := a.do(a.admin, "DELETE", "/v1/sandboxes/"+sb.ID, ""); rec.Code != 204 {
		t.Fatalf("setup: DELETE = %d %s", rec.Code, rec.Body)
	}
	canary := "hunter2-canary"
	b64 := base64.StdEncoding.EncodeToString([]byte(canary))
	if rec := a.do(a.admin, "POST", "/v1/secrets", fmt.Sprintf(`{"name":"canary","value":%q,"hosts":["api.example.com"]}`, b64)); rec.Code != 201 {
		t.Fatalf("setup: POST /v1/secrets = %d %s", rec.Code, rec.Body)
	}
	if rec := a.do("sk_wrong-key-canary", "POST", "/v1/sandboxes", `{}`); rec.Code != 401 {
		t.Fatalf("setup: POST with a bad key = %d, want 401", rec.Code)
	}
	if rec := a.do("", "GET", "/v1/sandboxes", ""); rec.Code != 401 {
		t.Fatalf("setup: GET without a key = %d, want 401", rec.Code)
	}
	rec = a.do(a.admin, "POST", "/v1/apikeys", `{"name":"user"}`)
	var user api.APIKey
	if rec.Code != 201 || json.Unmarshal(rec.Body.Bytes(), &user) != nil {
		t.Fatalf("setup: POST /v1/apikeys = %d %s", rec.Code, rec.Body)
	}
	if rec := a.do(user.Secret, "GET", "/v1/audit", ""); rec.Code != 403 {
		t.Errorf("GET /v1/audit with a key that is not an admin's = %d %s, want 403", rec.Code, rec.Body)
	}
	if rec := a.do(a.admin, "DELETE", "/v1/snapshots/snp_nosuch", ""); rec.Code != 404 {
		t.Fatalf("setup: DELETE an unknown snapshot = %d, want 404", rec.Code)
	}

	got := a.entries(t)
	want := []entryView{
		{adminID, DefaultTeam, "POST", "/v1/sandboxes", map[string]string{"created": sb.ID}, 201, "ok"},
		{adminID, DefaultTeam, "DELETE", "/v1/sandboxes/{id}", map[string]string{"id": sb.ID}, 204, "ok"},
		{adminID, DefaultTeam, "POST", "/v1/secrets", map[string]string{"created": "canary"}, 201, "ok"},
		{"", "", "POST", "/v1/sandboxes", nil, 401, "unauthenticated"},
		{"", "", "GET", "/v1/sandboxes", nil, 401, "unauthenticated"},
		{adminID, DefaultTeam, "POST", "/v1/apikeys", map[string]string{"created": user.ID}, 201, "ok"},
		{user.ID, DefaultTeam, "GET", "/v1/audit", nil, 403, "refused"},
		{adminID, DefaultTeam, "DELETE", "/v1/snapshots/{sid}", map[string]string{"sid": "snp_nosuch"}, 404, "failed"},
	}
	var views []entryView
	for _, e := range got {
		views = append(views, entryView{e.KeyID, e.TeamID, e.Method, e.Route, e.Targets, e.Code, e.Outcome})
		if e.RequestID == "" || e.Source != "192.0.2.1:1234" {
			t.Errorf("entry %d: request id %q, source %q; want an ID and httptest's address", e.Seq, e.RequestID, e.Source)
		}
	}
	if diff := cmp.Diff(want, views); diff != "" {
		t.Errorf("audit log (-want +got):\n%s", diff)
	}
	if len(got) > 0 && got[0].RequestID != "my-request-1" {
		t.Errorf("first entry's request id = %q, want the client's my-request-1", got[0].RequestID)
	}

	// The export carries every entry, hashes in hex, and verifies.
	export := a.export(t)
	if got2 := a.export(t, "Accept", "application/x-ndjson"); !bytes.Equal(got2[:bytes.IndexByte(got2, '\n')], export[:bytes.IndexByte(export, '\n')]) {
		t.Errorf("export by Accept starts %q, want %q", got2[:bytes.IndexByte(got2, '\n')], export[:bytes.IndexByte(export, '\n')])
	}
	r, err := verifyExport(t, export)
	// The exports were GETs: not recorded.
	if err != nil || r.Entries != int64(len(want)) || r.First != 1 || r.Last != int64(len(want)) {
		t.Errorf("verify(export) = %+v, %v; want %d entries intact", r, err, len(want))
	}

	// No secret, key secret or body anywhere.
	var dump bytes.Buffer
	for _, e := range a.entries(t) {
		fmt.Fprintf(&dump, "%+v\n", e)
	}
	for _, where := range []struct {
		name string
		b    []byte
	}{{"audit table", dump.Bytes()}, {"export", export}} {
		for _, secret := range []string{canary, b64, "wrong-key-canary", a.admin, user.Secret, "api.example.com"} {
			if bytes.Contains(where.b, []byte(secret)) {
				t.Errorf("%s holds %q:\n%s", where.name, secret, where.b)
			}
		}
	}

	// One row edited in the database: the export no longer verifies, and
	// names it.
	db, err := sql.Open("sqlite", a.path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `UPDATE audit_log SET code = 200, outcome = 'ok' WHERE seq = 7`); err != nil {
		t.Fatalf("setup: UPDATE: %v", err)
	}
	if _, err := verifyExport(t, a.export(t)); !errors.Is(err, audit.ErrBroken) || !strings.HasPrefix(err.Error(), "seq 7:") {
		t.Errorf("verify(export after an UPDATE of seq 7) = %v, want %v naming seq 7", err, audit.ErrBroken)
	}
}

// TestAuditList checks GET /v1/audit's pages, filters and bad queries.
func TestAuditList(t *testing.T) {
	a := newAuditServer(t, nil, "")
	for i := range 5 {
		if rec := a.do(a.admin, "POST", "/v1/apikeys", fmt.Sprintf(`{"name":"k%d","team":"t%d"}`, i, i%2)); rec.Code != 201 {
			t.Fatalf("setup: POST /v1/apikeys = %d %s", rec.Code, rec.Body)
		}
	}
	list := func(query string) api.AuditList {
		t.Helper()
		rec := a.do(a.admin, "GET", "/v1/audit"+query, "")
		var l api.AuditList
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &l) != nil {
			t.Fatalf("GET /v1/audit%s = %d %s", query, rec.Code, rec.Body)
		}
		return l
	}
	seqsOf := func(l api.AuditList) []int64 {
		out := []int64{}
		for _, e := range l.Entries {
			out = append(out, e.Seq)
		}
		return out
	}
	for _, c := range []struct {
		query string
		want  []int64
		next  int64
	}{
		{"", []int64{1, 2, 3, 4, 5}, 0},
		{"?limit=2", []int64{1, 2}, 2},
		{"?limit=2&after=2", []int64{3, 4}, 4},
		{"?limit=2&after=4", []int64{5}, 0},
		{"?limit=5", []int64{1, 2, 3, 4, 5}, 0},
		{"?team=" + DefaultTeam + "&after=3", []int64{4, 5}, 0},
		{"?team=nosuch", []int64{}, 0},
		{"?since=" + time.Now().Add(time.Hour).UTC().Format(time.RFC3339), []int64{}, 0},
		{"?until=" + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + "&since=2020-01-01T00:00:00Z", []int64{1, 2, 3, 4, 5}, 0},
	} {
		l := list(c.query)
		if diff := cmp.Diff(c.want, seqsOf(l)); diff != "" || l.Next != c.next {
			t.Errorf("GET /v1/audit%s = seqs %v next %d, want %v next %d", c.query, seqsOf(l), l.Next, c.want, c.next)
		}
	}
	l := list("?limit=1")
	if e := l.Entries[0]; len(e.Hash) != 64 || e.Prev != "" || e.Route != "/v1/apikeys" || e.Targets["created"] == "" {
		t.Errorf("first entry = %+v, want a 64-digit hash, no prev, route /v1/apikeys, the created key", e)
	}
	if l.Anchor.Seq != 0 || l.Anchor.Hash != "" || l.Anchor.Time != nil {
		t.Errorf("anchor = %+v, want the zero anchor", l.Anchor)
	}
	for _, c := range []struct{ query, field string }{
		{"?limit=0", "limit"}, {"?limit=1001", "limit"}, {"?limit=x", "limit"},
		{"?after=-1", "after"}, {"?since=yesterday", "since"}, {"?until=2026-13-01T00:00:00Z", "until"},
		{"?team=a/b", "team"}, {"?format=xml", "format"},
	} {
		rec := a.do(a.admin, "GET", "/v1/audit"+c.query, "")
		var e api.Error
		if rec.Code != 400 || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Field != c.field {
			t.Errorf("GET /v1/audit%s = %d %s, want 400 naming %s", c.query, rec.Code, rec.Body, c.field)
		}
	}
}

// TestAuditPrune checks the leader's pruning keeps the rest verifiable
// from the anchor, and that a negative retention keeps everything.
func TestAuditPrune(t *testing.T) {
	a := newAuditServer(t, nil, "")
	for i := range 3 {
		if rec := a.do(a.admin, "POST", "/v1/apikeys", fmt.Sprintf(`{"name":"k%d"}`, i)); rec.Code != 201 {
			t.Fatalf("setup: POST /v1/apikeys = %d %s", rec.Code, rec.Body)
		}
	}
	a.s.cfg.AuditRetention = -1
	a.s.now = func() time.Time { return time.Now().Add(1000 * 24 * time.Hour) }
	a.s.pruneAudit(t.Context())
	if es := a.entries(t); len(es) != 3 {
		t.Errorf("entries after pruning with retention for ever = %d, want 3", len(es))
	}
	a.s.cfg.AuditRetention = DefaultAuditRetention
	a.s.pruneAudit(t.Context())
	if es := a.entries(t); len(es) != 0 {
		t.Errorf("entries after pruning past the retention = %d, want 0", len(es))
	}
	if rec := a.do(a.admin, "POST", "/v1/apikeys", `{"name":"after"}`); rec.Code != 201 {
		t.Fatalf("setup: POST /v1/apikeys = %d %s", rec.Code, rec.Body)
	}
	r, err := verifyExport(t, a.export(t))
	if err != nil || r.Anchor.Seq != 3 || r.First != 4 || r.Last != 4 {
		t.Errorf("verify(export after a prune) = %+v, %v; want entry 4 from anchor 3", r, err)
	}
}

// failingAudit is a store whose audit appends fail.
type failingAudit struct{ store.Store }

func (failingAudit) AppendAudit(context.Context, store.AuditEntry) (store.AuditEntry, error) {
	return store.AuditEntry{}, errors.New("disk on fire")
}

// TestAuditWriteFailure checks a failed append leaves the answer alone
// and is counted.
func TestAuditWriteFailure(t *testing.T) {
	a := newAuditServer(t, func(st store.Store) store.Store { return failingAudit{st} }, "")
	rec := a.do(a.admin, "POST", "/v1/apikeys", `{"name":"k"}`)
	if rec.Code != 201 {
		t.Errorf("POST /v1/apikeys with the audit log failing = %d %s, want 201", rec.Code, rec.Body)
	}
	a.do("", "DELETE", "/v1/apikeys/key_x", "")
	if got := testutil.ToFloat64(a.s.auditor.errors); got != 2 {
		t.Errorf("space_audit_write_errors_total = %v, want 2", got)
	}
}

// TestAuditDataPlane checks the calls made with a data-plane token are
// recorded as those made with a key: by route template, with the
// token's team.
func TestAuditDataPlane(t *testing.T) {
	a := newAuditServer(t, nil, testWorkerToken)
	rec := a.do(a.admin, "POST", "/v1/sandboxes", `{}`)
	var sb api.Sandbox
	if rec.Code != 201 || json.Unmarshal(rec.Body.Bytes(), &sb) != nil || sb.DataPlane == nil {
		t.Fatalf("setup: POST /v1/sandboxes = %d %s, want a sandbox with a data plane", rec.Code, rec.Body)
	}
	before := len(a.entries(t))
	tok := sb.DataPlane.Token
	a.do(tok, "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/etc/hostname", "")
	a.do(tok, "POST", "/v1/sandboxes/"+sb.ID+"/processes/7/signal", `{"signal":"SIGTERM"}`)
	bad := a.do(dataplane.TokenPrefix+"forged", "DELETE", "/v1/sandboxes/"+sb.ID+"/files?path=/x", "")
	if bad.Code != 401 {
		t.Fatalf("setup: DELETE with a forged token = %d, want 401", bad.Code)
	}
	var views []entryView
	for _, e := range a.entries(t)[before:] {
		views = append(views, entryView{e.KeyID, e.TeamID, e.Method, e.Route, e.Targets, e.Code, e.Outcome})
	}
	want := []entryView{
		{"", DefaultTeam, "POST", "/v1/sandboxes/{id}/processes/{pid}/signal", map[string]string{"id": sb.ID, "pid": "7"}, 0, ""},
		{"", "", "DELETE", "/v1/sandboxes/{id}/files", map[string]string{"id": sb.ID}, 401, "unauthenticated"},
	}
	if len(views) == 2 { // the worker's answer to the signal is its own
		want[0].Code, want[0].Outcome = views[0].Code, views[0].Outcome
	}
	if diff := cmp.Diff(want, views); diff != "" {
		t.Errorf("audit log of data-plane calls (-want +got):\n%s", diff)
	}
}
