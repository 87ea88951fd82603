package controlplane

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"space/internal/errkind"
	"space/internal/workerproto"
)

// Probing. Every worker is asked for its status every probeInterval, each
// on its own, so a worker that hangs (a stopped process, a host that
// drops packets) delays only its own probe; one whose last probe failed,
// or whose last answer is older than probeStale, takes no new sandboxes.
const (
	probeInterval = 2 * time.Second
	probeTimeout  = 3 * time.Second
	probeStale    = 3 * probeInterval
	// syncInterval is how often the workers other replicas heard from
	// are loaded from the store.
	syncInterval = 5 * probeInterval
)

// probe is what this process last learned of a worker by asking it.
type probe struct {
	status   workerproto.Status // the last answer
	answered bool               // some probe succeeded: status holds its answer
	err      error              // the last probe's failure, or nil
	at       time.Time          // when the last probe ended; zero before one did
	pending  bool               // a probe is out
	since    time.Time          // when the probe out began
}

// lateProbe is how long a probe may be out before placement stops
// waiting for its worker.
const lateProbe = time.Second

// probeAll starts a probe of every worker that has none out, and returns
// at once; the probes end within probeTimeout and are waited for by
// waitProbes.
func (s *Server) probeAll(ctx context.Context) {
	for _, wk := range s.workerList() {
		s.mu.Lock()
		p := s.probes[wk.ID()]
		if p == nil {
			p = &probe{}
			s.probes[wk.ID()] = p
		}
		busy := p.pending
		if !busy {
			p.pending, p.since = true, s.now()
		}
		s.mu.Unlock()
		if busy {
			continue // the last one hangs still: it fails on its own
		}
		s.probing.Go(func() { s.probeOne(ctx, wk) })
	}
}

// probeOne asks wk for its status and records the answer.
func (s *Server) probeOne(ctx context.Context, wk Worker) {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	st, err := wk.Status(pctx)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.probes[wk.ID()]
	if p == nil {
		p = &probe{}
		s.probes[wk.ID()] = p
	}
	was := p.err
	p.pending, p.at, p.err = false, s.now(), err
	if err == nil {
		p.status, p.answered = st, true
	}
	switch {
	case err != nil && was == nil && ctx.Err() == nil:
		s.log.Warn("worker not answering", "worker_id", wk.ID(), "err", err)
	case err == nil && was != nil:
		s.log.Info("worker answering again", "worker_id", wk.ID())
	}
}

// runProbes probes every worker every probeInterval until ctx ends, then
// waits for the probes out.
func (s *Server) runProbes(ctx context.Context) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	lastSync := s.now()
	for {
		if s.now().Sub(lastSync) >= syncInterval {
			lastSync = s.now()
			if err := s.loadWorkers(ctx, true); err != nil && ctx.Err() == nil {
				s.log.Warn("load workers from the store", "err", err)
			}
		}
		s.probeAll(ctx)
		select {
		case <-ctx.Done():
			s.probing.Wait()
			return
		case <-t.C:
		}
	}
}

// answering reports whether wk's last probe succeeded recently, or
// whether none ended yet (then only its heartbeat counts).
func (s *Server) answering(wk Worker) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.probes[wk.ID()]
	if p == nil || p.at.IsZero() {
		return true
	}
	return p.err == nil && s.now().Sub(p.at) < probeStale
}

// capacities returns the status of each of workers, asked anew of each
// at once (capacity moves with every create and delete), each within
// probeTimeout. A worker whose probe is out for longer than lateProbe
// (it hangs) or recently failed is not asked, and is left out, as is one
// that cannot say.
func (s *Server) capacities(ctx context.Context, workers []Worker) map[string]workerproto.Status {
	out := make(map[string]workerproto.Status, len(workers))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, wk := range workers {
		s.mu.Lock()
		p := s.probes[wk.ID()]
		// Waiting would not help: the probe loop tries it again.
		hung := p != nil && ((p.pending && s.now().Sub(p.since) > lateProbe) || (!p.pending && p.err != nil && s.now().Sub(p.at) < probeStale))
		if !hung {
			if p == nil {
				p = &probe{}
				s.probes[wk.ID()] = p
			}
			if !p.pending {
				p.pending, p.since = true, s.now()
			}
		}
		s.mu.Unlock()
		if hung {
			continue
		}
		wg.Go(func() {
			s.probeOne(ctx, wk)
			s.mu.Lock()
			p := s.probes[wk.ID()]
			ok := p != nil && p.err == nil
			var st workerproto.Status
			if ok {
				st = p.status
			}
			s.mu.Unlock()
			if ok {
				mu.Lock()
				out[wk.ID()] = st
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// place picks, among workers, the one with the most free memory that
// fits spec, from what their probes say. A sandbox from a snapshot
// (pl.snapshot) goes only to a worker whose VMM matches the one that
// took it (pl.vmm; see compat.go), one whose match is certain first.
func (s *Server) place(ctx context.Context, workers []Worker, spec workerproto.Spec, pl placement) (Worker, error) {
	caps := s.capacities(ctx, workers)
	type cand struct {
		w     Worker
		exact bool
		free  int64
	}
	var (
		cands   []cand
		matched int
		// largest is the largest disk a matched worker can ever give,
		// or -1 when one does not say (a worker from before disk
		// admission).
		largest int64
	)
	for _, w := range workers {
		st, ok := caps[w.ID()]
		if !ok {
			continue
		}
		match, exact := pl.vmm.match(st.Capabilities)
		if !match {
			continue
		}
		matched++
		if st.DiskMiB == 0 || largest < 0 {
			largest = -1
		} else {
			largest = max(largest, st.DiskMiB)
		}
		if st.VCPUs-st.UsedVCPUs >= spec.VCPUs && st.MemoryMiB-st.UsedMemoryMiB >= spec.MemoryMiB && diskFits(st, spec) {
			cands = append(cands, cand{w, exact, st.MemoryMiB - st.UsedMemoryMiB})
		}
	}
	if len(cands) == 0 {
		refused := s.metrics.placementRefusals
		switch {
		case len(caps) == 0:
			refused.WithLabelValues(refusedNoWorker).Inc()
		case matched > 0 && largest >= 0 && spec.DiskMiB > largest:
			refused.WithLabelValues(refusedDiskSize).Inc()
		case matched == 0 && pl.vmm.Kind != "":
			refused.WithLabelValues(refusedVMM).Inc()
		default:
			refused.WithLabelValues(refusedNoCapacity).Inc()
		}
		switch {
		case matched > 0 && largest >= 0 && spec.DiskMiB > largest:
			return nil, fmt.Errorf("disk_mib %d is more than any worker can give: the largest gives %d MiB: %w",
				spec.DiskMiB, largest, errkind.InvalidArgument)
		case pl.vmm.Kind == "":
			return nil, noRoom(spec)
		case matched == 0:
			return nil, s.noVMM(pl.snapshot, pl.vmm, caps)
		}
		return nil, noRoomRunning(spec, pl.snapshot, pl.vmm)
	}
	sort.SliceStable(cands, func(i, j int) bool {
		if cands[i].exact != cands[j].exact {
			return cands[i].exact
		}
		return cands[i].free > cands[j].free
	})
	return cands[0].w, nil
}

// diskFits reports whether a worker of status st has room for spec's
// disk now, as far as it says (a worker from before disk admission says
// nothing, and checks nothing). The worker's own admission has the last
// word: on reflink storage it counts guest memory files too.
func diskFits(st workerproto.Status, spec workerproto.Spec) bool {
	return st.DiskMiB == 0 || st.FreeDiskMiB >= spec.DiskMiB
}
