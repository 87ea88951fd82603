package server

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/testenv"
)

// untilExec returns how long start took plus a first `exec true` in the
// sandbox it returned.
func untilExec(b *testing.B, c *client.Client, start func() (api.Sandbox, error)) (api.Sandbox, time.Duration) {
	b.Helper()
	t0 := time.Now()
	sb, err := start()
	if err != nil {
		b.Fatalf("start: %v", err)
	}
	if exit, err := c.Exec(b.Context(), sb.ID, api.Exec{Command: []string{"true"}}, io.Discard, io.Discard); err != nil || exit.Code != 0 {
		b.Fatalf("exec true: %+v, %v", exit, err)
	}
	return sb, time.Since(t0)
}

// median returns the middle of ds (the upper one of an even count).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkSandboxLifecycle measures, in one run and through the API,
// every latency until a first `exec true` has completed: create from the
// worker's pool of restored sandboxes and from a warm template, each
// against a cold boot of the same shape, a fork of a 2 GiB guest against
// a 256 MiB one (medians of three forks each, and the worst round's
// ratio), and what a second snapshot stores against what the guest
// dirtied between the two, with the snapshot call's duration.
//
//	go test -run '^$' -bench SandboxLifecycle -benchtime 1x ./internal/server
func BenchmarkSandboxLifecycle(b *testing.B) {
	release := guesttest.AcquireAllSlots(b)
	defer release()
	ts := startServerB(b, Config{Prewarm: true, Pool: 1})
	c := ts.client
	ctx := b.Context()
	shape := api.CreateSandbox{MemoryMiB: 256, DiskMiB: 1024}
	// Measure on a quiet host: the pool fills in the background.
	waitPool := func() {
		for !ts.poolReady() {
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitPool()
	done := func(sbs ...api.Sandbox) {
		for _, sb := range sbs {
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
				b.Fatalf("DeleteSandbox = %v", err)
			}
		}
	}
	for b.Loop() {
		// The default shape has a pool of restored sandboxes: a create
		// takes one; against a cold boot of the same shape.
		p, pooled := untilExec(b, c, func() (api.Sandbox, error) { return c.CreateSandbox(ctx, api.CreateSandbox{}) })
		waitPool()
		cd, coldDefault := untilExec(b, c, func() (api.Sandbox, error) { return c.CreateSandbox(ctx, api.CreateSandbox{ColdBoot: true}) })
		done(p, cd) // the host's 8 vCPUs are for what follows
		b.ReportMetric(float64(pooled.Milliseconds()), "pool-create-ms")
		b.ReportMetric(float64(coldDefault.Milliseconds()), "cold-boot-default-ms")
		b.ReportMetric(float64(pooled)/float64(coldDefault), "pool/cold")

		// The first of a shape boots (and is captured); then warm vs cold.
		f, _ := untilExec(b, c, func() (api.Sandbox, error) { return c.CreateSandbox(ctx, shape) })
		w, warm := untilExec(b, c, func() (api.Sandbox, error) { return c.CreateSandbox(ctx, shape) })
		cold := shape
		cold.ColdBoot = true
		cb, boot := untilExec(b, c, func() (api.Sandbox, error) { return c.CreateSandbox(ctx, cold) })
		done(f, w, cb)
		b.ReportMetric(float64(warm.Milliseconds()), "warm-create-ms")
		b.ReportMetric(float64(boot.Milliseconds()), "cold-boot-ms")
		b.ReportMetric(float64(warm)/float64(boot), "warm/cold")

		// Forks: each sample first writes half of the parent's free
		// memory (a fresh file each time), so that the guest's size
		// matters, then forks it; the sizes take turns and each reports
		// its median over forkRounds samples.
		parents := map[int64]api.Sandbox{}
		for _, mem := range []int64{256, 2048} {
			p, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: mem, DiskMiB: 1024})
			if err != nil {
				b.Fatalf("create %d MiB: %v", mem, err)
			}
			parents[mem] = p
		}
		fork := func(mem int64) time.Duration {
			parent := parents[mem]
			fill := "rm -f /dev/shm/fill; head -c $(( $(awk '/MemFree/{print $2}' /proc/meminfo) / 2 ))k /dev/zero | tr '\\0' x > /dev/shm/fill"
			if exit, err := c.Exec(ctx, parent.ID, api.Exec{Shell: fill}, io.Discard, io.Discard); err != nil || exit.Code != 0 {
				b.Fatalf("fill %d MiB guest: %+v, %v", mem, exit, err)
			}
			kid, took := untilExec(b, c, func() (api.Sandbox, error) {
				kids, err := c.ForkSandbox(ctx, parent.ID, 1)
				if err != nil {
					return api.Sandbox{}, err
				}
				return kids[0], nil
			})
			done(kid)
			return took
		}
		const forkRounds = 3
		var small, big []time.Duration
		worst := 0.0
		for range forkRounds {
			s, l := fork(256), fork(2048)
			small, big = append(small, s), append(big, l)
			worst = max(worst, float64(l)/float64(s))
		}
		done(parents[256], parents[2048])
		ms, mb := median(small), median(big)
		b.ReportMetric(float64(ms.Milliseconds()), "fork-256MiB-ms")
		b.ReportMetric(float64(mb.Milliseconds()), "fork-2GiB-ms")
		b.ReportMetric(float64(mb)/float64(ms), "fork-2GiB/256MiB")
		b.ReportMetric(worst, "fork-2GiB/256MiB-worst-round")

		sb, err := c.CreateSandbox(ctx, shape)
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		snap := func() api.Snapshot {
			t0 := time.Now()
			sn, err := c.CreateSnapshot(ctx, sb.ID, "")
			if err != nil {
				b.Fatalf("snapshot: %v", err)
			}
			sn.PausedMS = time.Since(t0).Milliseconds() // the whole call, here
			return sn
		}
		dirty := func(cmd string) {
			if exit, err := c.Exec(ctx, sb.ID, api.Exec{Shell: cmd}, io.Discard, io.Discard); err != nil || exit.Code != 0 {
				b.Fatalf("%s: %+v, %v", cmd, exit, err)
			}
		}
		base := snap()
		idle := snap()
		dirty("head -c 16M /dev/urandom > /dev/shm/t16")
		tmpfs := snap()
		dirty("head -c 16M /dev/urandom > /root/d16; sync")
		disk := snap()
		dirty("head -c 64M /dev/urandom > /dev/shm/t64")
		big64 := snap()
		const m16 = 16 << 20
		b.ReportMetric(float64(idle.NewBytes)/(1<<20), "idle-snapshot-new-MiB")
		b.ReportMetric(float64(tmpfs.NewBytes)/m16, "new/dirtied-tmpfs-16MiB")
		b.ReportMetric(float64(disk.NewBytes)/m16, "new/dirtied-disk-16MiB")
		b.ReportMetric(float64(big64.NewBytes)/(64<<20), "new/dirtied-tmpfs-64MiB")
		b.ReportMetric(float64(base.PausedMS), "snapshot-first-ms")
		b.ReportMetric(float64(idle.PausedMS), "snapshot-idle-ms")
		b.ReportMetric(float64(tmpfs.PausedMS), "snapshot-16MiB-ms")
		b.ReportMetric(float64(big64.PausedMS), "snapshot-64MiB-ms")
	}
}

