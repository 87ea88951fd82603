package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"space/api"
	"space/client"
	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkstoretest"
	"space/internal/chunkstore/local"
	"space/internal/metricstest"
	"space/internal/testenv"
)

// get GETs url with accept (or none) and returns the status, the
// Content-Type and the body.
func get(t *testing.T, url, accept string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// failing is a collector whose every collection fails (a store that is
// down).
type failing struct{ desc *prometheus.Desc }

func (f failing) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }
func (f failing) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(f.desc, errors.New("store is down"))
}

// TestMetricsListener checks the metrics listener: none without an
// address; with one, the Go runtime's and the process's metrics in the
// Prometheus text format by default and in OpenMetrics when the scraper
// asks for it, and still when a collector fails (which is counted);
// nothing but /metrics.
func TestMetricsListener(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	if ml, err := listenMetrics("", newRegistry(), log); ml != nil || err != nil {
		t.Errorf(`listenMetrics("") = %v, %v; want nil, nil`, ml, err)
	}
	reg := newRegistry()
	reg.MustRegister(failing{prometheus.NewDesc("space_test_failing", "Fails.", nil, nil)})
	ml, err := listenMetrics("127.0.0.1:0", reg, log)
	if err != nil {
		t.Fatalf("listenMetrics() = %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { ml.serve(ctx, log); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	fams := metricstest.Scrape(t, ml.url)
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if _, ok := fams.Value(name, nil); !ok {
			t.Errorf("scrape: no %s", name)
		}
	}
	// This scrape's failure is counted in the next one.
	fams = metricstest.Scrape(t, ml.url)
	if got, _ := fams.Value("promhttp_metric_handler_errors_total", map[string]string{"cause": "gathering"}); got < 1 {
		t.Errorf("promhttp_metric_handler_errors_total{cause=gathering} = %v, want at least 1 (a collector failed)", got)
	}
	code, ct, body := get(t, ml.url, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	if code != 200 || !strings.HasPrefix(ct, "application/openmetrics-text") || !strings.HasSuffix(body, "# EOF\n") {
		t.Errorf("GET /metrics asking for OpenMetrics = %d, Content-Type %q, body ending %q; want 200, application/openmetrics-text, # EOF",
			code, ct, body[max(0, len(body)-16):])
	}
	if code, ct, _ := get(t, ml.url, ""); code != 200 || !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics without Accept = %d, Content-Type %q; want 200, text/plain", code, ct)
	}
	if code, _, _ := get(t, strings.TrimSuffix(ml.url, "/metrics")+"/v1/health", ""); code != 404 {
		t.Errorf("GET /v1/health on the metrics listener = %d, want 404", code)
	}
}

// TestServerMetrics runs `space server --metrics-listen` on the fake VMM
// and checks, through a scrape, that the API, the store's count of
// sandboxes and the embedded worker report a sandbox's create and
// delete, that no label carries its ID, and that the API's own port
// serves no metrics.
func TestServerMetrics(t *testing.T) {
	urls := make(chan string, 1)
	ts := startFakeServerWith(t, Config{MetricsListen: "127.0.0.1:0", metricsReady: func(u string) { urls <- u }})
	metrics := <-urls // sent before the API's Ready
	ctx := t.Context()
	sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox() = %v", err)
	}
	if _, err := ts.client.Sandbox(ctx, sb.ID); err != nil {
		t.Fatalf("Sandbox() = %v", err)
	}
	fams := metricstest.Scrape(t, metrics)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"space_api_requests_total", map[string]string{"route": "/v1/sandboxes", "method": "POST", "code": "201"}, 1},
		{"space_api_requests_total", map[string]string{"route": "/v1/sandboxes/{id}", "method": "GET", "code": "200"}, 1},
		{"space_sandboxes", map[string]string{"state": "running"}, 1},
		{"space_worker_vms_running", nil, 1},
		{"space_worker_sandbox_create_seconds", map[string]string{"outcome": "ok"}, 1},
	} {
		if got, _ := fams.Value(c.name, c.labels); got != c.want {
			t.Errorf("after a create: %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := fams.Value(name, nil); !ok {
			t.Errorf("scrape: no %s", name)
		}
	}
	for _, l := range fams.Labels() {
		if strings.Contains(l, "sbx_") {
			t.Errorf("label %q carries a sandbox ID", l)
		}
	}
	if err := ts.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox() = %v", err)
	}
	fams = metricstest.Scrape(t, metrics)
	if got, _ := fams.Value("space_worker_vms_running", nil); got != 0 {
		t.Errorf("after the delete: space_worker_vms_running = %v, want 0", got)
	}
	if got, _ := fams.Value("space_sandboxes", map[string]string{"state": "running"}); got != 0 {
		t.Errorf("after the delete: space_sandboxes{state=running} = %v, want 0", got)
	}
	if code, _, _ := get(t, ts.url+"/metrics", ""); code != 404 {
		t.Errorf("GET /metrics on the API's port = %d, want 404", code)
	}
}

