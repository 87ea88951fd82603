package qemu

import (
	"io"
	"os"
	"sync"
)

// cappedFile writes up to limit bytes into a file and then discards (but
// counts) the rest. Write never fails, so a copier draining a guest-fed
// stream keeps draining it: a stalled reader would stall the guest.
type cappedFile struct {
	// f is owned and closed by Close, after the last Write.
	f     *os.File // +checklocksignore
	limit int64    // +checklocksignore: immutable

	mu sync.Mutex
	// +checklocks:mu
	written int64
	// +checklocks:mu
	dropped int64
	// +checklocks:mu
	err error // first write error; later bytes are dropped
}

func newCappedFile(f *os.File, limit int64) *cappedFile {
	return &cappedFile{f: f, limit: limit}
}

func (w *cappedFile) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := min(int64(len(p)), w.limit-w.written)
	if w.err != nil {
		keep = 0
	}
	if keep > 0 {
		n, err := w.f.Write(p[:keep])
		w.written += int64(n)
		if err != nil {
			w.err = err
		}
		keep = int64(n)
	}
	w.dropped += int64(len(p)) - keep
	return len(p), nil
}

// Dropped returns how many bytes were discarded.
func (w *cappedFile) Dropped() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped
}

// Err returns the first error writing the file, or nil.
func (w *cappedFile) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *cappedFile) Close() error { return w.f.Close() }

// tail returns up to n bytes from the end of the file at path.
func tail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(fi.Size()-n, 0)
	return io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
}
