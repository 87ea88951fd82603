package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Purge removes everything the worker made on this host, for an
// uninstall: it stops refilling pools, deletes every sandbox it has
// (pool members too), each with its VM, tap, network namespace, gateway,
// control group and files, then removes its control group parent and its
// run root, and closes the worker. The data directory (snapshots, warm
// templates, records) is the caller's to remove after: this process may
// have it mounted (package storage). A sandbox that cannot be deleted is
// reported and the rest still go.
func (w *Worker) Purge(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return fmt.Errorf("purge worker %s: closed", w.cfg.ID)
	}
	clear(w.pools)
	ids := make([]string, 0, len(w.sandboxes))
	for id := range w.sandboxes {
		ids = append(ids, id)
	}
	w.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := w.Delete(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete %s: %w", id, err))
		}
	}
	// A member the pool loop was restoring meanwhile goes too.
	if err := w.Close(); err != nil {
		errs = append(errs, err)
	}
	w.mu.Lock()
	left := make([]string, 0, len(w.sandboxes))
	for id := range w.sandboxes {
		left = append(left, id)
	}
	w.mu.Unlock()
	for _, id := range left {
		if err := w.destroyDetached(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", id, err))
		}
	}
	if err := w.removeCgroupNamed(ctx, w.cgroupParent()); err != nil {
		errs = append(errs, fmt.Errorf("remove control group %s: %w", w.cgroupParent(), err))
	}
	if err := os.RemoveAll(w.cfg.RunRoot); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("purge worker %s: %w", w.cfg.ID, errors.Join(errs...))
	}
	w.log.Info("purged: no sandbox, network, control group or run file of this worker is left")
	return nil
}

// destroyDetached removes a sandbox after Close detached it (a pool
// member restored while Purge ran): its control group is killed with
// whatever runs in it, and its files go.
func (w *Worker) destroyDetached(ctx context.Context, id string) error {
	s, err := w.get(id)
	if err != nil {
		return nil
	}
	s.op.Lock()
	defer s.op.Unlock()
	if err := w.destroy(ctx, s); err != nil {
		return err
	}
	w.mu.Lock()
	delete(w.sandboxes, id)
	w.mu.Unlock()
	return nil
}
