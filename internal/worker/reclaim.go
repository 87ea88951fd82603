package worker

import (
	"context"
	"errors"
	"time"

	"space/internal/agent/client"
	"space/internal/errkind"
	"space/internal/sandbox"
)

// Idle reclaim. A guest keeps the files it read in its page cache, so a
// sandbox that once built or read a large tree goes on holding that much
// host memory while it sits idle, which is most of an agent sandbox's
// life. Once a running sandbox has had no data-plane request for
// Config.ReclaimIdleAfter, the worker asks its agent to drop the guest's
// clean caches and compact its free memory (proto.OpMemoryReclaim); the
// balloon device's free page reporting then hands the freed blocks back,
// the next measurement sees the lower PSS, and the sandbox's charge
// (memory.go) drops with it. Nothing a guest process holds is touched:
// the cost is reading dropped files again from the (host-cached) disk.
// Each idle spell is reclaimed once; a request starts a new spell.

const (
	defaultReclaimIdleAfter = 2 * time.Minute
	// reclaimTimeout bounds one reclaim: an idle guest takes well under a
	// second. It also bounds how long the reclaim holds up a lifecycle
	// operation of the sandbox.
	reclaimTimeout = 10 * time.Second
)

// reclaimIdle reclaims the cached memory of every sandbox idle for
// Config.ReclaimIdleAfter and not reclaimed since it was last used.
func (w *Worker) reclaimIdle() {
	if w.cfg.ReclaimIdleAfter < 0 {
		return
	}
	for _, s := range w.all() {
		if a := s.reclaimDue(time.Now(), w.cfg.ReclaimIdleAfter); a != nil {
			w.reclaim(s, a)
		}
	}
}

// reclaimDue returns the agent to ask if s is due a reclaim at now, or nil.
func (s *sbx) reclaimDue(now time.Time, idle time.Duration) *client.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.agent
	switch {
	case s.rec.State != sandbox.Running || s.vm == nil || a == nil || a == s.noReclaim:
		return nil
	case s.active > 0 || now.Sub(s.lastActive) < idle || !s.reclaimed.Before(s.lastActive):
		return nil
	}
	select {
	case <-a.Done():
		return nil // the next request reconnects; the next round sees it
	default:
	}
	return a
}

// reclaim asks s's agent a to reclaim, unless a lifecycle operation or the
// fence holds s: the next round tries again. The analyzer does not follow
// TryLock; the locking is in these few lines.
//
// +checklocksignore
func (w *Worker) reclaim(s *sbx, a *client.Client) {
	if !s.op.TryLock() {
		return
	}
	defer s.op.Unlock()
	if !s.vcpus.TryLock() {
		return
	}
	fenced := s.fenced
	s.vcpus.Unlock()
	if fenced {
		return // paused: the guest cannot answer
	}
	w.reclaimNow(s, a)
}

// reclaimNow asks s's agent a to reclaim and records that it did.
func (w *Worker) reclaimNow(s *sbx, a *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), reclaimTimeout)
	defer cancel()
	r, err := a.ReclaimMemory(ctx)
	s.mu.Lock()
	s.reclaimed = time.Now()
	if errors.Is(err, errkind.FailedPrecondition) {
		s.noReclaim = a
	}
	id := s.rec.ID
	s.mu.Unlock()
	if err != nil {
		w.log.Info("reclaim idle sandbox's memory", "sandbox_id", id, "err", err)
		return
	}
	w.log.Debug("reclaimed idle sandbox's memory", "sandbox_id", id, "freed_mib", (r.FreeAfter-r.FreeBefore)>>20)
}
