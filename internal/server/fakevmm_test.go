package server

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/imagebuild"
	"space/internal/testenv"
	"space/internal/vmm/fake"
	"space/internal/worker"
)

// startFakeServer runs a server with the fake VMM on a fresh data dir and
// returns once it serves; it needs no guest images. vcpus and memoryMiB
// are the worker's capacity (0 = its default).
func startFakeServer(t *testing.T, vcpus int, memoryMiB int64) *testServer {
	t.Helper()
	return startFakeServerWith(t, Config{VCPUs: vcpus, MemoryMiB: memoryMiB})
}

// startFakeServerWith is startFakeServer with more of cfg: its data dir,
// worker ID, listen address, cache, VMM, version and Ready are set here.
func startFakeServerWith(t *testing.T, cfg Config) *testServer {
	t.Helper()
	testenv.RequireRoot(t, testenv.TierNetns) // the fake jails its guests
	dataDir, workerID := newDataDir(t), newWorkerID(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	cfg.DataDir, cfg.WorkerID, cfg.Listen, cfg.CacheBase, cfg.VMM = dataDir, workerID, "127.0.0.1:0", t.TempDir(), VMMFake
	cfg.Version, cfg.Ready = "test", func(u string) { ready <- u }
	if os.Getenv("SPACE_TEST_LOG") != "" {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	go func() { done <- Run(ctx, cfg) }()
	var url string
	select {
	case url = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("setup: server: %v", err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("setup: server not ready in 1m")
	}
	key, err := os.ReadFile(filepath.Join(dataDir, AdminKeyFile))
	if err != nil {
		cancel()
		t.Fatalf("setup: %v", err)
	}
	c, err := client.New(url, strings.TrimSpace(string(key)))
	if err != nil {
		cancel()
		t.Fatalf("setup: %v", err)
	}
	var once sync.Once
	ts := &testServer{url: url, key: strings.TrimSpace(string(key)), dataDir: dataDir, workerID: workerID, client: c}
	ts.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		})
	}
	t.Cleanup(ts.stop)
	ts.deleteAllOnCleanup(t)
	return ts
}

// TestFakeVMMLifecycle drives a server on the fake VMM through the public
// API: create, exec, files, snapshot, fork, delete.
func TestFakeVMMLifecycle(t *testing.T) {
	ts := startFakeServer(t, 0, 0)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox() = %v", err)
	}
	if sb.VM == nil || sb.VM.VMM != "fake" || sb.VM.Accel != "none" {
		t.Errorf("CreateSandbox() VM = %+v, want vmm fake, accel none", sb.VM)
	}
	if out, _, code := execOut(t, c, sb.ID, sh("echo hi")); out != "hi\n" || code != 0 {
		t.Errorf("exec echo hi = %q, exit %d; want hi", out, code)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/work/a.txt", strings.NewReader("content\n"), client.WriteOptions{Mode: 0o600, Mkdir: true}); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	var got strings.Builder
	if _, err := c.ReadFile(ctx, sb.ID, "/work/a.txt", &got); err != nil || got.String() != "content\n" {
		t.Errorf("ReadFile = %q, %v; want %q", got.String(), err, "content\n")
	}
	snap, err := c.CreateSnapshot(ctx, sb.ID, "fake-snap")
	if err != nil {
		t.Fatalf("CreateSnapshot() = %v", err)
	}
	testenv.Eventually(t, time.Minute, func() bool {
		s, err := c.Snapshot(ctx, snap.ID)
		return err == nil && s.State == "ready"
	})
	kids, err := c.ForkSandbox(ctx, sb.ID, 2)
	if err != nil {
		t.Fatalf("ForkSandbox(2) = %v", err)
	}
	if len(kids) != 2 {
		t.Fatalf("ForkSandbox(2) = %d sandboxes, want 2", len(kids))
	}
	for _, k := range kids {
		if out, _, code := execOut(t, c, k.ID, sh("cat /work/a.txt")); out != "content\n" || code != 0 {
			t.Errorf("fork %s: cat = %q, exit %d; want the parent's file", k.ID, out, code)
		}
	}
	from, err := c.CreateSandbox(ctx, api.CreateSandbox{FromSnapshot: snap.ID})
	if err != nil {
		t.Fatalf("CreateSandbox(from snapshot) = %v", err)
	}
	if out, _, _ := execOut(t, c, from.ID, sh("cat /work/a.txt")); out != "content\n" {
		t.Errorf("sandbox from the snapshot: cat = %q, want the file", out)
	}
	for _, id := range []string{sb.ID, kids[0].ID, kids[1].ID, from.ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Errorf("DeleteSandbox(%s) = %v", id, err)
		}
		if _, err := c.Sandbox(ctx, id); !client.IsNotFound(err) {
			t.Errorf("Sandbox(%s) after delete = %v, want not found", id, err)
		}
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Errorf("DeleteSnapshot() = %v", err)
	}
}

