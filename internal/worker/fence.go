package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/vmm"
	"space/internal/workerproto"
)

// The fence: once the worker has taken a lease of the leader's (the Lease
// verb), it serves its sandboxes only while one holds, so that the
// leader may restore them on another worker after a longer silence (see
// workerproto.LeaseRequest). While none holds, data-plane requests and
// the verbs that start or change a guest are refused (ErrNoLease), and
// the guests of its sandboxes are paused by the fence: through the VM's
// own pause (vmm.Pauser), not the cgroup freezer, because it needs no
// control groups (they may be off), it leaves the VMM process able to
// answer a stop, a snapshot or a resume (a frozen QEMU answers no QMP,
// so a removal would wait for its SIGKILL fallback), and it is what
// Pause does, on every driver. The record is not changed: a sandbox the
// fence paused is still running to its record, and the next lease
// resumes it (sbx.fenced tells the two apart), while one its user paused
// stays paused.
//
// The epoch the worker knows is kept in DataDir/fenceFile, written after
// the removals a newer epoch asks for (a crash in between redoes them)
// and before the lease that brings it is granted. A worker that finds
// that file at Start enforces from the start: it holds no lease until
// the leader's next call. A worker that never took a lease (an embedded
// worker, an older control plane) enforces nothing.
//
// Internal sandboxes (pool members, warm template captures) are the
// worker's own: no one else knows of them, serves them or recovers them,
// so the fence neither pauses nor removes them; pools are not refilled
// while no lease holds.

// fenceFile is the name, in DataDir, of the file holding the worker's
// fencing epoch.
const fenceFile = "fence.json"

// fenceRecord is fenceFile's content.
type fenceRecord struct {
	Epoch int64 `json:"epoch"`
}

// maxKeep bounds LeaseRequest.Keep (a request body holds fewer anyway).
const maxKeep = 1 << 16

// fenceRetry is how often the fence tries again to pause the guests it
// could not, and pauses those that started meanwhile, while no lease
// holds.
const fenceRetry = time.Second

// fencePauseTimeout bounds the fence's pause or resume of one VM.
const fencePauseTimeout = 10 * time.Second

// ErrNoLease is answered to data-plane requests, and returned by the
// verbs that start or change a guest, while the worker enforces a fence
// and holds no lease.
var ErrNoLease = fmt.Errorf("worker lost its lease with the control plane: it serves no sandbox until the control plane renews it: %w", errkind.Unavailable)

// noLeaseRetryAfter is the Retry-After of a data-plane answer refused
// for ErrNoLease, in seconds.
const noLeaseRetryAfter = "2"

// Lease takes the leader's lease (workerproto.Fencer): with an epoch
// newer than the worker's, it first stops and removes every sandbox of
// the worker's that req.Keep does not list, then records the epoch on
// disk; then it serves for req.TTLMS from when the call came, and
// resumes the guests the fence paused. An epoch older than the worker's
// is a Conflict error; a bad request is InvalidArgument. Calls go one at
// a time.
func (w *Worker) Lease(ctx context.Context, req workerproto.LeaseRequest) (workerproto.LeaseReply, error) {
	received := time.Now() // the lease counts from here: never longer than the leader thinks
	if !w.cfg.Fencing {
		return workerproto.LeaseReply{}, fmt.Errorf("worker %s takes no lease (it is embedded in its control plane, or not configured to fence): %w", w.cfg.ID, errkind.FailedPrecondition)
	}
	if err := checkLease(req); err != nil {
		return workerproto.LeaseReply{}, err
	}
	w.lease.Lock()
	defer w.lease.Unlock()
	w.mu.Lock()
	known, fencing := w.epoch, w.fencing
	w.mu.Unlock()
	var removed []string
	switch {
	case req.Epoch < known:
		return workerproto.LeaseReply{}, fmt.Errorf("lease of fencing epoch %d: worker %s knows epoch %d, which is newer: %w",
			req.Epoch, w.cfg.ID, known, errkind.Conflict)
	case req.Epoch > known:
		// Nothing serves while what the new epoch took away goes.
		w.revokeLease()
		var err error
		removed, err = w.removeAllBut(ctx, req.Keep, req.Epoch)
		if err != nil {
			return workerproto.LeaseReply{}, fmt.Errorf("lease of fencing epoch %d (worker %s knew %d): %w", req.Epoch, w.cfg.ID, known, err)
		}
		if err := w.saveEpoch(req.Epoch); err != nil {
			return workerproto.LeaseReply{}, err
		}
		w.log.Info("fencing epoch raised", "epoch", req.Epoch, "was", known, "removed", len(removed))
	case !fencing:
		// The first lease, at the epoch the worker has (0): a restart
		// must enforce too.
		if err := w.saveEpoch(req.Epoch); err != nil {
			return workerproto.LeaseReply{}, err
		}
	}
	w.mu.Lock()
	w.epoch, w.fencing = req.Epoch, true
	w.leaseUntil = received.Add(time.Duration(req.TTLMS) * time.Millisecond)
	held := w.leaseHeld
	w.leaseHeld = true
	w.mu.Unlock()
	if !held {
		w.log.Info("lease of the control plane taken", "epoch", req.Epoch, "ttl_ms", req.TTLMS)
	}
	w.kickFence()
	w.thawAll(ctx)
	return workerproto.LeaseReply{Epoch: req.Epoch, Removed: removed}, nil
}

