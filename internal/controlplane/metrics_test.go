package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"space/api"
	"space/internal/metricstest"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/testenv"
	"space/internal/workerproto"
)

// scrapeURL serves reg's metrics as the server process does and returns
// their URL.
func scrapeURL(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// TestAPIMetrics drives the API and reads the metrics back through the
// exposition format: requests are counted and timed by their route's
// template (never a path, so never a sandbox ID), unknown routes and
// methods fall into bounded labels, sandboxes are counted by state, and
// the lint finds nothing.
func TestAPIMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _, do := configuredServer(t, &failsNthCreate{}, Config{Metrics: reg})
	sb := mustCreate(t, do)
	mustCreate(t, do)
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/v1/sandboxes/" + sb.ID, 200},
		{"GET", "/v1/sandboxes/" + sb.ID, 200},
		{"GET", "/v1/sandboxes/sbx_00000000000000000000000000", 404},
		{"DELETE", "/v1/sandboxes/" + sb.ID, 204},
		{"GET", "/v1/no/such/route/sbx_" + sb.ID, 404},
		{"PATCH", "/v1/sandboxes/" + sb.ID, 405},
		{"BREW", "/v1/sandboxes/" + sb.ID, 405},
	} {
		if code, body := do(c.method, c.path, ""); code != c.want {
			t.Fatalf("setup: %s %s = %d %s, want %d", c.method, c.path, code, body, c.want)
		}
	}
	// Refused without a key: counted too.
	unauth := httptest.NewRecorder()
	s.Handler().ServeHTTP(unauth, httptest.NewRequest("GET", "/v1/sandboxes", nil))
	if unauth.Code != 401 {
		t.Fatalf("setup: GET /v1/sandboxes without a key = %d, want 401", unauth.Code)
	}
	fams := metricstest.Scrape(t, scrapeURL(t, reg))

	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"route": "/v1/sandboxes", "method": "POST", "code": "201"}, 2},
		{map[string]string{"route": "/v1/sandboxes/{id}", "method": "GET", "code": "200"}, 2},
		{map[string]string{"route": "/v1/sandboxes/{id}", "method": "GET", "code": "404"}, 1},
		{map[string]string{"route": "/v1/sandboxes/{id}", "method": "DELETE", "code": "204"}, 1},
		{map[string]string{"route": "/v1/sandboxes/{id}", "method": "PATCH", "code": "405"}, 1},
		{map[string]string{"route": "/v1/sandboxes/{id}", "method": "other", "code": "405"}, 1},
		{map[string]string{"route": "other", "method": "GET", "code": "404"}, 1},
		{map[string]string{"route": "/v1/sandboxes", "method": "GET", "code": "401"}, 1},
	} {
		if got, _ := fams.Value("space_api_requests_total", c.labels); got != c.want {
			t.Errorf("space_api_requests_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
	if got, _ := fams.Value("space_api_request_duration_seconds", map[string]string{"route": "/v1/sandboxes/{id}", "method": "GET"}); got != 3 {
		t.Errorf("space_api_request_duration_seconds{/v1/sandboxes/{id},GET} count = %v, want 3", got)
	}
	// The store says: one running (the other was deleted, its record
	// gone), and every other state 0.
	for state, want := range map[string]float64{"running": 1, "creating": 0, "failed": 0, "suspended": 0} {
		if got, ok := fams.Value("space_sandboxes", map[string]string{"state": state}); !ok || got != want {
			t.Errorf("space_sandboxes{state=%q} = %v (present %v), want %v", state, got, ok, want)
		}
	}
	if _, ok := fams.Value("space_sandboxes", map[string]string{"state": "deleted"}); ok {
		t.Errorf("space_sandboxes{state=deleted} is reported; tombstones are not sandboxes")
	}
	for _, l := range fams.Labels() {
		if strings.Contains(l, "sbx_") || strings.Contains(l, sb.ID) {
			t.Errorf("label %q carries a sandbox ID", l)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint() = %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestInstrumentKeepsUpgradesAndStreams checks that a handler behind the
// metrics' ResponseWriter still upgrades to a WebSocket (it hijacks the
// connection) and still streams (it flushes and reads while it writes,
// through http.ResponseController), and that both are counted.
func TestInstrumentKeepsUpgradesAndStreams(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, noSandboxes{})
	if err != nil {
		t.Fatalf("newMetrics() = %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /ws", m.instrument("/ws", "GET", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return // Accept answered the client
		}
		defer c.CloseNow()
		typ, b, err := c.Read(r.Context())
		if err != nil {
			return
		}
		c.Write(r.Context(), typ, b)
		c.Close(websocket.StatusNormalClosure, "")
	})))
	mux.Handle("POST /stream", m.instrument("/stream", "POST", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			http.Error(w, "full duplex: "+err.Error(), 500)
			return
		}
		w.Write([]byte("first\n"))
		if err := rc.Flush(); err != nil {
			http.Error(w, "flush: "+err.Error(), 500)
			return
		}
		if _, ok := w.(http.Flusher); !ok {
			http.Error(w, "no http.Flusher", 500)
			return
		}
		b := make([]byte, 5)
		n, _ := r.Body.Read(b)
		w.Write(b[:n])
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx := t.Context()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", nil)
	if err != nil {
		t.Fatalf("websocket.Dial() = %v", err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatalf("Write() = %v", err)
	}
	if _, b, err := c.Read(ctx); err != nil || string(b) != "ping" {
		t.Errorf("Read() = %q, %v; want the echo", b, err)
	}
	c.Close(websocket.StatusNormalClosure, "")

	resp, err := http.Post(srv.URL+"/stream", "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatalf("POST /stream = %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "first\nhello" {
		t.Errorf("POST /stream = %d %q, want 200 \"first\\nhello\"", resp.StatusCode, body)
	}

	// A handler is counted once it returns, which may be after its client
	// saw the end of the answer (the WebSocket's close handshake, the
	// stream's last byte): wait for both.
	url := scrapeURL(t, reg)
	want := []map[string]string{
		{"route": "/ws", "method": "GET", "code": "101"},
		{"route": "/stream", "method": "POST", "code": "200"},
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		fams := metricstest.Scrape(t, url)
		for _, c := range want {
			if got, _ := fams.Value("space_api_requests_total", c); got != 1 {
				return false
			}
		}
		return true
	})
}

// noSandboxes is a store with no sandboxes.
type noSandboxes struct{}

func (noSandboxes) CountSandboxes(context.Context) (map[store.SandboxState]int, error) {
	return nil, nil
}

// BenchmarkInstrument measures what the metrics add to a request: a
// status recorder, a counter increment and a histogram observation.
func BenchmarkInstrument(b *testing.B) {
	m, err := newMetrics(prometheus.NewRegistry(), noSandboxes{})
	if err != nil {
		b.Fatalf("newMetrics() = %v", err)
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", bare},
		{"instrumented", m.instrument("/v1/sandboxes/{id}", "GET", bare)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", "/v1/sandboxes/x", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				bc.h.ServeHTTP(w, req)
			}
		})
	}
}

// TestOperationMetrics drives every sandbox operation through the API
// and reads back their times by op and outcome, the quota's and the
// placement's refusals by limit and reason, the claims held and lost,
// and the workers by health; then checks that the lint finds nothing.
func TestOperationMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _, do := configuredServer(t, &failsNthCreate{}, Config{Metrics: reg})
	parent := mustCreate(t, do)
	sb := "/v1/sandboxes/" + parent.ID
	var snap api.Snapshot
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", sb + "/pause", "", 200},
		{"POST", sb + "/resume", "", 200},
		{"POST", sb + "/snapshots", `{"name":"snap"}`, 201},
		{"POST", sb + "/checkpoints", "", 201},
		{"POST", sb + "/restore", `{"snapshot":"snap"}`, 200},
		{"POST", sb + "/fork", `{"count":1}`, 201},
		{"POST", sb + "/suspend", "", 200},
		{"POST", sb + "/resume", "", 200},
		{"POST", sb + "/restore", `{"snapshot":"nosuch"}`, 404},
		{"PUT", "/v1/quota", `{"sandboxes":2}`, 200},
		{"POST", "/v1/sandboxes", `{}`, 429}, // the parent and its fork
		{"DELETE", sb, "", 204},
	} {
		code, body := do(c.method, c.path, c.body)
		if code != c.want {
			t.Fatalf("setup: %s %s %s = %d %s, want %d", c.method, c.path, c.body, code, body, c.want)
		}
		if c.path == sb+"/snapshots" {
			json.Unmarshal(body, &snap)
		}
	}
	// Placement: no worker at all, and none with room.
	if _, err := s.place(t.Context(), nil, workerproto.Spec{VCPUs: 1, MemoryMiB: 256}, placement{}); err == nil {
		t.Fatalf("setup: place() on no workers = nil error")
	}
	if _, err := s.place(t.Context(), s.healthyWorkers(), workerproto.Spec{VCPUs: 1 << 21, MemoryMiB: 256}, placement{}); err == nil {
		t.Fatalf("setup: place() of 2^21 vcpus = nil error")
	}
	// A claim held, and one lost.
	_, release, err := s.claim(t.Context(), "metrics-test")
	if err != nil {
		t.Fatalf("setup: claim() = %v", err)
	}
	s.claims.mu.Lock()
	h := s.claims.held["metrics-test"]
	s.claims.mu.Unlock()
	s.claims.lose(h, errors.New("test"))

	fams := metricstest.Scrape(t, scrapeURL(t, reg))
	release()
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"space_sandbox_operation_seconds", map[string]string{"op": "create", "outcome": "ok"}, 2}, // the parent and its fork
		{"space_sandbox_operation_seconds", map[string]string{"op": "create", "outcome": "error"}, 1},
		{"space_sandbox_operation_seconds", map[string]string{"op": "pause", "outcome": "ok"}, 1},
		{"space_sandbox_operation_seconds", map[string]string{"op": "resume", "outcome": "ok"}, 2},   // paused, suspended
		{"space_sandbox_operation_seconds", map[string]string{"op": "snapshot", "outcome": "ok"}, 2}, // the API's, the suspend's
		{"space_sandbox_operation_seconds", map[string]string{"op": "checkpoint", "outcome": "ok"}, 1},
		{"space_sandbox_operation_seconds", map[string]string{"op": "restore", "outcome": "ok"}, 1},
		{"space_sandbox_operation_seconds", map[string]string{"op": "restore", "outcome": "error"}, 1},
		{"space_sandbox_operation_seconds", map[string]string{"op": "fork", "outcome": "ok"}, 1},
		{"space_sandbox_operation_seconds", map[string]string{"op": "suspend", "outcome": "ok"}, 1},
		{"space_sandbox_operation_seconds", map[string]string{"op": "delete", "outcome": "ok"}, 1},
		{"space_quota_refusals_total", map[string]string{"limit": "sandboxes"}, 1},
		{"space_quota_refusals_total", map[string]string{"limit": "memory"}, 0},
		{"space_placement_refusals_total", map[string]string{"reason": "no_worker"}, 1},
		{"space_placement_refusals_total", map[string]string{"reason": "no_capacity"}, 1},
		{"space_placement_refusals_total", map[string]string{"reason": "vmm_mismatch"}, 0},
		{"space_claims_held", nil, 1},
		{"space_claims_lost_total", nil, 1},
		{"space_workers", map[string]string{"health": "healthy"}, 1},
		{"space_workers", map[string]string{"health": "unhealthy"}, 0},
		{"space_leader", nil, 0}, // Run was not called
		{"space_leader_changes_total", nil, 0},
	} {
		if got, ok := fams.Value(c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if err := s.Reconcile(t.Context()); err != nil {
		t.Fatalf("Reconcile() = %v", err)
	}
	fams = metricstest.Scrape(t, scrapeURL(t, reg))
	if got, _ := fams.Value("space_reconcile_runs_total", map[string]string{"outcome": "ok"}); got != 1 {
		t.Errorf("space_reconcile_runs_total{outcome=ok} after a reconcile = %v, want 1", got)
	}
	if got, _ := fams.Value("space_claims_held", nil); got != 0 {
		t.Errorf("space_claims_held after the release = %v, want 0", got)
	}
	for _, l := range fams.Labels() {
		if strings.Contains(l, "sbx_") || strings.Contains(l, "snp_") || strings.Contains(l, snap.ID) {
			t.Errorf("label %q carries an ID", l)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint() = %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestSeriesBounded creates and deletes 1,000 sandboxes and checks that
// the number of series is what it was after the first: no label takes a
// value per sandbox.
func TestSeriesBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, _, do := configuredServer(t, &failsNthCreate{}, Config{Metrics: reg})
	series := func() int {
		t.Helper()
		n := 0
		for _, f := range metricstest.Scrape(t, scrapeURL(t, reg)) {
			n += len(f.GetMetric())
		}
		return n
	}
	cycle := func() {
		t.Helper()
		sb := mustCreate(t, do)
		if code, body := do("GET", "/v1/sandboxes/"+sb.ID, ""); code != 200 {
			t.Fatalf("setup: GET = %d %s", code, body)
		}
		if code, body := do("DELETE", "/v1/sandboxes/"+sb.ID, ""); code != 204 {
			t.Fatalf("setup: DELETE = %d %s", code, body)
		}
	}
	cycle()
	before := series()
	for range 999 {
		cycle()
	}
	if after := series(); after != before {
		t.Errorf("series after 1000 sandboxes = %d, after 1 = %d; want them equal", after, before)
	}
}

// teamCounts is a store that counts sandboxes by team from a map.
type teamCounts map[string]map[store.SandboxState]int

func (c teamCounts) CountSandboxesByTeam(context.Context) (map[string]map[store.SandboxState]int, error) {
	return c, nil
}

// TestTeamSandboxes checks space_team_sandboxes: the teams with the most
// sandboxes by name, the others (and a team called "other") summed as
// "other", every live state reported.
func TestTeamSandboxes(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newTeamsCollector(teamCounts{
		"big":   {sandbox.Running: 5},
		"mid":   {sandbox.Running: 2, sandbox.Paused: 1},
		"small": {sandbox.Running: 1, sandbox.Suspended: 1},
		"other": {sandbox.Running: 1},
		"tiny":  {sandbox.Failed: 1},
	}, 3))
	fams := metricstest.Scrape(t, scrapeURL(t, reg))
	for _, c := range []struct {
		team, state string
		want        float64
	}{
		{"big", "running", 5},
		{"big", "paused", 0},
		{"mid", "paused", 1},
		{"small", "suspended", 1},
		{"other", "running", 1}, // the team called other
		{"other", "failed", 1},  // tiny
	} {
		if got, ok := fams.Value("space_team_sandboxes", map[string]string{"team": c.team, "state": c.state}); !ok || got != c.want {
			t.Errorf("space_team_sandboxes{team=%q,state=%q} = %v (present %v), want %v", c.team, c.state, got, ok, c.want)
		}
	}
	if _, ok := fams.Value("space_team_sandboxes", map[string]string{"team": "tiny"}); ok {
		t.Errorf("team tiny, past the first 3, is reported by name")
	}
	if n := len(fams["space_team_sandboxes"].GetMetric()); n != 4*(len(sandbox.States)-1) {
		t.Errorf("space_team_sandboxes has %d series, want 4 teams times %d states", n, len(sandbox.States)-1)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("GatherAndLint() = %v, %v", problems, err)
	}
}
