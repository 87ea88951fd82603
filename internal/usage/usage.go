// Package usage keeps a bounded history of what a sandbox uses: CPU,
// memory (the guest's and its VMM's), disk and network, sampled by the
// worker's agent heartbeat every few seconds.
//
// A History holds the last hour at the sampling interval and, older than
// that, one sample per minute for a day: about 220 KiB per sandbox at
// the default 5 s. It lives with the sandbox on its worker and goes when
// the sandbox leaves it (deleted, suspended, moved).
package usage

import (
	"sync"
	"time"

	"space/api"
	"space/internal/agent/proto"
)

// Bounds of a History.
const (
	// FineSamples is how many samples at the sampling interval are kept.
	FineSamples = 720
	// CoarseSamples is how many one-minute samples are kept.
	CoarseSamples = 1440
	// MaxAnswer bounds the samples one Range returns.
	MaxAnswer = FineSamples + CoarseSamples + 1 // and the minute being built
)

// History is one sandbox's usage over time. The zero value is an empty
// History, ready to use. It is safe for concurrent use.
type History struct {
	mu sync.Mutex
	// +checklocks:mu
	fine ring
	// +checklocks:mu
	coarse ring
	// +checklocks:mu
	minute minuteAcc // the coarse sample being built
	// +checklocks:mu
	last *proto.GuestUsage // the reading before, for CPU deltas
}

// Add records a reading taken at t: the guest's counters g (nil if the
// agent gave none) and the VMM's PSS in bytes (0 if unknown). The CPU
// share is taken against the reading before; a guest whose counters
// went back (it was restored from a snapshot) starts anew.
func (h *History) Add(t time.Time, g *proto.GuestUsage, vmmPSS int64) {
	s := api.UsageSample{Time: t.UTC(), VMMPSSBytes: vmmPSS}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fine.cap == 0 {
		h.fine.cap, h.coarse.cap = FineSamples, CoarseSamples
	}
	if g != nil {
		s.CPUs = g.CPUs
		s.MemTotalBytes, s.MemUsedBytes, s.MemCacheBytes = clamp(g.MemTotal), clamp(g.MemUsed), clamp(g.MemCache)
		s.DiskTotalBytes, s.DiskUsedBytes = clamp(g.DiskTotal), clamp(g.DiskUsed)
		s.NetRxBytes, s.NetTxBytes = clamp(g.NetRx), clamp(g.NetTx)
		if p := h.last; p != nil && g.CPUTotal > p.CPUTotal && g.CPUBusy >= p.CPUBusy {
			pct := float64(g.CPUBusy-p.CPUBusy) / float64(g.CPUTotal-p.CPUTotal) * 100
			s.CPUUsedPct = float64(int64(min(pct, 100)*100)) / 100
		}
		c := *g
		h.last = &c
	}
	if last, ok := h.fine.newest(); ok && !s.Time.After(last.Time) {
		return // the clock went back: keep the series in order
	}
	if old, evicted := h.fine.push(s); evicted {
		h.fold(old)
	}
}

// fold adds a sample leaving the fine ring to its minute.
//
// +checklocks:h.mu
func (h *History) fold(s api.UsageSample) {
	m := s.Time.Truncate(time.Minute)
	if h.minute.n > 0 && !m.Equal(h.minute.at) {
		h.coarse.push(h.minute.sample())
		h.minute = minuteAcc{}
	}
	h.minute.add(m, s)
}

// Range returns the samples taken from start to end, both included
// (zero times leave that side open), oldest first: one-minute samples
// for the time before the fine history begins, then every sample.
func (h *History) Range(start, end time.Time) []api.UsageSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []api.UsageSample
	for _, s := range h.coarse.all() {
		if within(s.Time, start, end) {
			out = append(out, s)
		}
	}
	if h.minute.n > 0 {
		if s := h.minute.sample(); within(s.Time, start, end) {
			out = append(out, s)
		}
	}
	for _, s := range h.fine.all() {
		if within(s.Time, start, end) {
			out = append(out, s)
		}
	}
	return out
}

// within reports whether t is in [start, end]; a zero bound is open.
func within(t, start, end time.Time) bool {
	return (start.IsZero() || !t.Before(start)) && (end.IsZero() || !t.After(end))
}

func clamp(v uint64) int64 {
	if v > 1<<62 {
		return 1 << 62
	}
	return int64(v)
}

// ring is a bounded queue of samples, oldest dropped first.
type ring struct {
	cap   int
	buf   []api.UsageSample
	start int // index of the oldest once full
}

// push appends s and returns the sample it evicted, if the ring was
// full.
func (r *ring) push(s api.UsageSample) (api.UsageSample, bool) {
	if len(r.buf) < r.cap {
		r.buf = append(r.buf, s)
		return api.UsageSample{}, false
	}
	old := r.buf[r.start]
	r.buf[r.start] = s
	r.start = (r.start + 1) % r.cap
	return old, true
}

func (r *ring) all() []api.UsageSample {
	out := make([]api.UsageSample, 0, len(r.buf))
	out = append(out, r.buf[r.start:]...)
	return append(out, r.buf[:r.start]...)
}

func (r *ring) newest() (api.UsageSample, bool) {
	if len(r.buf) == 0 {
		return api.UsageSample{}, false
	}
	return r.buf[(r.start+len(r.buf)-1)%len(r.buf)], true
}

// minuteAcc builds one minute's sample: the mean CPU share, the last
// value of everything else.
type minuteAcc struct {
	at     time.Time
	n      int
	cpuSum float64
	last   api.UsageSample
}

func (m *minuteAcc) add(at time.Time, s api.UsageSample) {
	m.at, m.last = at, s
	m.n++
	m.cpuSum += s.CPUUsedPct
}

func (m *minuteAcc) sample() api.UsageSample {
	s := m.last
	s.Time = m.at
	s.CPUUsedPct = float64(int64(m.cpuSum/float64(m.n)*100)) / 100
	return s
}

// Saved is what a History holds, to keep it across a restart of its
// worker (the worker writes it when it closes and reads it back when it
// adopts the sandbox again).
type Saved struct {
	Fine   []api.UsageSample `json:"fine"`
	Coarse []api.UsageSample `json:"coarse"` // the minute being built included
	Last   *proto.GuestUsage `json:"last,omitempty"`
}

// Save returns what h holds.
func (h *History) Save() Saved {
	h.mu.Lock()
	defer h.mu.Unlock()
	sv := Saved{Fine: h.fine.all(), Coarse: h.coarse.all(), Last: h.last}
	if h.minute.n > 0 {
		sv.Coarse = append(sv.Coarse, h.minute.sample())
	}
	return sv
}

// Load replaces what h holds by sv, keeping the newest samples that fit
// its bounds, in time order.
func (h *History) Load(sv Saved) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fine, h.coarse = ring{cap: FineSamples}, ring{cap: CoarseSamples}
	h.minute, h.last = minuteAcc{}, sv.Last
	for _, s := range sv.Coarse {
		if last, ok := h.coarse.newest(); !ok || s.Time.After(last.Time) {
			h.coarse.push(s)
		}
	}
	for _, s := range sv.Fine {
		if last, ok := h.fine.newest(); !ok || s.Time.After(last.Time) {
			h.fine.push(s) // an evicted one is older than the minutes kept
		}
	}
}
