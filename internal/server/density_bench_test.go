package server

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	procfs "space/internal/proc"
)

// BenchmarkIdleDensity fills this host with idle sandboxes of the default
// size (512 MiB) under the worker's default capacity, and after every
// step reports how many run, their memory (PSS of each VMM process,
// measured here), the CPU their VMMs use while idle, the host's MemAvailable, and `exec true` round trips
// in a sample of them. Each sandbox runs exec true once as it is created:
// that first exec in a freshly restored guest faults the agent's and the
// program's pages in (hundreds of ms under TCG), so it is reported apart
// (first-exec-p50/p90) and the sample measures warm round trips. It stops
// when the worker refuses a sandbox, when exec true's p90 passes 200 ms,
// or at SPACE_BENCH_DENSITY_MAX sandboxes (default 60). It takes every
// test VM slot: run it alone.
//
//	go test -run '^$' -bench IdleDensity -benchtime 1x -timeout 60m ./internal/server
func BenchmarkIdleDensity(b *testing.B) {
	release := guesttest.AcquireAllSlots(b)
	defer release()
	ts := startServerB(b, Config{})
	c := ts.client
	ctx := b.Context()
	limit := 60
	if s := os.Getenv("SPACE_BENCH_DENSITY_MAX"); s != "" {
		limit, _ = strconv.Atoi(s)
	}
	const step, p90Limit = 10, 200 * time.Millisecond
	for b.Loop() {
		var sbs []api.Sandbox
		var firsts []time.Duration
		held, heldP90, heldPSS, heldCPU := 0, time.Duration(0), 0.0, 0.0
		for len(sbs) < limit {
			sb, err := c.CreateSandbox(ctx, api.CreateSandbox{})
			if err != nil {
				var e *client.Error
				// The worker refuses (memory), or the control plane finds
				// no worker with room (disk: each sandbox's disk_mib is
				// promised whole).
				if errors.As(err, &e) && (e.Code == api.CodeResourceExhausted || e.Code == api.CodeUnavailable) {
					b.Logf("the worker refused sandbox %d: %v", len(sbs)+1, err)
					break
				}
				b.Fatalf("CreateSandbox %d = %v", len(sbs)+1, err)
			}
			sbs = append(sbs, sb)
			firsts = append(firsts, execTrue(b, c, sb.ID))
			if len(sbs)%step != 0 && len(sbs) != limit {
				continue
			}
			// Idle, as agent sandboxes mostly are: what do their VMMs
			// burn meanwhile?
			const idle = 5 * time.Second
			cpu0 := vmmCPU(sbs)
			time.Sleep(idle)
			idleCPU := float64(vmmCPU(sbs)-cpu0) / float64(idle) / float64(len(sbs))
			p50, p90 := execTrueLatency(b, c, sbs)
			pss := meanPSSMiB(sbs)
			b.Logf("%d sandboxes: mean PSS %.0f MiB, idle CPU %.1f%% of a core each, host MemAvailable %d MiB, exec true p50 %v p90 %v",
				len(sbs), pss, idleCPU*100, memAvailableMiB(), p50.Round(time.Millisecond), p90.Round(time.Millisecond))
			if p90 > p90Limit {
				break
			}
			held, heldP90, heldPSS, heldCPU = len(sbs), p90, pss, idleCPU
		}
		b.ReportMetric(float64(held), "idle-sandboxes-held")
		b.ReportMetric(heldPSS, "pss-per-idle-sandbox-MiB")
		b.ReportMetric(heldCPU*100, "idle-cpu-per-sandbox-%")
		b.ReportMetric(float64(heldP90.Microseconds())/1000, "exec-true-p90-ms")
		if len(firsts) > 0 {
			slices.Sort(firsts)
			b.ReportMetric(float64(firsts[len(firsts)/2].Microseconds())/1000, "first-exec-p50-ms")
			b.ReportMetric(float64(firsts[len(firsts)*9/10].Microseconds())/1000, "first-exec-p90-ms")
		}
		for _, sb := range sbs {
			c.DeleteSandbox(ctx, sb.ID)
		}
	}
}

// execTrueLatency runs exec true three times in each of up to 15
// sandboxes picked at random and returns the p50 and p90 round trips.
func execTrueLatency(b *testing.B, c *client.Client, sbs []api.Sandbox) (p50, p90 time.Duration) {
	var rtts []time.Duration
	for _, i := range rand.Perm(len(sbs))[:min(15, len(sbs))] {
		for range 3 {
			rtts = append(rtts, execTrue(b, c, sbs[i].ID))
		}
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2], rtts[len(rtts)*9/10]
}

// execTrue runs exec true in sandbox id and returns its round trip.
func execTrue(b *testing.B, c *client.Client, id string) time.Duration {
	t0 := time.Now()
	if exit, err := c.Exec(b.Context(), id, api.Exec{Command: []string{"true"}}, nil, nil); err != nil || exit.Code != 0 {
		b.Fatalf("exec true in %s = %+v, %v", id, exit, err)
	}
	return time.Since(t0)
}

// vmmCPU is the CPU time the sandboxes' VMM processes have used so far.
func vmmCPU(sbs []api.Sandbox) time.Duration {
	var sum time.Duration
	for _, sb := range sbs {
		if sb.VM == nil || sb.VM.PID == 0 {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", sb.VM.PID)); err == nil {
			if t, err := procfs.ParseCPUTime(b); err == nil {
				sum += t
			}
		}
	}
	return sum
}

// meanPSSMiB is the mean PSS of the sandboxes' VMM processes.
func meanPSSMiB(sbs []api.Sandbox) float64 {
	var sum int64
	n := 0
	for _, sb := range sbs {
		if sb.VM == nil || sb.VM.PID == 0 {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", sb.VM.PID))
		if err != nil {
			continue
		}
		if pss, ok, err := procfs.ParsePss(b); err == nil && ok {
			sum += pss
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(sum>>20) / float64(n)
}

func memAvailableMiB() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	n, _ := procfs.ParseMemAvailable(b)
	return n >> 20
}
