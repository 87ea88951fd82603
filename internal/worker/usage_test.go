package worker

import (
	"errors"
	"testing"
	"time"

	"space/internal/errkind"
	"space/internal/store"
	"space/internal/testenv"
	"space/internal/workerproto"
)

// TestUsageHistory: the heartbeat samples a running sandbox into its
// usage history, stops sampling while it is paused, and answers ranges.
// The fake guest's jail has no /proc, so its samples carry the host's
// figures only; the guest's are read by the agent (its own test) and
// checked on a real VM in cmd/space's end-to-end test.
func TestUsageHistory(t *testing.T) {
	h := newFakeHost(t)
	w := h.startWith(t, fastHeartbeat)
	ctx := t.Context()
	id := store.NewSandboxID()
	if _, err := w.Create(ctx, CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	count := func() int {
		m, err := w.Usage(ctx, id, workerproto.UsageRequest{})
		if err != nil {
			t.Fatalf("Usage = %v", err)
		}
		return len(m.Samples)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count() >= 3 })
	m, err := w.Usage(ctx, id, workerproto.UsageRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m.IntervalSeconds != testHeartbeat.Seconds() {
		t.Errorf("IntervalSeconds = %v, want %v", m.IntervalSeconds, testHeartbeat.Seconds())
	}
	for i := 1; i < len(m.Samples); i++ {
		if !m.Samples[i].Time.After(m.Samples[i-1].Time) {
			t.Fatalf("samples out of order at %d", i)
		}
	}
	// A range ending before the first sample holds none.
	early, err := w.Usage(ctx, id, workerproto.UsageRequest{End: m.Samples[0].Time.Add(-time.Millisecond)})
	if err != nil || len(early.Samples) != 0 {
		t.Errorf("Usage before the first sample = %d samples, %v; want none", len(early.Samples), err)
	}
	if _, err := w.Usage(ctx, id, workerproto.UsageRequest{Start: time.Now(), End: time.Now().Add(-time.Hour)}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Usage with end before start = %v, want InvalidArgument", err)
	}
	if _, err := w.Usage(ctx, store.NewSandboxID(), workerproto.UsageRequest{}); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Usage of an unknown sandbox = %v, want NotFound", err)
	}

	// Paused: no sampling.
	if _, err := w.Pause(ctx, id); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	time.Sleep(2 * testHeartbeat) // a beat under way when it paused may still land
	n := count()
	time.Sleep(5 * testHeartbeat)
	if got := count(); got != n {
		t.Errorf("a paused sandbox was sampled: %d samples, then %d", n, got)
	}

	// A worker that restarts keeps the history of the VMs it adopts.
	if err := w.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	w2 := h.startWith(t, fastHeartbeat)
	again, err := w2.Usage(ctx, id, workerproto.UsageRequest{})
	if err != nil || len(again.Samples) != n {
		t.Errorf("Usage after the worker restarted = %d samples, %v; want the %d from before", len(again.Samples), err, n)
	}
}

// BenchmarkUsageSample measures one sample of the usage sampler: the
// heartbeat's health call (the agent reads its /proc and statfs) and the
// record. Its wall time bounds the CPU of both ends, so
// core-%-20-idle-sandboxes (one sample of each every 5 s) bounds what
// sampling 20 idle sandboxes costs; the goal is at most 1% of a core.
// The fake guest's agent runs on the host, as a guest's would in its VM.
//
//	go test -run '^$' -bench BenchmarkUsageSample ./internal/worker/
func BenchmarkUsageSample(b *testing.B) {
	w := newFakeHost(b).startWith(b, func(c *Config) { c.AgentHeartbeat = -1 }) // no heartbeat of its own
	id := store.NewSandboxID()
	if _, err := w.Create(b.Context(), CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		b.Fatalf("Create = %v", err)
	}
	s, err := w.get(id)
	if err != nil {
		b.Fatal(err)
	}
	s.mu.Lock()
	vm, a := s.vm, s.agent
	s.mu.Unlock()
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		h, err := w.probe(b.Context(), s, vm, a)
		if err != nil || h == nil {
			b.Fatalf("probe = %v, %v", h, err)
		}
		s.usage.Add(time.Now(), h.Usage, 0)
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(per)*20/float64(5*time.Second)*100, "core-%-20-idle-sandboxes")
}
