package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/internal/agent/guesttest"
)

// checkpointNow takes a manual checkpoint of sandbox id through the API
// and returns it with how long the call took.
func checkpointNow(b *testing.B, ts *testServer, id string) (api.Checkpoint, time.Duration) {
	b.Helper()
	t0 := time.Now()
	req, _ := http.NewRequestWithContext(b.Context(), "POST", ts.url+"/v1/sandboxes/"+id+"/checkpoints", nil)
	req.Header.Set("Authorization", "Bearer "+ts.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatalf("checkpoint %s: %v", id, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	took := time.Since(t0)
	var cp api.Checkpoint
	if resp.StatusCode != http.StatusCreated {
		b.Fatalf("POST checkpoints of %s = %d %s", id, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, &cp); err != nil {
		b.Fatalf("checkpoint %s: decode %q: %v", id, raw, err)
	}
	return cp, took
}

// benchShell runs cmd in sandbox id and returns its output; a failure
// ends the benchmark.
func benchShell(b *testing.B, ts *testServer, id, cmd string) string {
	b.Helper()
	var out, errOut bytes.Buffer
	exit, err := ts.client.Exec(b.Context(), id, sh(cmd), &out, &errOut)
	if err != nil || exit.Code != 0 {
		b.Fatalf("exec %q in %s: %+v, %v: %s", cmd, id, exit, err, errOut.String())
	}
	return out.String()
}

// pace waits until at (the spacing between checkpoints is what is
// measured, not a synchronization).
func pace(b *testing.B, at time.Time) {
	b.Helper()
	select {
	case <-b.Context().Done():
		b.Fatalf("benchmark ended while pacing: %v", b.Context().Err())
	case <-time.After(time.Until(at)):
	}
}

// middle returns the median of xs (the upper one of an even count).
func middle[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

const mib = 1 << 20

// inMiB lists byte counts in MiB.
func inMiB(ns []int64) string {
	var out []string
	for _, n := range ns {
		out = append(out, fmt.Sprintf("%.3f", float64(n)/mib))
	}
	return strings.Join(out, ", ")
}

// checkpointFigures are the per-checkpoint figures of a series.
type checkpointFigures struct {
	stored, read, paused []int64
	calls                []time.Duration
}

func (f *checkpointFigures) add(cp api.Checkpoint, call time.Duration) {
	f.stored = append(f.stored, cp.StoredBytes)
	f.read = append(f.read, cp.ReadBytes)
	f.paused = append(f.paused, cp.PausedMS)
	f.calls = append(f.calls, call)
}

func (f *checkpointFigures) String() string {
	return fmt.Sprintf("stored %.3f MiB median, %.3f max; read %.1f MiB median, %.1f max; paused %d ms median, %d max; call %v median, %v max",
		float64(middle(f.stored))/mib, float64(slices.Max(f.stored))/mib,
		float64(middle(f.read))/mib, float64(slices.Max(f.read))/mib,
		middle(f.paused), slices.Max(f.paused),
		median(f.calls).Round(time.Millisecond), slices.Max(f.calls).Round(time.Millisecond))
}

// BenchmarkCheckpoints measures, in one run on a real 512 MiB guest, what
// a checkpoint costs. Idle: after the first checkpoint (which stores what
// differs from the template), idleShort manual checkpoints spaced
// shortGap apart, then idleLong spaced longGap apart, each series with
// its median and max stored bytes, read bytes and pause (the issue's
// goals: an idle checkpoint stores under 1 MiB and pauses the guest at
// most 20 ms). Busy: a loop in the guest that writes 4 MiB of random
// bytes to tmpfs and hashes them, counting its iterations, runs through
// four phases of busyPhase each, without checkpoints, with one every
// busyEvery, with, without (the order cancels a drift of the host);
// it reports the throughput with checkpoints over that without, the
// guest work one checkpoint costs, and what that cost would be at one
// checkpoint a minute (goal: under 5%). The phases are timed on the
// host, not by the guest, whose clock need not count its pauses.
//
// Measured on a 2-core TCG host (2026-12-03), one run of 240 s with
// nothing else running (a run while other VMs ran paused the idle guest
// 15 ms median, 26 max, and cost the busy one 0.4% at one a minute):
//
//	first checkpoint       stored 19.4 MiB, read 93.3 MiB, paused 15 ms
//	idle, 8 spaced 3 s     stored 0.45 MiB median, 1.09 max (the first after the guest's
//	                       start; the others 0.42-0.76); read 23.7 MiB median, 39.7 max;
//	                       paused 10 ms median, 11 max; call 146 ms median
//	idle, 3 spaced 30 s    stored 0.70 MiB median, 0.92 max (0.92, 0.70, 0.54); paused 10 ms median
//	busy, 12 every 5 s     stored 5.0 MiB median, 7.3 max; paused 21 ms median, 27 max;
//	                       call 279 ms median
//	busy throughput        with/without 1.004 (4.72 against 4.70 iterations/s): below the
//	                       noise, so about 0% at one checkpoint a minute
//
//	go test -timeout 20m -run '^$' -bench BenchmarkCheckpoints -benchtime 1x ./internal/server/
func BenchmarkCheckpoints(b *testing.B) {
	// The pauses and the throughput need a quiet host: no other test VMs.
	release := guesttest.AcquireAllSlots(b)
	defer release()
	ts := startServerB(b, Config{})
	ctx := b.Context()
	const (
		idleShort = 8
		shortGap  = 3 * time.Second
		idleLong  = 3
		longGap   = 30 * time.Second
		busyPhase = 30 * time.Second
		busyEvery = 5 * time.Second
	)
	// No policy: every checkpoint here is taken by hand, on time.
	sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 512, Checkpoints: &api.CheckpointPolicy{}})
	if err != nil {
		b.Fatalf("create: %v", err)
	}
	benchShell(b, ts, sb.ID, "true")
	for b.Loop() {
		// Idle: nothing runs but what the template starts.
		first, firstCall := checkpointNow(b, ts, sb.ID)
		var short, long checkpointFigures
		next := time.Now()
		for range idleShort {
			next = next.Add(shortGap)
			pace(b, next)
			short.add(checkpointNow(b, ts, sb.ID))
		}
		for range idleLong {
			next = time.Now().Add(longGap)
			pace(b, next)
			long.add(checkpointNow(b, ts, sb.ID))
		}
		b.ReportMetric(float64(first.StoredBytes)/mib, "first-stored-MiB")
		b.ReportMetric(float64(middle(short.stored))/mib, "idle-stored-MiB-median")
		b.ReportMetric(float64(slices.Max(short.stored))/mib, "idle-stored-MiB-max")
		b.ReportMetric(float64(middle(short.read))/mib, "idle-read-MiB-median")
		b.ReportMetric(float64(slices.Max(short.read))/mib, "idle-read-MiB-max")
		b.ReportMetric(float64(middle(short.paused)), "idle-paused-ms-median")
		b.ReportMetric(float64(slices.Max(short.paused)), "idle-paused-ms-max")
		b.ReportMetric(float64(median(short.calls).Milliseconds()), "idle-call-ms-median")
		b.ReportMetric(float64(middle(long.stored))/mib, "idle-30s-stored-MiB-median")
		b.ReportMetric(float64(slices.Max(long.stored))/mib, "idle-30s-stored-MiB-max")
		b.ReportMetric(float64(middle(long.paused)), "idle-30s-paused-ms-median")

		// Busy: the loop runs through all four phases; its count is read
		// at each boundary.
		work := "head -c 4M /dev/urandom > /dev/shm/work; sha256sum /dev/shm/work > /dev/null"
		if _, err := ts.client.StartDetached(ctx, sb.ID, api.Exec{Detach: true,
			Shell: "n=0; while :; do " + work + "; n=$((n+1)); echo $n > /tmp/iters; done"}); err != nil {
			b.Fatalf("start the busy loop: %v", err)
		}
		iters := func() (int, time.Time) {
			at := time.Now()
			out := benchShell(b, ts, sb.ID, "cat /tmp/iters 2>/dev/null || echo 0")
			n, err := strconv.Atoi(strings.TrimSpace(out))
			if err != nil {
				b.Fatalf("busy loop's count %q: %v", out, err)
			}
			return n, at
		}
		pace(b, time.Now().Add(3*time.Second)) // past its first iterations
		var (
			busy                    checkpointFigures
			without, with           [2]float64 // iterations, seconds
			phaseWithout, phaseWith []float64  // iterations per second, per phase
		)
		count, phaseStart := iters()
		for _, checkpointing := range []bool{false, true, true, false} {
			end := phaseStart.Add(busyPhase)
			if checkpointing {
				for at := phaseStart; at.Before(end); at = at.Add(busyEvery) {
					pace(b, at)
					busy.add(checkpointNow(b, ts, sb.ID))
				}
			}
			pace(b, end) // or past it, after a slow last checkpoint
			n, at := iters()
			done, secs := float64(n-count), at.Sub(phaseStart).Seconds()
			if checkpointing {
				with[0], with[1] = with[0]+done, with[1]+secs
				phaseWith = append(phaseWith, done/secs)
			} else {
				without[0], without[1] = without[0]+done, without[1]+secs
				phaseWithout = append(phaseWithout, done/secs)
			}
			count, phaseStart = n, at
		}
		rateWithout, rateWith := without[0]/without[1], with[0]/with[1]
		// The iterations the phases with checkpoints lost, per checkpoint,
		// in seconds of the guest's work without them.
		lost := rateWithout*with[1] - with[0]
		costSecs := lost / float64(len(busy.calls)) / rateWithout
		perMinute := costSecs / 60 * 100
		b.ReportMetric(rateWith/rateWithout, "busy-throughput-with/without")
		b.ReportMetric(costSecs, "busy-cost-per-checkpoint-s")
		b.ReportMetric(perMinute, "busy-cost-1-per-min-%")
		b.ReportMetric(float64(middle(busy.stored))/mib, "busy-stored-MiB-median")
		b.ReportMetric(float64(middle(busy.paused)), "busy-paused-ms-median")
		b.ReportMetric(float64(slices.Max(busy.paused)), "busy-paused-ms-max")
		b.ReportMetric(float64(median(busy.calls).Milliseconds()), "busy-call-ms-median")

		b.Logf("first checkpoint: stored %.1f MiB, read %.1f MiB, paused %d ms, call %v",
			float64(first.StoredBytes)/mib, float64(first.ReadBytes)/mib, first.PausedMS, firstCall.Round(time.Millisecond))
		b.Logf("idle, %d spaced %v: %s; stored each %s MiB", idleShort, shortGap, &short, inMiB(short.stored))
		b.Logf("idle, %d spaced %v: %s; stored each %s MiB", idleLong, longGap, &long, inMiB(long.stored))
		b.Logf("busy, %d checkpoints every %v: %s", len(busy.calls), busyEvery, &busy)
		b.Logf("busy throughput: %.2f iterations/s without checkpoints (phases %.2f, %.2f), %.2f with (phases %.2f, %.2f): ratio %.3f",
			rateWithout, phaseWithout[0], phaseWithout[1], rateWith, phaseWith[0], phaseWith[1], rateWith/rateWithout)
		b.Logf("cost per checkpoint %.2f s of guest work: %.1f%% at one checkpoint a minute (goal under 5%%)", costSecs, perMinute)
	}
}
