package server

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/httpapi"
	"space/internal/testenv"
	"space/internal/worker"
)

// startWorker runs a standalone worker registered with ts, sharing its
// chunk store.
func startWorker(t testing.TB, ts *testServer, memoryMiB int64) *testServer {
	t.Helper()
	return restartWorker(t, ts, memoryMiB, &testServer{dataDir: newDataDir(t), workerID: newWorkerID(t)})
}

// restartWorker runs the standalone worker wt (its ID and data dir); stop
// it with wt.stop.
func restartWorker(t testing.TB, ts *testServer, memoryMiB int64, wt *testServer) *testServer {
	t.Helper()
	agent := guesttest.Agent(t)
	token, err := os.ReadFile(filepath.Join(ts.dataDir, WorkerTokenFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	wt.url, wt.stop = runTestWorker(t, WorkerConfig{
		ID: wt.workerID, DataDir: wt.dataDir, Listen: "127.0.0.1:0", ControlPlane: ts.url,
		Token: strings.TrimSpace(string(token)), CacheBase: guesttest.CacheBase(), AgentPath: agent,
		Chunks: ChunkStore{Location: filepath.Join(ts.dataDir, "chunks")},
		VCPUs:  8, MemoryMiB: memoryMiB,
	})
	return wt
}

// runTestWorker runs a standalone worker with cfg until the test ends or
// stop is called, and returns once it serves, with its URL.
func runTestWorker(t testing.TB, cfg WorkerConfig) (url string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	cfg.Ready = func(u string) { ready <- u }
	go func() { done <- RunWorker(ctx, cfg) }()
	select {
	case url = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("setup: worker: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return url, stop
}

// twoWorkers runs a server whose embedded worker has no room and two
// standalone workers of 1 GiB, and returns once all three are healthy.
func twoWorkers(t *testing.T) (ts, a, b *testServer) {
	t.Helper()
	ts = startServerWith(t, Config{VCPUs: 1, MemoryMiB: 64}) // takes nothing
	ts.deleteAllOnCleanup(t)
	a = startWorker(t, ts, 1024)
	b = startWorker(t, ts, 1024)
	testenv.Eventually(t, 30*time.Second, func() bool {
		status, body := rawCall(t, ts, "GET", "/v1/workers", "")
		return status == 200 && strings.Count(body, `"healthy":true`) == 3
	})
	return ts, a, b
}

// TestTwoWorkersPlacement registers two standalone workers on this host
// with a server whose embedded worker has no room, and checks sandboxes
// are spread over them by free capacity and served through the control
// plane.
func TestTwoWorkersPlacement(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	ts := startServerWith(t, Config{VCPUs: 1, MemoryMiB: 64}) // takes nothing
	ts.deleteAllOnCleanup(t)
	a := startWorker(t, ts, 1024)
	b := startWorker(t, ts, 1024)
	ctx := t.Context()
	var listed api.WorkerList
	testenv.Eventually(t, 30*time.Second, func() bool {
		status, body := rawCall(t, ts, "GET", "/v1/workers", "")
		listed = api.WorkerList{}
		if status != http.StatusOK || httpapi.Unmarshal([]byte(body), &listed) != nil {
			return false
		}
		healthy := 0
		for _, w := range listed.Workers {
			if w.Healthy {
				healthy++
			}
		}
		return healthy == 3
	})
	t.Logf("workers: %+v", listed.Workers)
	// The worker protocol is TLS only: workers advertise https, a plain
	// HTTP request to one gets no API, and a registration of a plain HTTP
	// address is refused.
	for _, w := range listed.Workers {
		if w.ID != ts.workerID && !strings.HasPrefix(w.Address, "https://") {
			t.Errorf("worker %s at %q, want an https address", w.ID, w.Address)
		}
	}
	if resp, err := http.Get(strings.Replace(a.url, "https://", "http://", 1) + worker.PathPrefix + "/status"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP to a worker = %d %.100q, want no API", resp.StatusCode, body)
		}
	}
	token, _ := os.ReadFile(filepath.Join(ts.dataDir, WorkerTokenFile))
	req, _ := http.NewRequest("POST", ts.url+"/v1/workers", strings.NewReader(`{"id":"plain","address":"http://127.0.0.1:1","vcpus":1,"memory_mib":64}`))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("register: %v", err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "https://") {
			t.Errorf("registering a plain HTTP worker = %d %s, want 400 asking for https", resp.StatusCode, body)
		}
	}

	on := map[string]int{}
	for i := range 3 {
		sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
		if err != nil {
			t.Fatalf("CreateSandbox %d = %v", i, err)
		}
		on[sb.Worker]++
		stdout, _, code := execOut(t, ts.client, sb.ID, sh("hostname"))
		if code != 0 || stdout != worker.Hostname(sb.ID)+"\n" {
			t.Errorf("exec on %s = %q, %d", sb.Worker, stdout, code)
		}
		var got strings.Builder
		if _, err := ts.client.WriteFile(ctx, sb.ID, "/tmp/f", strings.NewReader("x"), client.WriteOptions{}); err != nil {
			t.Errorf("WriteFile on %s = %v", sb.Worker, err)
		} else if _, err := ts.client.ReadFile(ctx, sb.ID, "/tmp/f", &got); err != nil || got.String() != "x" {
			t.Errorf("ReadFile on %s = %q, %v", sb.Worker, got.String(), err)
		}
	}
	if on[a.workerID] == 0 || on[b.workerID] == 0 || on[ts.workerID] != 0 {
		t.Errorf("placement = %v, want both standalone workers used and the full embedded one not", on)
	}
	// A worker that restarts keeps its sandboxes: the control plane
	// reaches them again once it has registered.
	all, _ := ts.client.Sandboxes(ctx, client.ListOptions{})
	var onA string
	for _, sb := range all {
		if sb.Worker == a.workerID {
			onA = sb.ID
		}
	}
	a.stop()
	a = restartWorker(t, ts, 1024, &testServer{dataDir: a.dataDir, workerID: a.workerID})
	testenv.Eventually(t, time.Minute, func() bool {
		var out strings.Builder
		exit, err := ts.client.Exec(ctx, onA, sh("cat /tmp/f"), &out, io.Discard)
		return err == nil && exit.Code == 0 && out.String() == "x"
	})

	// Too big for any worker: a clear error, nothing recorded.
	if _, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 2048}); err == nil || !strings.Contains(err.Error(), "no worker has") {
		t.Errorf("CreateSandbox(2048 MiB) = %v, want no capacity", err)
	}
	all, _ = ts.client.Sandboxes(ctx, client.ListOptions{})
	for _, sb := range all {
		if err := ts.client.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Errorf("DeleteSandbox = %v", err)
		}
	}
	assertNoLeftovers(t, a)
	assertNoLeftovers(t, b)
}