// TestWorkerMetrics runs `space worker --metrics-listen` on the fake VMM
// (with no control plane to register with: it keeps trying) and scrapes
// its metrics.
func TestWorkerMetrics(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // the fake jails its guests
	urls := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunWorker(ctx, WorkerConfig{
			ID: newWorkerID(t), DataDir: newDataDir(t), Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0",
			ControlPlane: "http://127.0.0.1:1", Token: "metrics-test-token-0123456789abcdef", CacheBase: t.TempDir(), VMM: VMMFake,
			metricsReady: func(u string) { urls <- u },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunWorker() = %v", err)
		}
	})
	var url string
	select {
	case url = <-urls:
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("setup: RunWorker() = %v", err)
	case <-time.After(time.Minute):
		t.Fatalf("setup: worker metrics not served in 1m")
	}
	fams := metricstest.Scrape(t, url)
	if got, ok := fams.Value("space_worker_vms_running", nil); !ok || got != 0 {
		t.Errorf("space_worker_vms_running = %v (present %v), want 0", got, ok)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := fams.Value(name, nil); !ok {
			t.Errorf("scrape: no %s", name)
		}
	}
}

// TestWorkerActionMetrics runs `space server` on the fake VMM with a
// pool, a fast agent heartbeat and the per-sandbox families on, drives a
// sandbox (a create the pool serves, an exec, a file written and read, a
// snapshot), and checks, through a scrape and the linter, that the
// worker's metrics moved.
func TestWorkerActionMetrics(t *testing.T) {
	urls := make(chan string, 1)
	ts := startFakeServerWith(t, Config{MetricsListen: "127.0.0.1:0", MetricsPerSandbox: true, Prewarm: true, Pool: 1,
		AgentHeartbeat: 100 * time.Millisecond, AgentTimeout: time.Second, metricsReady: func(u string) { urls <- u }})
	metrics := <-urls
	ctx := t.Context()
	value := func(name string, labels map[string]string) float64 {
		v, _ := metricstest.Scrape(t, metrics).Value(name, labels)
		return v
	}
	testenv.Eventually(t, time.Minute, ts.poolReady)
	if got := value("space_worker_pool_size", nil); got != 1 {
		t.Errorf("space_worker_pool_size with the pool ready = %v, want 1", got)
	}
	sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{})
	if err != nil {
		t.Fatalf("CreateSandbox() = %v", err)
	}
	var out strings.Builder
	if exit, err := ts.client.Exec(ctx, sb.ID, api.Exec{Command: []string{"sh", "-c", "echo hello"}}, &out, io.Discard); err != nil || exit.Code != 0 {
		t.Fatalf("Exec() = %+v, %v", exit, err)
	}
	before := value("space_worker_dataplane_bytes_total", map[string]string{"path": "exec", "direction": "out"})
	var wsOut strings.Builder
	if exit, err := ts.client.ExecStream(ctx, sb.ID, api.Exec{Command: []string{"sh", "-c", "cat"}},
		client.StreamIO{Stdin: strings.NewReader("over the websocket\n"), Stdout: &wsOut}); err != nil || exit.Code != 0 || wsOut.String() != "over the websocket\n" {
		t.Fatalf("ExecStream() = %+v, %v, output %q", exit, err, wsOut.String())
	}
	// Through the hijacked connection: the frames around 19 bytes each way.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return value("space_worker_dataplane_bytes_total", map[string]string{"path": "exec", "direction": "out"}) >= before+19
	})
	if _, err := ts.client.WriteFile(ctx, sb.ID, "/tmp/f", strings.NewReader("some bytes"), client.WriteOptions{}); err != nil {
		t.Fatalf("WriteFile() = %v", err)
	}
	if _, err := ts.client.ReadFile(ctx, sb.ID, "/tmp/f", io.Discard); err != nil {
		t.Fatalf("ReadFile() = %v", err)
	}
	if _, err := ts.client.CreateSnapshot(ctx, sb.ID, "metrics"); err != nil {
		t.Fatalf("CreateSnapshot() = %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return value("space_worker_agent_rtt_seconds", nil) > 0 })

	fams := metricstest.Scrape(t, metrics)
	for _, c := range []struct {
		name    string
		labels  map[string]string
		atLeast float64
	}{
		{"space_worker_pool_hits_total", nil, 1},
		{"space_worker_boot_seconds", nil, 1},                                  // the warm template's capture
		{"space_worker_restore_seconds", map[string]string{"from": "warm"}, 1}, // the pool's members
		{"space_worker_snapshot_pause_seconds", nil, 1},
		{"space_worker_snapshot_stored_bytes", nil, 1},
		{"space_worker_capacity", map[string]string{"resource": "vcpu"}, 1},
		{"space_worker_capacity", map[string]string{"resource": "memory_bytes"}, 1 << 20},
		{"space_worker_committed", map[string]string{"resource": "vcpu"}, 1},
		{"space_worker_committed", map[string]string{"resource": "memory_bytes"}, 1 << 20},
		{"space_worker_vmm_pss_bytes", nil, 1},
		{"space_worker_dataplane_bytes_total", map[string]string{"path": "exec", "direction": "in"}, 1},
		{"space_worker_dataplane_bytes_total", map[string]string{"path": "exec", "direction": "out"}, 6}, // hello\n at least
		{"space_worker_dataplane_bytes_total", map[string]string{"path": "files", "direction": "in"}, 10},
		{"space_worker_dataplane_bytes_total", map[string]string{"path": "files", "direction": "out"}, 10},
		{"space_worker_sandbox_memory_pss_bytes", map[string]string{"sandbox": sb.ID}, 1},
		{"space_worker_sandbox_vcpus", map[string]string{"sandbox": sb.ID}, 1},
	} {
		if got, ok := fams.Value(c.name, c.labels); !ok || got < c.atLeast {
			t.Errorf("%s%v = %v (present %v), want at least %v", c.name, c.labels, got, ok, c.atLeast)
		}
	}
	if _, ok := fams.Value("space_worker_pool_misses_total", nil); !ok {
		t.Errorf("space_worker_pool_misses_total is not reported")
	}
	// Only the opt-in families carry a sandbox ID.
	for name, fam := range fams {
		if name == "space_worker_sandbox_memory_pss_bytes" || name == "space_worker_sandbox_vcpus" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), "sbx_") {
					t.Errorf("%s{%s=%q} carries a sandbox ID", name, lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	_, _, body := get(t, metrics, "")
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("Lint() = %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// Deleted, its per-sandbox series go.
	if err := ts.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox() = %v", err)
	}
	if _, ok := metricstest.Scrape(t, metrics).Value("space_worker_sandbox_vcpus", map[string]string{"sandbox": sb.ID}); ok {
		t.Errorf("space_worker_sandbox_vcpus{sandbox=%s} is reported after its delete", sb.ID)
	}
}

// TestSeriesBoundedOnFakeVMM creates and deletes 200 sandboxes on the
// fake VMM and checks that the server's and its worker's series number
// the same as after the first ten: no label takes a value per sandbox.
func TestSeriesBoundedOnFakeVMM(t *testing.T) {
	urls := make(chan string, 1)
	ts := startFakeServerWith(t, Config{MetricsListen: "127.0.0.1:0", metricsReady: func(u string) { urls <- u }})
	metrics := <-urls
	ctx := t.Context()
	series := func() (n int) {
		for name, f := range metricstest.Scrape(t, metrics) {
			if !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
				n += len(f.GetMetric())
			}
		}
		return n
	}
	cycle := func() {
		t.Helper()
		sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
		if err != nil {
			t.Fatalf("CreateSandbox() = %v", err)
		}
		if _, err := ts.client.Exec(ctx, sb.ID, api.Exec{Command: []string{"true"}}, io.Discard, io.Discard); err != nil {
			t.Fatalf("Exec() = %v", err)
		}
		if err := ts.client.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatalf("DeleteSandbox() = %v", err)
		}
	}
	// The first ones may add a series of their own kind (the first
	// restore from the warm template the first boot captured).
	for range 10 {
		cycle()
	}
	before := series()
	for range 190 {
		cycle()
	}
	if after := series(); after != before {
		t.Errorf("series after 200 sandboxes = %d, after 10 = %d; want them equal", after, before)
	}
}

// TestChunkGCMetrics runs one garbage collection of a chunk store that
// holds a chunk no snapshot uses and checks what it freed and what is
// left.
func TestChunkGCMetrics(t *testing.T) {
	b, err := local.New(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	chunks, err := chunkstore.New(chunkstore.Config{Backend: b})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	junk := []byte("a chunk no manifest names")
	chunkstoretest.Put(t, b, chunkstore.ChunkKey(chunkstore.Sum(junk)), junk)
	reg := prometheus.NewRegistry()
	m, err := newChunkMetrics(reg)
	if err != nil {
		t.Fatalf("newChunkMetrics() = %v", err)
	}
	collectOnce(t.Context(), chunks, m, slog.New(slog.DiscardHandler))
	if got := testutil.ToFloat64(m.freed); got != float64(len(junk)) {
		t.Errorf("space_chunkstore_gc_freed_bytes_total = %v, want %d", got, len(junk))
	}
	if got := testutil.ToFloat64(m.stored); got != 0 {
		t.Errorf("space_chunkstore_bytes = %v, want 0", got)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("GatherAndLint() = %v, %v", problems, err)
	}
}
