package worker

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"space/internal/sandbox"
)

// Disk accounting. A sandbox's writable layer is a sparse file of exactly
// its disk_mib (an ext4 file system the host makes), on the worker's
// storage (Config.DataDir), which every sandbox shares; on reflink
// storage its guest memory file lives there too. A sparse file costs
// what the guest has written, but the guest may write all of it: its
// size is a promise. The worker keeps every promise: it admits a sandbox
// only if its promise fits into the storage's free space after what
// every sandbox it has may still write (its promise less what it has
// written) and after Config.DiskReserveMiB, which covers what is not
// promised (snapshots, warm templates, blocks a disk shares with a
// snapshot and rewrites). Where the storage is a sparse image its free
// space is at most that of the host's file system under it
// (Config.StorageBacking). A guest that fills its disk then gets ENOSPC
// from its own file system, never from the host's, and no sandbox can
// take another's space.

const (
	// rwImage is the writable layer's file in a sandbox's disk
	// directory (guestvm).
	rwImage = "rw.img"
	// memoryFile is the guest memory's file there on reflink storage.
	memoryFile = "memory"
	// maxDefaultDiskReserveMiB caps the default disk reserve.
	maxDefaultDiskReserveMiB = 8 << 10
)

// diskState is the worker's storage, in bytes: of its file system, or of
// the host's under it where that is smaller (Config.StorageBacking).
type diskState struct {
	size, free  int64 // the file system's size and what is available in it
	outstanding int64 // what the sandboxes may still write
	reserve     int64 // Config.DiskReserveMiB
}

// capacity is the most one sandbox's promise could ever be.
func (d diskState) capacity() int64 { return max(0, d.size-d.reserve) }

// room is what a new sandbox's promise may be now.
func (d diskState) room() int64 { return max(0, d.free-d.outstanding-d.reserve) }

// diskReserve is the reserve on a file system of size bytes.
func (w *Worker) diskReserve(size int64) int64 {
	if w.cfg.DiskReserveMiB > 0 {
		return w.cfg.DiskReserveMiB << 20
	}
	return min(size/10, maxDefaultDiskReserveMiB<<20)
}

// promise is what a sandbox of spec may write on the storage.
func (w *Worker) promise(spec Spec) int64 {
	p := spec.DiskMiB << 20
	if w.cfg.ReflinkStorage {
		p += spec.MemoryMiB << 20
	}
	return p
}

// outstanding is what sandbox s of spec may still write: its promise less
// what its files take. A writable layer larger than disk_mib (one made
// when sizes were rounded up to whole GiB) promises its size.
func (w *Worker) outstanding(s *sbx, spec Spec) int64 {
	promise := w.promise(spec)
	var taken int64
	var st unix.Stat_t
	if unix.Stat(filepath.Join(s.diskDir(), rwImage), &st) == nil {
		promise += max(0, st.Size-spec.DiskMiB<<20)
		taken += st.Blocks * 512
	}
	if w.cfg.ReflinkStorage && unix.Stat(filepath.Join(s.diskDir(), memoryFile), &st) == nil {
		taken += st.Blocks * 512
	}
	return max(0, promise-taken)
}

// disk measures the storage and what the sandboxes other than except
// (or nil) may still write on it; withPool counts pool members too (a
// create that needs their room evicts them).
func (w *Worker) disk(except *sbx, withPool bool) (diskState, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(w.cfg.DataDir, &fs); err != nil {
		return diskState{}, fmt.Errorf("storage: %w", err)
	}
	d := diskState{size: int64(fs.Blocks) * fs.Bsize, free: int64(fs.Bavail) * fs.Bsize}
	if w.cfg.StorageBacking != "" {
		var b unix.Statfs_t
		if err := unix.Statfs(w.cfg.StorageBacking, &b); err != nil {
			return diskState{}, fmt.Errorf("storage backing: %w", err)
		}
		d.size = min(d.size, int64(b.Blocks)*b.Bsize)
		d.free = min(d.free, int64(b.Bavail)*b.Bsize)
	}
	d.reserve = w.diskReserve(d.size)
	for _, s := range w.all() {
		if s == except {
			continue
		}
		s.mu.Lock()
		state, spec, member := s.rec.State, s.rec.Spec, s.rec.Pool != ""
		s.mu.Unlock()
		if state == sandbox.Failed || state == sandbox.Deleted || member && !withPool {
			continue // its disk grows no more, or it makes room
		}
		d.outstanding += w.outstanding(s, spec)
	}
	return d, nil
}

// admitDisk returns nil if the storage can keep the promise of a new
// sandbox s of spec, and otherwise an error wrapping ErrNoCapacity that
// says what was asked and what is free. The caller holds w.admit, and s
// is in w.sandboxes.
func (w *Worker) admitDisk(s *sbx, spec Spec) error {
	d, err := w.disk(s, true)
	if err != nil {
		return err
	}
	need := w.promise(spec)
	what := fmt.Sprintf("a disk of %d MiB", spec.DiskMiB)
	if w.cfg.ReflinkStorage {
		what += fmt.Sprintf(" and a memory file of %d MiB", spec.MemoryMiB)
	}
	switch {
	case need > d.capacity():
		return fmt.Errorf("%s asked, more than this worker can ever give: %d MiB of storage, %d MiB of it kept in reserve: %w",
			what, d.size>>20, d.reserve>>20, ErrNoCapacity)
	case need > d.room():
		return fmt.Errorf("%s asked, %d MiB free for it: %d MiB free on the worker's storage, %d MiB of it promised to its sandboxes, %d MiB kept in reserve: %w",
			what, d.room()>>20, d.free>>20, d.outstanding>>20, d.reserve>>20, ErrNoCapacity)
	}
	return nil
}