// TestFakeVMMCreateLatency measures 50 sequential creates through the API
// on the fake VMM (a lower bound of the control plane's and worker's own
// cost per sandbox).
func TestFakeVMMCreateLatency(t *testing.T) {
	const n = 50
	// Fake guests use neither the vCPUs nor the memory they are given.
	// Their disks are small: the worker's storage keeps every disk's
	// promise whole.
	ts := startFakeServer(t, 2*n, 2*n*128) // deletes free capacity asynchronously
	c := ts.client
	var took []time.Duration
	var ids []string
	startedBy := map[string]int{}
	for range n {
		t0 := time.Now()
		sb, err := c.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 128, DiskMiB: 512})
		if err != nil {
			t.Fatalf("CreateSandbox() = %v", err)
		}
		took = append(took, time.Since(t0))
		ids = append(ids, sb.ID)
		if sb.VM != nil {
			startedBy[sb.VM.StartedBy]++
		}
	}
	// The first boots and is captured as the warm template; the others
	// restore from it.
	if want := map[string]int{"boot": 1, "warm": n - 1}; !maps.Equal(startedBy, want) {
		t.Errorf("sandboxes started by %v, want %v", startedBy, want)
	}
	if _, err := c.Exec(t.Context(), ids[n-1], sh("true"), io.Discard, io.Discard); err != nil {
		t.Errorf("exec in the last sandbox = %v", err)
	}
	slices.Sort(took)
	t.Logf("%d creates on the fake vmm (started by %v): p50 %v, p99 %v, max %v", n, startedBy, took[n/2], took[n*99/100], took[n-1])
	for _, id := range ids {
		if err := c.DeleteSandbox(t.Context(), id); err != nil {
			t.Errorf("DeleteSandbox(%s) = %v", id, err)
		}
	}

	// The same n, five at a time: what a load test sees.
	const par = 5
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	t0 := time.Now()
	for range par {
		wg.Go(func() {
			for range n / par {
				sb, err := c.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 128, DiskMiB: 512})
				if err == nil {
					err = c.DeleteSandbox(t.Context(), sb.ID)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Errorf("%d of %d concurrent create+delete failed, first: %v", len(errs), n, errs[0])
	}
	t.Logf("%d create+delete, %d at a time: %v (%.0f/s)", n, par, time.Since(t0), float64(n)/time.Since(t0).Seconds())
}

// TestFakeVMMBootFaults: a guest whose agent never answers fails its
// create when the worker's boot timeout fires; one that exits right after
// boot fails it at once. Neither is left behind.
func TestFakeVMMBootFaults(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	const timeout = 2 * time.Second
	tests := []struct {
		name     string
		point    fake.Point
		min, max time.Duration // how long the failed create takes
	}{
		{"agent silent", fake.PointAgent, timeout, timeout + 20*time.Second},
		{"exit after boot", fake.PointExitAfterBoot, 0, timeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := newDataDir(t)
			chunks, err := openChunks(t.Context(), ChunkStore{}, dataDir, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatalf("setup: %v", err)
			}
			w, err := newWorker(t.Context(), workerConfig{
				VMM: VMMFake, FakeFaults: map[fake.Point]fake.Fault{tt.point: fake.Fail}, BootTimeout: timeout,
				ID: newWorkerID(t), DataDir: filepath.Join(dataDir, "worker"), CacheBase: t.TempDir(),
				Images: fakeImages(t), Log: slog.New(slog.DiscardHandler), Chunks: chunks,
			})
			if err != nil {
				t.Fatalf("setup: newWorker() = %v", err)
			}
			t.Cleanup(func() { w.Close() })
			t0 := time.Now()
			_, err = w.Create(t.Context(), worker.CreateRequest{ID: "sbx_faultyaaaaaaaaaaaaaa", Team: "team1",
				Spec: worker.Spec{Template: "default", VCPUs: 1, MemoryMiB: 128, DiskMiB: 1024}})
			took := time.Since(t0)
			if err == nil {
				t.Fatalf("Create() with fault %s = nil, want an error", tt.point)
			}
			t.Logf("Create() with fault %s: %v after %v", tt.point, err, took)
			if took < tt.min || took > tt.max {
				t.Errorf("Create() with fault %s failed after %v, want %v..%v: %v", tt.point, took, tt.min, tt.max, err)
			}
			if got, err := w.List(t.Context()); err != nil || len(got) != 0 {
				t.Errorf("List() after the failed create = %+v, %v; want none", got, err)
			}
		})
	}
}

func fakeImages(t *testing.T) *imagebuild.Artifacts {
	t.Helper()
	img, err := templateImages(t.Context(), VMMFake, "", "", "", nil)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return img
}
