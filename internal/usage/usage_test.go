package usage

import (
	"sort"
	"testing"
	"time"

	"space/internal/agent/proto"
)

func reading(busy, total uint64) *proto.GuestUsage {
	return &proto.GuestUsage{CPUs: 2, CPUBusy: busy, CPUTotal: total, MemTotal: 1 << 30, MemUsed: 100 << 20, DiskTotal: 4 << 30, DiskUsed: 1 << 30}
}

func TestCPUShare(t *testing.T) {
	var h History
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	h.Add(t0, reading(100, 1000), 50<<20)
	h.Add(t0.Add(5*time.Second), reading(350, 2000), 60<<20) // 250 of 1000 ticks busy
	h.Add(t0.Add(10*time.Second), reading(10, 100), 60<<20)  // restored: counters went back
	h.Add(t0.Add(15*time.Second), nil, 70<<20)               // an old agent: host figures only
	got := h.Range(time.Time{}, time.Time{})
	if len(got) != 4 {
		t.Fatalf("%d samples, want 4", len(got))
	}
	if got[0].CPUUsedPct != 0 || got[1].CPUUsedPct != 25 || got[2].CPUUsedPct != 0 {
		t.Errorf("cpu shares %v %v %v, want 0 25 0", got[0].CPUUsedPct, got[1].CPUUsedPct, got[2].CPUUsedPct)
	}
	if got[1].MemUsedBytes != 100<<20 || got[1].VMMPSSBytes != 60<<20 || got[3].VMMPSSBytes != 70<<20 || got[3].MemTotalBytes != 0 {
		t.Errorf("levels: %+v / %+v", got[1], got[3])
	}
	if r := h.Range(t0.Add(5*time.Second), t0.Add(10*time.Second)); len(r) != 2 {
		t.Errorf("range of two samples gave %d", len(r))
	}
	h.Add(t0.Add(12*time.Second), reading(1, 1), 0) // the clock went back
	if n := len(h.Range(time.Time{}, time.Time{})); n != 4 {
		t.Errorf("a sample older than the newest was kept: %d samples", n)
	}
}

// TestBounded fills two days at 5 s: the history keeps an hour of fine
// samples and a day of minutes, in order.
func TestBounded(t *testing.T) {
	var h History
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	var busy, total uint64
	for i := range 2 * 24 * 720 {
		busy, total = busy+uint64(i%2)*50, total+100 // alternately 0% and 50%
		h.Add(t0.Add(time.Duration(i)*5*time.Second), reading(busy, total), 1)
	}
	all := h.Range(time.Time{}, time.Time{})
	if len(all) > MaxAnswer || len(all) < FineSamples+CoarseSamples-1 {
		t.Fatalf("%d samples kept, want about %d", len(all), MaxAnswer)
	}
	if !sort.SliceIsSorted(all, func(i, j int) bool { return all[i].Time.Before(all[j].Time) }) {
		t.Fatal("samples out of order")
	}
	last := all[len(all)-1].Time
	if span := last.Sub(all[0].Time); span < 24*time.Hour || span > 26*time.Hour {
		t.Errorf("history spans %v, want about a day and an hour", span)
	}
	coarse := all[0]
	if coarse.Time.Second() != 0 || coarse.CPUUsedPct < 24 || coarse.CPUUsedPct > 26 {
		t.Errorf("a minute sample: %+v, want on the minute with a mean near 25%%", coarse)
	}
	if got := all[len(all)-FineSamples:]; got[1].Time.Sub(got[0].Time) != 5*time.Second {
		t.Errorf("the last hour is not at the sampling interval")
	}
}

// TestSaveLoad: a history saved and loaded answers the same ranges.
func TestSaveLoad(t *testing.T) {
	var h History
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	for i := range 2000 {
		h.Add(t0.Add(time.Duration(i)*5*time.Second), reading(uint64(i)*10, uint64(i)*100), 1)
	}
	var back History
	back.Load(h.Save())
	if got, want := back.Range(time.Time{}, time.Time{}), h.Range(time.Time{}, time.Time{}); len(got) != len(want) || !got[len(got)-1].Time.Equal(want[len(want)-1].Time) {
		t.Errorf("loaded history has %d samples, want %d", len(got), len(want))
	}
	// It goes on from where it was: the next CPU share is a delta of
	// the saved reading.
	back.Add(t0.Add(2000*5*time.Second), reading(1999*10+50, 1999*100+100), 1)
	if all := back.Range(time.Time{}, time.Time{}); all[len(all)-1].CPUUsedPct != 50 {
		t.Errorf("CPU share after load = %v, want 50", all[len(all)-1].CPUUsedPct)
	}
}
