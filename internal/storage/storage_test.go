package storage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/internal/reflink"
	"space/internal/testenv"
)

// TestPrepareLoop makes reflink storage in a directory of the test host's
// ext4 file system and copies a 512 MiB memory file in it.
func TestPrepareLoop(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierUnit, "mkfs.xfs", "xfsprogs")
	dir := t.TempDir()
	ctx := t.Context()
	t.Cleanup(func() {
		if err := Unmount(context.Background(), filepath.Join(dir, "reflink")); err != nil {
			t.Errorf("Unmount = %v", err)
		}
	})
	s, err := Prepare(ctx, Config{DataDir: dir, LoopSize: 2 << 30})
	if err != nil {
		t.Fatalf("Prepare = %v", err)
	}
	if s.Mode == ModeCopy {
		t.Fatalf("Prepare mode = %s, want a reflink mode", s.Mode)
	}
	t.Logf("mode %s at %s", s.Mode, s.Dir)
	dev, _, err := mountSource(s.Dir)
	if err != nil || !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("mountSource(%s) = %q, %v; want a loop device", s.Dir, dev, err)
	}
	// The test host's ext4 does direct I/O: so does the loop device.
	dio, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "dio"))
	if !s.DirectIO || err != nil || strings.TrimSpace(string(dio)) != "1" {
		t.Errorf("loop device %s: Store.DirectIO %v, sysfs dio %q (%v); want direct I/O", dev, s.DirectIO, dio, err)
	}
	// A restarted worker finds the mount in place.
	again, err := Prepare(ctx, Config{DataDir: dir})
	if err != nil || again.Dir != s.Dir || !again.DirectIO {
		t.Errorf("Prepare again = %+v, %v; want %s with direct I/O", again, err, s.Dir)
	}
	src := filepath.Join(s.Dir, "memory")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for range 512 {
		f.Write(buf)
	}
	f.Sync() // a reflink of dirty pages writes them back first
	f.Close()
	start := time.Now()
	linked, err := reflink.CopyReport(ctx, src, filepath.Join(s.Dir, "clone"))
	if err != nil || !linked {
		t.Fatalf("CopyReport = %v, %v; want a reflink", linked, err)
	}
	t.Logf("reflink copy of a 512 MiB file: %v", time.Since(start))
}

func TestPrepareNoLoop(t *testing.T) {
	dir := t.TempDir()
	s, err := Prepare(t.Context(), Config{DataDir: dir, NoLoop: true})
	if err != nil {
		t.Fatalf("Prepare = %v", err)
	}
	native, _ := Reflinks(dir)
	if want := map[bool]Mode{true: ModeReflink, false: ModeCopy}[native]; s.Mode != want {
		t.Errorf("Prepare(NoLoop) mode = %s, want %s", s.Mode, want)
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`/a\040b\134c`); got != `/a b\c` {
		t.Errorf("unescape = %q", got)
	}
}

// TestPrepareKeepsFilesFromBefore checks that a directory holding files
// is never mounted over, and that an empty one named by Config.Dir is.
func TestPrepareKeepsFilesFromBefore(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierUnit, "mkfs.xfs", "xfsprogs")
	data := t.TempDir()
	ctx := t.Context()
	used := filepath.Join(data, "used")
	if err := os.MkdirAll(used, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(used, "record.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Prepare(ctx, Config{DataDir: data, Dir: used, LoopSize: 1 << 30})
	if err != nil || s.Mode != ModeCopy || s.Dir != used {
		t.Fatalf("Prepare(dir with files) = %+v, %v; want copy mode at %s", s, err, used)
	}
	if _, err := os.Stat(filepath.Join(used, "record.json")); err != nil {
		t.Errorf("the file from before: %v", err)
	}
	fresh := filepath.Join(data, "fresh")
	t.Cleanup(func() {
		if err := Unmount(context.Background(), fresh); err != nil {
			t.Errorf("Unmount = %v", err)
		}
	})
	s, err = Prepare(ctx, Config{DataDir: data, Dir: fresh, LoopSize: 1 << 30})
	if err != nil || !s.Reflinked() || s.Dir != fresh {
		t.Fatalf("Prepare(fresh dir) = %+v, %v; want reflink storage at %s", s, err, fresh)
	}
}

// TestDeleteGivesBlocksBack writes a file in loop-mounted storage,
// deletes it, and checks that the image file's allocated blocks go back
// to what they were before (online discard), and that Trim gives back
// what an image mounted without discard kept.
func TestDeleteGivesBlocksBack(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierUnit, "mkfs.xfs", "xfsprogs")
	dir := t.TempDir()
	mnt := filepath.Join(dir, "reflink")
	t.Cleanup(func() {
		if err := Unmount(context.Background(), mnt); err != nil {
			t.Errorf("Unmount = %v", err)
		}
	})
	s, err := Prepare(t.Context(), Config{DataDir: dir, LoopSize: 1 << 30})
	if err != nil || s.Mode != ModeReflinkLoop {
		t.Fatalf("setup: Prepare = %+v, %v; want %s", s, err, ModeReflinkLoop)
	}
	if discard, err := mountedWithDiscard(mnt); !discard || err != nil {
		t.Errorf("mountedWithDiscard(%s) = %v, %v; want true", mnt, discard, err)
	}
	img := filepath.Join(dir, loopImage)
	allocated := func(when string) int64 {
		t.Helper()
		n, err := Allocated(img)
		if err != nil {
			t.Fatalf("Allocated(%s) %s = %v", img, when, err)
		}
		if when != "" {
			t.Logf("image allocated %s: %d MiB", when, n>>20)
		}
		return n
	}
	before := allocated("before")
	const size = 256 << 20
	writeDelete := func() {
		t.Helper()
		data := filepath.Join(mnt, "rw.img")
		f, err := os.Create(data)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		for i := range buf {
			buf[i] = byte(i*7 + 1)
		}
		for range size >> 20 {
			if _, err := f.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if written := allocated("after writing"); written < before+size*9/10 {
			t.Fatalf("image allocated %d MiB after writing %d MiB, want at least %d MiB", written>>20, size>>20, (before+size*9/10)>>20)
		}
		if err := os.Remove(data); err != nil {
			t.Fatal(err)
		}
	}
	// The file system's own metadata (log, btrees) may keep a few MiB.
	const slack = 16 << 20
	for round := range 2 { // the second time over blocks discarded once
		writeDelete()
		// XFS discards once the delete's log checkpoint is written:
		// within about 30 seconds.
		start := time.Now()
		testenv.Eventually(t, time.Minute, func() bool { return allocated("") <= before+slack })
		t.Logf("round %d: image allocated %d MiB %v after the delete", round, allocated("")>>20, time.Since(start).Round(time.Second))
	}

	// An image mounted without discard keeps the blocks; Prepare trims it.
	if err := Unmount(t.Context(), mnt); err != nil {
		t.Fatalf("Unmount = %v", err)
	}
	if out, err := exec.Command("mount", "-o", "loop,noatime", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("setup: mount without discard: %v: %s", err, out)
	}
	writeDelete()
	if _, err := Prepare(t.Context(), Config{DataDir: dir}); err != nil {
		t.Fatalf("Prepare(mounted without discard) = %v", err)
	}
	// Blocks the delete just freed are busy until its log checkpoint,
	// as above; a worker's Prepare comes long after its last delete.
	testenv.Eventually(t, time.Minute, func() bool { return allocated("") <= before+slack })
	allocated("after Prepare's trim")
}