// checkLease checks a LeaseRequest; errors are InvalidArgument.
func checkLease(req workerproto.LeaseRequest) error {
	maxTTL := workerproto.MaxLeaseTTL.Milliseconds()
	switch {
	case req.TTLMS < 1 || req.TTLMS > maxTTL:
		return fmt.Errorf("lease ttl_ms %d: want 1..%d: %w", req.TTLMS, maxTTL, errkind.InvalidArgument)
	case req.Epoch < 0:
		return fmt.Errorf("lease epoch %d: want 0 or more: %w", req.Epoch, errkind.InvalidArgument)
	case len(req.Keep) > maxKeep:
		return fmt.Errorf("lease keeps %d sandboxes: want at most %d: %w", len(req.Keep), maxKeep, errkind.InvalidArgument)
	}
	for _, id := range req.Keep {
		if !store.ValidSandboxID(id) {
			return fmt.Errorf("lease keeps sandbox id %.40q: %w", id, errkind.InvalidArgument)
		}
	}
	return nil
}

// removeAllBut deletes, as Delete does, every sandbox of the worker's
// that keep does not list (internal ones aside), and returns those it
// removed, in ID order. The caller holds w.lease.
func (w *Worker) removeAllBut(ctx context.Context, keep []string, epoch int64) ([]string, error) {
	kept := make(map[string]bool, len(keep))
	for _, id := range keep {
		kept[id] = true
	}
	w.mu.Lock()
	var ids []string
	for id, s := range w.sandboxes {
		if !s.internal() && !kept[id] {
			ids = append(ids, id)
		}
	}
	w.mu.Unlock()
	slices.Sort(ids)
	var removed []string
	var errs []error
	for _, id := range ids {
		err := w.Delete(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			// Deleted meanwhile.
		case err != nil:
			errs = append(errs, err)
		default:
			removed = append(removed, id)
			w.log.Info("sandbox removed: a newer fencing epoch took it from this worker", "sandbox_id", id, "epoch", epoch)
		}
	}
	return removed, errors.Join(errs...)
}

// saveEpoch records epoch in DataDir durably.
func (w *Worker) saveEpoch(epoch int64) error {
	if err := writeJSONFile(w.cfg.DataDir, fenceFile, fenceRecord{Epoch: epoch}); err != nil {
		return fmt.Errorf("record fencing epoch %d: %w", epoch, err)
	}
	return nil
}

// loadEpoch reads the epoch a previous process recorded, if any: the
// worker then enforces the fence from the start. The caller is Start.
func (w *Worker) loadEpoch() error {
	b, err := os.ReadFile(filepath.Join(w.cfg.DataDir, fenceFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fencing epoch: %w", err)
	}
	var r fenceRecord
	err = json.Unmarshal(b, &r)
	if err == nil && r.Epoch < 0 {
		err = fmt.Errorf("epoch %d is negative", r.Epoch)
	}
	if err != nil {
		// Guessing an epoch could serve sandboxes recovered elsewhere.
		return fmt.Errorf("fencing epoch in %s: %w", filepath.Join(w.cfg.DataDir, fenceFile), err)
	}
	w.mu.Lock()
	w.epoch, w.fencing = r.Epoch, true
	w.mu.Unlock()
	w.log.Info("fencing epoch found: serving nothing until the control plane's lease", "epoch", r.Epoch)
	return nil
}

// revokeLease ends the lease now, if one holds.
func (w *Worker) revokeLease() {
	w.mu.Lock()
	w.fencing, w.leaseUntil = true, time.Time{}
	w.mu.Unlock()
	w.kickFence()
}

// serving reports whether the worker serves its sandboxes now: it
// enforces no fence, or a lease holds.
func (w *Worker) serving() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.fencing || time.Now().Before(w.leaseUntil)
}

// leased reports whether a lease holds now (Status.Leased).
func (w *Worker) leased() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fencing && time.Now().Before(w.leaseUntil)
}

// checkServing returns ErrNoLease for operation op while the worker
// serves nothing.
func (w *Worker) checkServing(op string) error {
	if w.serving() {
		return nil
	}
	w.kickFence()
	return fmt.Errorf("%s: %w", op, ErrNoLease)
}

