package worker

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/sandbox"
)

// writebackEvery is how often the worker starts writing back what guests
// dirtied in their memory files on reflink storage.
//
// A reflink of a file with dirty pages writes them back first, so a
// snapshot (or fork) pays for every page dirtied since the last
// writeback; the kernel on its own leaves pages dirty for up to 30
// seconds. Writing back in the background keeps that debt to about what
// a guest dirties in this interval, and makes a snapshot's cost follow
// the guest's recent writes rather than its RAM.
const writebackEvery = time.Second

// writeback runs until Close, starting writeback of every running
// sandbox's memory file each writebackEvery. Starting is asynchronous
// (SYNC_FILE_RANGE_WRITE): the guests never wait for it.
func (w *Worker) writeback() {
	defer w.watchers.Done()
	tick := time.NewTicker(writebackEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		for _, path := range w.memoryFiles() {
			if err := startWriteback(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				w.log.Debug("memory writeback", "file", path, "err", err)
			}
		}
	}
}

// memoryFiles returns the memory files of the running sandboxes.
func (w *Worker) memoryFiles() []string {
	all := w.all()
	var paths []string
	for _, s := range all {
		s.mu.Lock()
		running := s.rec.State == sandbox.Running
		s.mu.Unlock()
		if running {
			paths = append(paths, filepath.Join(s.diskDir(), "memory"))
		}
	}
	return paths
}

func startWriteback(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}
