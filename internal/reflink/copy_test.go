package reflink

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"space/internal/errkind"
	"syscall"
	"testing"
)

func TestCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	const size = 64 << 20
	f, err := os.Create(src)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	head := bytes.Repeat([]byte("head"), 1024)
	tail := bytes.Repeat([]byte("tail"), 1024)
	if _, err := f.WriteAt(head, 0); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := f.WriteAt(tail, 40<<20); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}

	dst := filepath.Join(dir, "dst.img")
	if err := os.WriteFile(dst, []byte("old content"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := Copy(t.Context(), src, dst); err != nil {
		t.Fatalf("Copy = %v", err)
	}
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("read src: %v", err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatalf("read dst: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Copy: dst (%d bytes) differs from src (%d bytes)", len(got), len(want))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatalf("stat dst: %v", err)
	}
	if used := st.Blocks * 512; used > 4<<20 {
		t.Errorf("Copy: dst uses %d bytes of disk for %d bytes of data, want it sparse", used, len(head)+len(tail))
	}

	if err := Copy(t.Context(), dst, dst); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Copy(dst, dst) = %v, want %v", err, errkind.InvalidArgument)
	}
	if err := Copy(t.Context(), filepath.Join(dir, "missing"), filepath.Join(dir, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Copy(missing) = %v, want %v", err, os.ErrNotExist)
	}
}

// TestMove moves a file within one file system (the same inode arrives)
// and across two (a copy arrives and the source goes).
func TestMove(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, []byte("spent"), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	before, _ := os.Stat(src)
	if err := Move(t.Context(), src, dst); err != nil {
		t.Fatalf("Move = %v", err)
	}
	if after, err := os.Stat(dst); err != nil || !os.SameFile(before, after) {
		t.Errorf("Move within %s: dst %v, %v; want the source's inode", dir, after, err)
	}
	if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("source after Move: %v, want gone", err)
	}

	other, err := os.MkdirTemp("/dev/shm", "move-test-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer os.RemoveAll(other)
	var a, b syscall.Stat_t
	if syscall.Stat(dir, &a) != nil || syscall.Stat(other, &b) != nil || a.Dev == b.Dev {
		t.Fatalf("setup: %s and %s are on one file system", dir, other)
	}
	far := filepath.Join(other, "far")
	if err := Move(t.Context(), dst, far); err != nil {
		t.Fatalf("Move across file systems = %v", err)
	}
	if got, err := os.ReadFile(far); err != nil || string(got) != "spent" {
		t.Errorf("moved across file systems: %q, %v; want the content", got, err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("source after Move across file systems: %v, want gone", err)
	}
	if err := Move(t.Context(), filepath.Join(dir, "none"), far); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Move of a missing file = %v, want not exist", err)
	}
}