// BenchmarkExecPaths measures, in one run, the round trip of `exec true`
// in a sandbox on a standalone worker along the two paths a client may
// take: through the control plane with its API key (the server forwards
// to the worker), and through a data-plane proxy with the sandbox's
// token, which touches no database. Medians of 30 each, and their ratio.
//
//	go test -run '^$' -bench ExecPaths -benchtime 1x ./internal/server
func BenchmarkExecPaths(b *testing.B) {
	release := guesttest.AcquireSlot(b)
	defer release()
	dataDir := newDataDir(b)
	token := "bench-worker-token-0123456789abcdef"
	if err := os.WriteFile(filepath.Join(dataDir, WorkerTokenFile), []byte(token+"\n"), 0o600); err != nil {
		b.Fatalf("setup: %v", err)
	}
	proxy := startProxy(b, token)
	ts := startServerTB(b, Config{DataDir: dataDir, NoWorker: true, DataPlaneURL: proxy})
	startWorker(b, ts, 2048)
	ts.deleteAllOnCleanup(b) // before the worker stops
	ctx := b.Context()
	var sb api.Sandbox
	testenv.Eventually(b, time.Minute, func() bool { // until the worker has registered
		var err error
		sb, err = ts.client.CreateSandbox(ctx, api.CreateSandbox{})
		return err == nil
	})
	// The same raw request along each path: to the server with the API
	// key, and to the proxy with the sandbox's data-plane token.
	exec := func(base, credential string) time.Duration {
		t0 := time.Now()
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(`{"command":["true"]}`))
		req.Header.Set("Authorization", "Bearer "+credential)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatalf("exec via %s: %v", base, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"exit"`) {
			b.Fatalf("exec via %s = %d %s", base, resp.StatusCode, body)
		}
		return time.Since(t0)
	}
	viaServer := func() time.Duration { return exec(ts.url, ts.key) }
	viaPlane := func() time.Duration { return exec(sb.DataPlane.URL, sb.DataPlane.Token) }
	for b.Loop() {
		var server, plane []time.Duration
		for range 30 {
			server = append(server, viaServer())
			plane = append(plane, viaPlane())
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(median(server)), "server-exec-ms")
		b.ReportMetric(ms(median(plane)), "dataplane-exec-ms")
		b.ReportMetric(float64(median(plane))/float64(median(server)), "dataplane/server")
	}
}