// fenced answers h's data-plane requests 503 while the worker serves
// nothing.
func (w *Worker) fenced(h http.HandlerFunc) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		if !w.serving() {
			w.kickFence() // pause the guests now, if the loop has not yet
			rw.Header().Set("Retry-After", noLeaseRetryAfter)
			httpapi.WriteError(rw, fmt.Errorf("sandbox %s: %w", r.PathValue("id"), ErrNoLease))
			return
		}
		h(rw, r)
	}
}

func (w *Worker) kickFence() {
	select {
	case w.fenceKick <- struct{}{}:
	default:
	}
}

// fenceLoop pauses the guests when the lease runs out, and again every
// fenceRetry while none holds, until Close.
func (w *Worker) fenceLoop() {
	defer w.watchers.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-w.stop
		cancel()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		fencing, until := w.fencing, w.leaseUntil
		lost := fencing && w.leaseHeld && !time.Now().Before(until)
		if lost {
			w.leaseHeld = false
		}
		w.mu.Unlock()
		if lost {
			w.log.Warn("lease of the control plane ran out: pausing the guests, serving nothing until it comes again")
		}
		wait := time.Hour // until a lease comes
		if fencing {
			if wait = time.Until(until); wait <= 0 {
				w.freezeAll(ctx)
				wait = fenceRetry
			}
		}
		timer.Reset(wait)
		select {
		case <-w.stop:
			return
		case <-w.fenceKick:
		case <-timer.C:
		}
	}
}

// fenceable returns the sandboxes the fence pauses and resumes: all but
// the worker's own.
func (w *Worker) fenceable() []*sbx {
	w.mu.Lock()
	defer w.mu.Unlock()
	all := make([]*sbx, 0, len(w.sandboxes))
	for _, s := range w.sandboxes {
		if !s.internal() {
			all = append(all, s)
		}
	}
	return all
}

// freezeAll pauses every running guest the fence has not paused yet,
// all at once, if no lease holds.
func (w *Worker) freezeAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range w.fenceable() {
		wg.Go(func() {
			s.vcpus.Lock()
			defer s.vcpus.Unlock()
			if !s.fenced {
				w.freezeLocked(ctx, s)
			}
		})
	}
	wg.Wait()
}

// holdFence pauses s's guest if no lease holds and its record says it
// runs, whether or not the fence paused it before: for the end of an
// operation that may have started or resumed it meanwhile (a create or
// restore, a snapshot, a recovery).
func (w *Worker) holdFence(ctx context.Context, s *sbx) {
	if s.internal() {
		return
	}
	s.vcpus.Lock()
	defer s.vcpus.Unlock()
	w.freezeLocked(ctx, s)
}

// freezeLocked pauses s's guest and marks it paused by the fence if no
// lease holds and its record says it runs. It reports a pause that
// failed; the fence tries again.
//
// +checklocks:s.vcpus
func (w *Worker) freezeLocked(ctx context.Context, s *sbx) {
	if w.serving() {
		return
	}
	s.mu.Lock()
	id, state, vm := s.rec.ID, s.rec.State, s.vm
	s.mu.Unlock()
	if state != sandbox.Running || vm == nil {
		return
	}
	p, ok := vm.(vmm.Pauser)
	if !ok {
		w.log.Error("sandbox cannot be paused without a lease: its vmm cannot pause", "sandbox_id", id)
		return
	}
	pctx, cancel := context.WithTimeout(ctx, fencePauseTimeout)
	defer cancel()
	defer s.stopVM()()
	if err := p.Pause(pctx); err != nil {
		if ctx.Err() == nil {
			w.log.Error("pause sandbox without a lease", "sandbox_id", id, "err", err)
		}
		return
	}
	if !s.fenced {
		w.log.Info("sandbox paused: no lease of the control plane", "sandbox_id", id)
	}
	s.fenced = true
	s.fencedNow.Store(true)
}

// thawAll resumes the guests the fence paused whose records still say
// they run, once a lease holds; those their user paused meanwhile stay
// paused. A resume that fails is logged, and tried again at the next
// lease.
func (w *Worker) thawAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range w.fenceable() {
		wg.Go(func() {
			s.vcpus.Lock()
			defer s.vcpus.Unlock()
			if !s.fenced || !w.serving() {
				return
			}
			s.mu.Lock()
			id, state, vm := s.rec.ID, s.rec.State, s.vm
			s.mu.Unlock()
			if p, ok := vm.(vmm.Pauser); ok && state == sandbox.Running {
				pctx, cancel := context.WithTimeout(ctx, fencePauseTimeout)
				defer cancel()
				defer s.stopVM()()
				if err := p.Resume(pctx); err != nil {
					w.log.Error("resume sandbox under a new lease", "sandbox_id", id, "err", err)
					return
				}
				w.log.Info("sandbox resumed: lease of the control plane taken", "sandbox_id", id)
			}
			s.fenced = false
			s.fencedNow.Store(false)
		})
	}
	wg.Wait()
}
