package worker

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"space/internal/proc"
)

// Memory accounting. A sandbox counts against the worker's memory
// capacity by what its VMM process measurably holds, its PSS (resident
// pages, each shared one in part), plus Config.MemoryHeadroomMiB, and
// never by more than its size; until its first measurement, by its size.
// An idle restored sandbox holds a fraction of its size, so a host holds
// as many as its memory allows, not as many as their sizes add up to.
// Admission also wants the host itself to have Config.MemoryReserveMiB
// available (MemAvailable), whatever the charges say: guests that grow
// back toward their size stop new ones before they strain the host.

const (
	// defaultHeadroomMiB is what a measured sandbox may grow before the
	// next measurement without being over its charge.
	defaultHeadroomMiB = 64
	// miBPerVCPU sets the default vCPU capacity from the memory one: a
	// vCPU per this much, so that memory, not vCPUs, bounds a fleet of
	// idle sandboxes.
	miBPerVCPU = 128
	// memorySampleEvery is how often running sandboxes are measured.
	memorySampleEvery = 10 * time.Second
)

// defaultVCPUs is the vCPU capacity offered when Config.VCPUs is 0.
func defaultVCPUs(memoryMiB int64) int {
	return max(4*runtime.NumCPU(), int(memoryMiB/miBPerVCPU))
}

// measureMemory reads the PSS of s's VMM process.
func (s *sbx) measureMemory() {
	s.mu.Lock()
	vm := s.vm
	s.mu.Unlock()
	if vm == nil {
		return
	}
	info, err := vm.Info()
	if err != nil || info.PID <= 0 {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", info.PID))
	if err != nil {
		return
	}
	pss, ok, err := proc.ParsePss(b)
	if err != nil || !ok {
		return
	}
	s.mu.Lock()
	if s.vm == vm {
		s.pss = pss
	}
	s.mu.Unlock()
}

// chargeMiBLocked is what s counts against the worker's memory.
//
// +checklocks:s.mu
func (s *sbx) chargeMiBLocked(headroomMiB int64) int64 {
	size := s.rec.Spec.MemoryMiB
	if s.pss <= 0 || s.vm == nil {
		return size
	}
	return min(size, s.pss>>20+headroomMiB)
}

// memoryLoop measures the running sandboxes every memorySampleEvery.
func (w *Worker) memoryLoop() {
	defer w.watchers.Done()
	tick := time.NewTicker(memorySampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		for _, s := range w.all() {
			s.measureMemory()
		}
		w.reclaimIdle()
	}
}

// all returns the worker's sandboxes.
func (w *Worker) all() []*sbx {
	w.mu.Lock()
	defer w.mu.Unlock()
	all := make([]*sbx, 0, len(w.sandboxes))
	for _, s := range w.sandboxes {
		all = append(all, s)
	}
	return all
}

// hostAvailableMiB returns the host's MemAvailable.
func hostAvailableMiB() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	n, err := proc.ParseMemAvailable(b)
	return n >> 20, err
}
