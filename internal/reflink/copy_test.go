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
