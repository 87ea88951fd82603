package reflink_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"space/internal/reflink"
	"space/internal/storage"
	"space/internal/testenv"
)

// TestChangedOnReflinkStorage plays a guest's memory file on reflink
// storage: snapshot (reflink), write a few pages, snapshot again. The
// extent comparison of the two snapshots reports exactly the written
// pages, and a hole punched where data was.
func TestChangedOnReflinkStorage(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierUnit, "mkfs.xfs", "xfsprogs")
	data := t.TempDir()
	t.Cleanup(func() {
		if err := storage.Unmount(context.Background(), filepath.Join(data, "reflink")); err != nil {
			t.Errorf("Unmount = %v", err)
		}
	})
	st, err := storage.Prepare(t.Context(), storage.Config{DataDir: data, LoopSize: 1 << 30})
	if err != nil || !st.Reflinked() {
		t.Fatalf("Prepare = %+v, %v; want reflink storage", st, err)
	}
	mem := filepath.Join(st.Dir, "memory")
	f, err := os.Create(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	for off := int64(0); off < 8<<20; off += 4096 {
		f.WriteAt(page(1), off)
	}
	f.Truncate(64 << 20) // a hole after 8 MiB
	ctx := t.Context()
	first, second := filepath.Join(st.Dir, "snap1"), filepath.Join(st.Dir, "snap2")
	if linked, err := reflink.CopyReport(ctx, mem, first); err != nil || !linked {
		t.Fatalf("CopyReport = %v, %v; want a reflink", linked, err)
	}
	// The guest writes: one page at 1 MiB, two at 5 MiB, one into the
	// hole at 40 MiB; and frees the page at 7 MiB (a punched hole).
	f.WriteAt(page(2), 1<<20)
	f.WriteAt(append(page(3), page(3)...), 5<<20)
	f.WriteAt(page(4), 40<<20)
	if err := punchHole(f, 7<<20, 4096); err != nil {
		t.Fatalf("punch hole: %v", err)
	}
	if _, err := reflink.CopyReport(ctx, mem, second); err != nil {
		t.Fatal(err)
	}
	got, err := reflink.Changed(first, second)
	if err != nil {
		t.Fatalf("Changed = %v", err)
	}
	want := []reflink.Range{{Off: 1 << 20, Len: 4096}, {Off: 5 << 20, Len: 8192}, {Off: 7 << 20, Len: 4096}, {Off: 40 << 20, Len: 4096}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Changed (-want +got):\n%s", diff)
	}
	if same, err := reflink.Changed(second, second); err != nil || len(same) != 0 {
		t.Errorf("Changed(file, itself) = %v, %v; want nothing", same, err)
	}
	// Two files that only hold the same bytes share no extents: every
	// data range counts as changed.
	copied := filepath.Join(data, "copied")
	b, _ := os.ReadFile(first)
	os.WriteFile(copied, b, 0o600)
	if all, err := reflink.Changed(first, copied); err != nil || len(all) == 0 {
		t.Errorf("Changed(file, a byte copy on another file system) = %v, %v; want its data ranges", all, err)
	}
}

func TestChangedWithoutExtents(t *testing.T) {
	dir, err := os.MkdirTemp("/dev/shm", "changed-")
	if err != nil {
		t.Fatalf("setup: /dev/shm (tmpfs on every Linux host): %v", err)
	}
	defer os.RemoveAll(dir)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("x"), 0o600)
	os.WriteFile(b, []byte("x"), 0o600)
	if _, err := reflink.Changed(a, b); !errors.Is(err, reflink.ErrNoExtents) {
		t.Errorf("Changed on tmpfs = %v, want ErrNoExtents", err)
	}
}

func punchHole(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}