// TestSnapshotOnAnotherWorker takes a snapshot on one worker and starts
// sandboxes from it on another, which has never seen it: the worker
// reassembles it from the shared chunk store (cold), then reuses its copy
// (warm).
func TestSnapshotOnAnotherWorker(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	ts, a, b := twoWorkers(t)
	ctx := t.Context()
	c := ts.client
	src, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	execOut(t, c, src.ID, sh("echo carried > /root/f; sync"))
	sn, err := c.CreateSnapshot(ctx, src.ID, "travel")
	if err != nil {
		t.Fatalf("CreateSnapshot = %v", err)
	}
	other := a.workerID
	if src.Worker == a.workerID {
		other = b.workerID
	}
	// The source sandbox keeps its worker busier, so copies go to the
	// other one.
	var took []time.Duration
	for i := range 2 {
		t0 := time.Now()
		cp, err := c.CreateSandbox(ctx, api.CreateSandbox{FromSnapshot: "travel"})
		took = append(took, time.Since(t0))
		if err != nil {
			t.Fatalf("CreateSandbox(from_snapshot) %d = %v", i, err)
		}
		if cp.Worker != other {
			t.Errorf("copy %d placed on %s, want %s (the worker that did not take the snapshot)", i, cp.Worker, other)
		}
		if out, _, _ := execOut(t, c, cp.ID, sh("cat /root/f")); out != "carried\n" {
			t.Errorf("copy %d on %s: /root/f = %q", i, cp.Worker, out)
		}
		if err := c.DeleteSandbox(ctx, cp.ID); err != nil {
			t.Fatalf("DeleteSandbox = %v", err)
		}
	}
	t.Logf("snapshot %s (%d MiB logical, %d MiB new): create from it on another worker: cold cache %v, warm cache %v",
		sn.ID, sn.LogicalBytes>>20, sn.NewBytes>>20, took[0].Round(time.Millisecond), took[1].Round(time.Millisecond))

	// Suspend, then resume on the other worker: the guest's memory,
	// processes and files travel through the chunk store. Fillers that
	// take a whole worker leave the resume no other choice.
	counter := startCounter(t, c, src.ID)
	count := func(id string) int { return readCounter(t, c, id) }
	whole := api.CreateSandbox{MemoryMiB: 1024}
	fillOther, err := c.CreateSandbox(ctx, whole) // only the other worker has room
	if err != nil || fillOther.Worker != other {
		t.Fatalf("CreateSandbox(1 GiB) = %+v, %v; want it on %s", fillOther, err, other)
	}
	if _, err := c.SuspendSandbox(ctx, src.ID); err != nil {
		t.Fatalf("SuspendSandbox = %v", err)
	}
	fillSrc, err := c.CreateSandbox(ctx, whole) // only the suspended one's worker has room
	if err != nil || fillSrc.Worker != src.Worker {
		t.Fatalf("CreateSandbox(1 GiB) = %+v, %v; want it on %s", fillSrc, err, src.Worker)
	}
	if _, err := c.ReadFile(ctx, src.ID, "/tmp/count", io.Discard); err == nil {
		t.Errorf("ReadFile of a suspended sandbox succeeded")
	}
	if err := c.DeleteSandbox(ctx, fillOther.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	t0 := time.Now()
	resumed, err := c.ResumeSandbox(ctx, src.ID)
	if err != nil || resumed.Worker != other {
		t.Fatalf("ResumeSandbox = %+v, %v; want it running on %s", resumed, err, other)
	}
	resumeTook := time.Since(t0)
	at := count(src.ID)
	if at == 0 {
		t.Errorf("after resume on %s the counter reads 0, want its value at the suspend", other)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count(src.ID) > at })
	if p, err := c.Process(ctx, src.ID, counter.ID); err != nil || !p.Running {
		t.Errorf("counter after resume on %s = %+v, %v; want running", other, p, err)
	}
	if out, _, _ := execOut(t, c, src.ID, sh("cat /root/f")); out != "carried\n" {
		t.Errorf("after resume on %s /root/f = %q", other, out)
	}
	t.Logf("suspended on %s, resumed on %s in %v with the counter at %d", src.Worker, other, resumeTook.Round(time.Millisecond), at)
	if err := c.DeleteSandbox(ctx, fillSrc.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	if err := c.DeleteSnapshot(ctx, "travel"); err != nil {
		t.Fatalf("DeleteSnapshot = %v", err)
	}
	if err := c.DeleteSandbox(ctx, src.ID); err != nil { // before the workers stop
		t.Fatalf("DeleteSandbox = %v", err)
	}
	for _, w := range []*testServer{a, b} {
		if entries, _ := os.ReadDir(filepath.Join(w.dataDir, "worker", "snapshots")); len(entries) != 0 {
			t.Errorf("worker %s keeps snapshot copies after delete: %v", w.workerID, entries)
		}
	}
}
