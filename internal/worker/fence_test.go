package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/proto"
	"space/internal/cgroup"
	"space/internal/chunkstore/chunkloc"
	"space/internal/errkind"
	"space/internal/image/kernel"
	"space/internal/imagebuild"
	"space/internal/sandbox"
	"space/internal/testenv"
	"space/internal/vmm/fake"
	"space/internal/workerproto"
)

// fakeImages are the images of a template on the fake VMM, which boots
// none of them.
var fakeImages = &imagebuild.Artifacts{
	Kernel:    &kernel.Kernel{Version: "fake", Vmlinux: "/nonexistent/fake-vmm/vmlinux", Vmlinuz: "/nonexistent/fake-vmm/vmlinuz"},
	Initramfs: "/nonexistent/fake-vmm/initramfs",
	Rootfs:    "/nonexistent/fake-vmm/rootfs",
}

// fakeHost is where fake-VMM workers of one test keep their data: a
// worker started again on it re-adopts the previous one's sandboxes.
type fakeHost struct {
	id, data, run string
	cg            *cgroup.Hierarchy // or nil: VMMs run without limits
}

// newFakeHost returns a host for fake-VMM workers; when the test ends,
// whatever its workers left (guests included) is removed.
func newFakeHost(t testing.TB) *fakeHost {
	t.Helper()
	testenv.RequireRoot(t, testenv.TierNetns) // the fake jails its guests
	cg, _ := cgroup.Detect()
	h := &fakeHost{id: fmt.Sprintf("wf%d", time.Now().UnixNano()%1e9), data: t.TempDir(), run: t.TempDir(), cg: cg}
	t.Cleanup(func() {
		// A worker that serves (no epoch, so no fence) deletes them all.
		os.Remove(filepath.Join(h.data, fenceFile))
		w := h.start(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		all, _ := w.List(ctx) // never fails
		for _, inf := range all {
			if err := w.Delete(ctx, inf.ID); err != nil {
				t.Errorf("cleanup: delete %s: %v", inf.ID, err)
			}
		}
		w.Close()
		if cg != nil {
			cg.Destroy(ctx, w.cgroupParent())
		}
	})
	return h
}

// start starts a worker on h, closed when the test ends.
func (h *fakeHost) start(t testing.TB) *Worker {
	t.Helper()
	return h.startWith(t, func(*Config) {})
}

// startWith is start with the worker's config changed by set.
func (h *fakeHost) startWith(t testing.TB, set func(*Config)) *Worker {
	t.Helper()
	drv, err := fake.New(fake.Config{})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cfg := Config{ID: h.id, DataDir: h.data, RunRoot: h.run, Driver: drv, Templates: oneTemplate{fakeImages}, Fencing: true,
		Cgroups: h.cg, BootTimeout: 10 * time.Second, Log: testLog(), VMM: VMMInfo{Kind: "fake", Version: fake.Version, Accel: fake.Accel}}
	set(&cfg)
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("setup: Start = %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// fakeSpec is a sandbox of the fake VMM. It boots cold, so its guest's
// files are next to its own disk (see guestFile).
var fakeSpec = Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024, ColdBoot: true}

// createCounting creates sandbox id and starts a process in it that
// counts, ten times a second, into /tmp/count.
func createCounting(t *testing.T, w *Worker, id string) {
	t.Helper()
	if _, err := w.Create(t.Context(), CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		t.Fatalf("Create(%s) = %v", id, err)
	}
	a, err := w.agentFor(t.Context(), id)
	if err != nil {
		t.Fatalf("agent of %s: %v", id, err)
	}
	if _, err := a.StartProcess(t.Context(), proto.ProcStart{ExecRequest: proto.ExecRequest{
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done"}}); err != nil {
		t.Fatalf("start counter in %s: %v", id, err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return guestCount(t, w, id) > 2 })
}

// guestCount reads the counter of createCounting from the host's side
// of the guest's /tmp: it can be read while the guest is paused.
func guestCount(t *testing.T, w *Worker, id string) int {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(w.sandboxesDir(), id, "disk", "*.fake", "tmp", "count"))
	if len(m) != 1 {
		return 0
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// counterStops checks the counter in sandbox id stands still: it does
// not move over a second.
func counterStops(t *testing.T, w *Worker, id string) {
	t.Helper()
	before := guestCount(t, w, id)
	time.Sleep(time.Second) // what is checked is that nothing happens
	if after := guestCount(t, w, id); after != before {
		t.Errorf("counter in %s went from %d to %d in a second, want it frozen", id, before, after)
	}
}

// counterRuns checks the counter in sandbox id moves on.
func counterRuns(t *testing.T, w *Worker, id string) {
	t.Helper()
	before := guestCount(t, w, id)
	testenv.Eventually(t, 10*time.Second, func() bool { return guestCount(t, w, id) > before+2 })
}

// readFile asks the data plane of h for a file of sandbox id's guest.
func readFile(t *testing.T, h http.Handler, id, path string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("GET", workerproto.DataPath(id, "/files?path="+path), nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// wantNoLease checks a data-plane answer is the fence's 503.
func wantNoLease(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "2" ||
		!strings.Contains(rec.Body.String(), "lost its lease with the control plane") {
		t.Errorf("data plane without a lease = %d, Retry-After %q, %s; want 503, Retry-After 2, lost its lease",
			rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}

func lease(t *testing.T, w *Worker, epoch int64, ttl time.Duration, keep ...string) workerproto.LeaseReply {
	t.Helper()
	r, err := w.Lease(t.Context(), workerproto.LeaseRequest{Epoch: epoch, TTLMS: ttl.Milliseconds(), Keep: keep})
	if err != nil {
		t.Fatalf("Lease(epoch %d, ttl %v, keep %v) = %v", epoch, ttl, keep, err)
	}
	return r
}

// TestLeaseExpiryFencesAndPauses runs a worker on the fake VMM through a
// lease, its expiry and a new lease: while none holds the data plane
// answers 503, the verbs that start or change a guest are refused, and
// the guest stands still without being recorded paused; the next lease
// resumes it.
func TestLeaseExpiryFencesAndPauses(t *testing.T) {
	w := newFakeHost(t).start(t)
	h := w.Handler("")
	ctx := t.Context()
	a := sandboxID(0)
	createCounting(t, w, a)
	st, _ := w.Status(ctx)
	if !st.Capabilities.Fencing || st.Leased {
		t.Errorf("Status() before any lease: fencing %v, leased %v; want fencing, not leased", st.Capabilities.Fencing, st.Leased)
	}
	if rec := readFile(t, h, a, "/tmp/count"); rec.Code != http.StatusOK {
		t.Errorf("data plane of a worker that never took a lease = %d %s, want 200", rec.Code, rec.Body)
	}

	const ttl = 300 * time.Millisecond
	granted := time.Now()
	if r := lease(t, w, 0, ttl, a); r.Epoch != 0 || len(r.Removed) != 0 {
		t.Errorf("Lease(0) = %+v, want epoch 0, nothing removed", r)
	}
	if st, _ := w.Status(ctx); !st.Leased {
		t.Errorf("Status().Leased under a lease = false")
	}
	if rec := readFile(t, h, a, "/tmp/count"); rec.Code != http.StatusOK {
		t.Errorf("data plane under a lease = %d %s, want 200", rec.Code, rec.Body)
	}

	// Paused within ~250 ms of the expiry (half a second here, for a
	// busy machine): from then on the counter does not move.
	time.Sleep(time.Until(granted.Add(ttl + 500*time.Millisecond)))
	counterStops(t, w, a)
	if st, _ := w.Status(ctx); st.Leased {
		t.Errorf("Status().Leased after the lease ran out = true")
	}
	wantNoLease(t, readFile(t, h, a, "/tmp/count"))
	wantNoLease(t, readFile(t, h, sandboxID(9), "/tmp/count")) // before the lookup: says nothing of what exists
	if inf, err := w.Sandbox(ctx, a); err != nil || inf.State != sandbox.Running {
		t.Errorf("Sandbox(%s) without a lease = %v, %v; want it still running to its record", a, inf.State, err)
	}
	refused := map[string]func() error{
		"Create": func() error {
			_, err := w.Create(ctx, CreateRequest{ID: sandboxID(1), Team: "team", Spec: fakeSpec})
			return err
		},
		"Snapshot": func() error {
			_, err := w.Snapshot(ctx, a, SnapshotRequest{SnapshotID: "snap_fenced", Local: true})
			return err
		},
		"Restore":    func() error { _, err := w.Restore(ctx, a, "snap_fenced"); return err },
		"Resume":     func() error { _, err := w.Resume(ctx, a); return err },
		"SetNetwork": func() error { _, err := w.SetNetwork(ctx, a, Network{}); return err },
		"SetSecrets": func() error { _, err := w.SetSecrets(ctx, a, SecretsRequest{}); return err },
	}
	for name, call := range refused {
		if err := call(); !errors.Is(err, ErrNoLease) || !errors.Is(err, errkind.Unavailable) {
			t.Errorf("%s without a lease = %v, want ErrNoLease (unavailable)", name, err)
		}
	}
	if _, err := w.Sandbox(ctx, sandboxID(1)); !errors.Is(err, ErrNotFound) {
		t.Errorf("Sandbox(refused create) = %v, want not found", err)
	}
	if all, err := w.List(ctx); err != nil || len(all) != 1 {
		t.Errorf("List() without a lease = %d sandboxes, %v; want 1", len(all), err)
	}

	lease(t, w, 0, time.Minute, a)
	counterRuns(t, w, a)
	if rec := readFile(t, h, a, "/tmp/count"); rec.Code != http.StatusOK {
		t.Errorf("data plane under a new lease = %d %s, want 200", rec.Code, rec.Body)
	}
	if _, err := w.Create(ctx, CreateRequest{ID: sandboxID(1), Team: "team", Spec: fakeSpec}); err != nil {
		t.Errorf("Create under a new lease = %v", err)
	}
}

// TestLeaseKeepsUserPause checks a sandbox its user paused stays paused
// through a lease's expiry and the next lease, and resumes when asked.
func TestLeaseKeepsUserPause(t *testing.T) {
	w := newFakeHost(t).start(t)
	ctx := t.Context()
	a := sandboxID(0)
	createCounting(t, w, a)
	const ttl = 300 * time.Millisecond
	granted := time.Now()
	lease(t, w, 0, ttl)
	if inf, err := w.Pause(ctx, a); err != nil || inf.State != sandbox.Paused {
		t.Fatalf("Pause = %v, %v; want paused", inf.State, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return !w.leased() })
	time.Sleep(time.Until(granted.Add(ttl + 500*time.Millisecond)))
	if inf, err := w.Pause(ctx, a); err != nil || inf.State != sandbox.Paused {
		t.Errorf("Pause without a lease = %v, %v; want paused (a no-op)", inf.State, err)
	}

	lease(t, w, 0, time.Minute)
	if inf, _ := w.Sandbox(ctx, a); inf.State != sandbox.Paused {
		t.Errorf("state after a new lease = %v, want paused", inf.State)
	}
	counterStops(t, w, a)
	if inf, err := w.Resume(ctx, a); err != nil || inf.State != sandbox.Running {
		t.Fatalf("Resume = %v, %v; want running", inf.State, err)
	}
	counterRuns(t, w, a)

	// Paused by its user while the fence had it paused: it stays so.
	lease(t, w, 0, ttl)
	testenv.Eventually(t, 5*time.Second, func() bool { return !w.leased() })
	time.Sleep(500 * time.Millisecond) // past the fence's pause
	if _, err := w.Pause(ctx, a); err != nil {
		t.Fatalf("Pause of a guest the fence paused = %v", err)
	}
	lease(t, w, 0, time.Minute)
	counterStops(t, w, a)
	if inf, _ := w.Sandbox(ctx, a); inf.State != sandbox.Paused {
		t.Errorf("state after a new lease = %v, want paused", inf.State)
	}
}

// TestLeaseNewerEpochRemoves checks a lease of a newer epoch removes
// every sandbox it does not keep, VMM process and files, and keeps the
// others and the snapshots; an older epoch is refused after it.
func TestLeaseNewerEpochRemoves(t *testing.T) {
	w := newFakeHost(t).start(t)
	h := w.Handler("")
	ctx := t.Context()
	x, y := sandboxID(0), sandboxID(1)
	lease(t, w, 1, time.Minute)
	for _, id := range []string{x, y} {
		if _, err := w.Create(ctx, CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
			t.Fatalf("Create(%s) = %v", id, err)
		}
	}
	if _, err := w.Snapshot(ctx, x, SnapshotRequest{SnapshotID: "snap_x", Local: true}); err != nil {
		t.Fatalf("Snapshot(%s) = %v", x, err)
	}
	inf, _ := w.Sandbox(ctx, x)
	pid := inf.VM.PID
	cgroupOfX := w.cgroupName(x)

	absent := sandboxID(7) // the store places it here; the worker never had it
	r := lease(t, w, 3, time.Minute, y, absent)
	if diff := cmp.Diff(workerproto.LeaseReply{Epoch: 3, Removed: []string{x}}, r); diff != "" {
		t.Errorf("Lease(epoch 3, keep %s) (-want +got):\n%s", y, diff)
	}
	if all, _ := w.List(ctx); len(all) != 1 || all[0].ID != y {
		t.Errorf("List() after the new epoch = %v, want only %s", all, y)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill(%d, 0) of the removed sandbox's VMM = %v, want no such process", pid, err)
	}
	for _, dir := range []string{filepath.Join(w.sandboxesDir(), x), filepath.Join(w.cfg.RunRoot, x)} {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stat %s after removal = %v, want gone", dir, err)
		}
	}
	if w.cfg.Cgroups != nil {
		if _, err := w.cfg.Cgroups.Open(cgroupOfX); !errors.Is(err, errkind.NotFound) {
			t.Errorf("cgroup %s after removal: open = %v, want not found", cgroupOfX, err)
		}
	}
	if _, err := w.SnapshotInfo(ctx, "snap_x"); err != nil {
		t.Errorf("SnapshotInfo(snapshot of the removed sandbox) = %v, want it kept", err)
	}
	if rec := readFile(t, h, y, "/etc/hostname"); rec.Code != http.StatusOK {
		t.Errorf("data plane of the kept sandbox = %d %s, want 200", rec.Code, rec.Body)
	}
	if b, err := os.ReadFile(filepath.Join(w.cfg.DataDir, fenceFile)); err != nil || !strings.Contains(string(b), `"epoch": 3`) {
		t.Errorf("%s = %s, %v; want epoch 3", fenceFile, b, err)
	}

	_, err := w.Lease(ctx, workerproto.LeaseRequest{Epoch: 2, TTLMS: 1000, Keep: []string{y}})
	if !errors.Is(err, errkind.Conflict) || !strings.Contains(err.Error(), "epoch 2") || !strings.Contains(err.Error(), "epoch 3") {
		t.Errorf("Lease(older epoch 2) = %v, want a conflict naming epochs 2 and 3", err)
	}
	if r := lease(t, w, 3, time.Minute); len(r.Removed) != 0 || r.Epoch != 3 {
		t.Errorf("Lease(same epoch again, keeping nothing) = %+v, want nothing removed", r)
	}
	if all, _ := w.List(ctx); len(all) != 1 {
		t.Errorf("List() after a lease of the same epoch = %d sandboxes, want 1: Keep applies only to a newer epoch", len(all))
	}
}

// TestLeaseEpochSurvivesRestart checks a worker that took a lease and
// restarts enforces from the start: it knows the epoch, re-adopts its
// guests paused and serves nothing until the next lease.
func TestLeaseEpochSurvivesRestart(t *testing.T) {
	host := newFakeHost(t)
	w := host.start(t)
	a := sandboxID(0)
	createCounting(t, w, a)
	if r := lease(t, w, 5, time.Minute, a); len(r.Removed) != 0 {
		t.Fatalf("Lease(epoch 5, keep %s) removed %v", a, r.Removed)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}

	w = host.start(t)
	ctx := t.Context()
	h := w.Handler("")
	st, _ := w.Status(ctx)
	if st.Leased || !st.Capabilities.Fencing {
		t.Errorf("Status() after a restart: leased %v, fencing %v; want not leased, fencing", st.Leased, st.Capabilities.Fencing)
	}
	wantNoLease(t, readFile(t, h, a, "/tmp/count"))
	counterStops(t, w, a)
	if inf, err := w.Sandbox(ctx, a); err != nil || inf.State != sandbox.Running {
		t.Errorf("Sandbox(%s) after a restart = %v, %v; want running to its record", a, inf.State, err)
	}
	if _, err := w.Lease(ctx, workerproto.LeaseRequest{Epoch: 4, TTLMS: 1000}); !errors.Is(err, errkind.Conflict) {
		t.Errorf("Lease(epoch 4) after a restart at epoch 5 = %v, want conflict", err)
	}
	lease(t, w, 5, time.Minute, a)
	counterRuns(t, w, a)
	if rec := readFile(t, h, a, "/tmp/count"); rec.Code != http.StatusOK {
		t.Errorf("data plane after the lease = %d %s, want 200", rec.Code, rec.Body)
	}
}

// TestLeaseBadRequests checks Lease refuses bad requests and changes
// nothing for them; it needs no VMs.
func TestLeaseBadRequests(t *testing.T) {
	w := newTestWorker(t)
	maxTTL := workerproto.MaxLeaseTTL.Milliseconds()
	tests := []struct {
		name string
		req  workerproto.LeaseRequest
	}{
		{"zero ttl", workerproto.LeaseRequest{TTLMS: 0}},
		{"negative ttl", workerproto.LeaseRequest{TTLMS: -5}},
		{"ttl over the bound", workerproto.LeaseRequest{TTLMS: maxTTL + 1}},
		{"negative epoch", workerproto.LeaseRequest{Epoch: -1, TTLMS: 1000}},
		{"bad kept id", workerproto.LeaseRequest{TTLMS: 1000, Keep: []string{"../etc"}}},
		{"too many kept", workerproto.LeaseRequest{TTLMS: 1000, Keep: slices.Repeat([]string{sandboxID(0)}, maxKeep+1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := w.Lease(t.Context(), tt.req); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Lease(%s) = %v, want invalid argument", tt.name, err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(w.cfg.DataDir, fenceFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("epoch file after refused leases: stat = %v, want none", err)
	}
	if st, _ := w.Status(t.Context()); st.Leased || !w.serving() {
		t.Errorf("after refused leases: leased %v, serving %v; want no lease and no fence", st.Leased, w.serving())
	}

	// The longest lease is one.
	if _, err := w.Lease(t.Context(), workerproto.LeaseRequest{TTLMS: maxTTL}); err != nil {
		t.Fatalf("Lease(ttl %d) = %v", maxTTL, err)
	}
	if st, _ := w.Status(t.Context()); !st.Leased {
		t.Errorf("Status().Leased after a lease = false")
	}
}

// TestLeaseFencesDataPlaneRoutes checks every data-plane route, exposed
// ports included, answers 503 once a lease ran out; it needs no VMs.
func TestLeaseFencesDataPlaneRoutes(t *testing.T) {
	w := newTestWorker(t)
	if _, err := w.Lease(t.Context(), workerproto.LeaseRequest{TTLMS: 1}); err != nil {
		t.Fatalf("Lease = %v", err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return !w.leased() })
	srv := httptest.NewServer(w.Handler(""))
	defer srv.Close()
	id := sandboxID(0)
	for _, r := range w.dataRoutes() {
		method, pattern, ok := strings.Cut(r.pattern, " ")
		if !ok { // no method: any
			method, pattern = "GET", r.pattern
		}
		path := strings.NewReplacer("{id}", id, "{pid}", "7", "{port}", "8080", "{path...}", "x").Replace(pattern)
		t.Run(method+" "+path, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+path+"?path=/x", nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" ||
				!strings.Contains(string(body), "lost its lease") {
				t.Errorf("%s %s = %d, Retry-After %q, %s; want 503, 2, lost its lease", method, path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
		})
	}
	// The verbs that only look, or remove, still answer.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+PathPrefix+"/status", nil)
	resp, err := srv.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET status without a lease = %v, %v; want 200", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// TestChunkStoreCapability checks the worker reports the chunk store it
// is given, and refuses a name without a store.
func TestChunkStoreCapability(t *testing.T) {
	chunks, err := chunkloc.Open(t.Context(), chunkloc.Location{Dir: t.TempDir()}, chunkloc.Options{})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, name := range []string{"local", "s3://snaps/space?endpoint=s3.example.com:8333", ""} {
		w, err := New(Config{ID: "unit", DataDir: t.TempDir(), RunRoot: t.TempDir(), Driver: neverBoots{}, Templates: noTemplates{},
			Chunks: chunks, ChunkStore: name})
		if err != nil {
			t.Fatalf("New(chunk store %q) = %v", name, err)
		}
		if st, _ := w.Status(t.Context()); st.Capabilities.ChunkStore != name || !st.Capabilities.ChunkedSnapshots {
			t.Errorf("Status() with chunk store %q: chunk_store %q, chunked %v", name, st.Capabilities.ChunkStore, st.Capabilities.ChunkedSnapshots)
		}
	}
	for _, name := range []string{"s3://snaps?endpoint=h", "elsewhere"} {
		var store = chunks
		if strings.HasPrefix(name, "s3:") {
			store = nil
		}
		_, err := New(Config{ID: "unit", DataDir: t.TempDir(), RunRoot: t.TempDir(), Driver: neverBoots{}, Templates: noTemplates{},
			Chunks: store, ChunkStore: name})
		if !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(chunk store %q, store %v) = %v, want invalid argument", name, store != nil, err)
		}
	}
}

// testLog is the workers' log: stderr with SPACE_TEST_LOG set, else none.
func testLog() *slog.Logger {
	if os.Getenv("SPACE_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestStartRefusesBadEpochFile checks a worker whose epoch file does not
// hold an epoch does not start: it cannot tell which sandboxes are still
// its own.
func TestStartRefusesBadEpochFile(t *testing.T) {
	for name, content := range map[string]string{"not json": "{", "negative": `{"epoch": -3}`} {
		t.Run(name, func(t *testing.T) {
			data := t.TempDir()
			if err := os.WriteFile(filepath.Join(data, fenceFile), []byte(content), 0o600); err != nil {
				t.Fatalf("setup: %v", err)
			}
			w, err := New(Config{ID: "unit", DataDir: data, RunRoot: t.TempDir(), Driver: neverBoots{}, Templates: noTemplates{}, Fencing: true})
			if err != nil {
				t.Fatalf("setup: %v", err)
			}
			defer w.Close()
			if err := w.Start(t.Context()); err == nil || !strings.Contains(err.Error(), fenceFile) {
				t.Errorf("Start with epoch file %q = %v, want an error naming %s", content, err, fenceFile)
			}
		})
	}
}

// TestLeaseFencesEgress: while no lease holds, the gateways' dialer and
// resolver refuse, so no guest opens a connection or resolves a name;
// under a lease they work (a listener on loopback, reached through
// EgressDial's default).
func TestLeaseFencesEgress(t *testing.T) {
	w := newTestWorker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx := t.Context()
	if _, err := w.Lease(ctx, workerproto.LeaseRequest{TTLMS: time.Minute.Milliseconds()}); err != nil {
		t.Fatalf("Lease = %v", err)
	}
	c, err := w.fencedDial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial under a lease = %v", err)
	}
	c.Close()
	if _, err := w.Lease(ctx, workerproto.LeaseRequest{TTLMS: 1}); err != nil {
		t.Fatalf("Lease = %v", err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return !w.leased() })
	if c, err := w.fencedDial(ctx, "tcp", ln.Addr().String()); !errors.Is(err, ErrNoLease) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial with no lease = %v, want ErrNoLease", err)
	}
	if _, err := w.fencedResolve(ctx, "localhost"); !errors.Is(err, ErrNoLease) {
		t.Errorf("resolve with no lease = %v, want ErrNoLease", err)
	}
}

// TestCloseRemovesEmptyCgroup: a worker that closes with a sandbox keeps
// its control group (the VM runs on in it); one that closes with none
// leaves no group behind.
func TestCloseRemovesEmptyCgroup(t *testing.T) {
	h := newFakeHost(t)
	if h.cg == nil {
		testenv.Unavailable(t, testenv.TierNetns, "no control groups on this host")
	}
	w := h.start(t)
	id := sandboxID(0)
	if _, err := w.Create(t.Context(), CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	w.Close()
	if _, err := h.cg.Open(w.cgroupParent()); err != nil {
		t.Fatalf("after Close with a sandbox, Open(%s) = %v; want the group kept", w.cgroupParent(), err)
	}
	if _, err := os.Stat(w.cfg.RunRoot); err != nil {
		t.Fatalf("after Close with a sandbox, its run root: %v; want it kept", err)
	}
	w = h.start(t)
	if err := w.Delete(t.Context(), id); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	w.Close()
	if _, err := h.cg.Open(w.cgroupParent()); !errors.Is(err, errkind.NotFound) {
		t.Errorf("after Close with no sandbox, Open(%s) = %v; want NotFound", w.cgroupParent(), err)
	}
	if _, err := os.Stat(w.cfg.RunRoot); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close with no sandbox, its run root: %v; want it gone", err)
	}
}
