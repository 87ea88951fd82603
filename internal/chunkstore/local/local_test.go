package local

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkstoretest"
)

func TestConformance(t *testing.T) {
	chunkstoretest.Run(t, func(t *testing.T) chunkstore.Backend {
		b, err := New(t.TempDir())
		if err != nil {
			t.Fatalf("setup: New = %v", err)
		}
		return b
	})
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n += fi.Size()
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return n
}

// TestNewBytesIsDirectoryGrowth measures the directory itself, not what
// List reports.
func TestNewBytesIsDirectoryGrowth(t *testing.T) {
	dir := t.TempDir()
	b, err := New(dir)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	s, err := chunkstore.New(chunkstore.Config{Backend: b})
	if err != nil {
		t.Fatalf("chunkstore.New = %v", err)
	}
	src := filepath.Join(t.TempDir(), "mem")
	f, err := os.Create(src)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	f.Truncate(8 << 20)
	f.WriteAt(bytes.Repeat([]byte("a"), 3<<20), 0)
	f.WriteAt(bytes.Repeat([]byte("b"), 100), 6<<20)
	f.Close()
	files := []chunkstore.File{{Name: "mem", Path: src}}

	for i, id := range []string{"one", "two"} {
		if i == 1 {
			g, _ := os.OpenFile(src, os.O_WRONLY, 0)
			g.WriteAt([]byte("changed"), 1<<20)
			g.Close()
		}
		before := dirBytes(t, dir)
		_, st, err := s.Put(t.Context(), id, files, chunkstore.PutOptions{Domain: "test"})
		if err != nil {
			t.Fatalf("Put(%s) = %v", id, err)
		}
		if grown := dirBytes(t, dir) - before; grown != st.NewBytes {
			t.Errorf("Put(%s): directory grew by %d bytes, NewBytes = %d (%+v)", id, grown, st.NewBytes, st)
		}
	}
}

// TestCrashLeavesNoPartialObject: a Put that fails midway, or a crash that
// leaves a temporary file, never shows up under a key.
func TestCrashLeavesNoPartialObject(t *testing.T) {
	dir := t.TempDir()
	b, err := New(dir)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	err = b.Put(t.Context(), "chunks/ab/x", &failAfter{n: 1000}, 4096)
	if err == nil {
		t.Fatalf("Put(failing reader) = nil, want an error")
	}
	if _, err := os.Stat(filepath.Join(dir, "chunks/ab/x")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after failed Put the final file: %v, want none", err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, tmpDir)); len(left) != 0 {
		t.Errorf("failed Put left temporary files %v", left)
	}

	// What crashes between write and rename left behind, a day ago and
	// just now (maybe another process's Put in progress).
	old, fresh := filepath.Join(dir, tmpDir, "put-1"), filepath.Join(dir, tmpDir, "put-2")
	os.WriteFile(old, []byte("partial"), 0o600)
	os.WriteFile(fresh, []byte("partial"), 0o600)
	dayAgo := time.Now().Add(-staleTemp - time.Minute)
	os.Chtimes(old, dayAgo, dayAgo)
	b, err = New(dir)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	var keys []string
	b.List(t.Context(), "", func(o chunkstore.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	if len(keys) != 0 {
		t.Errorf("List after crash = %q, want nothing", keys)
	}
	if _, err := os.Stat(old); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("New kept the day-old temporary file: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("New removed a fresh temporary file: %v", err)
	}
}

type failAfter struct{ n int }

func (f *failAfter) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("disk on fire")
	}
	k := min(len(p), f.n)
	f.n -= k
	return k, nil
}
