package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/store"
	"space/internal/vmm/fake"
)

// TestDiskAdmission creates sandboxes on a worker whose reserve leaves
// room for one 2 GiB disk: the second is refused with a reason that says
// what was asked and what is free, a disk larger than the storage is
// refused as such, and a delete gives the room back.
func TestDiskAdmission(t *testing.T) {
	h := newFakeHost(t)
	var fs unix.Statfs_t
	if err := unix.Statfs(h.data, &fs); err != nil {
		t.Fatalf("setup: %v", err)
	}
	freeMiB := int64(fs.Bavail) * fs.Bsize >> 20
	// Room for one 2 GiB disk with 1 GiB to spare (other processes
	// write to this file system too), never for two.
	const disk, spare = 2048, 1024
	if freeMiB < disk+spare+1024 {
		t.Fatalf("setup: %d MiB free where the test's data goes, want %d", freeMiB, disk+spare+1024)
	}
	drv, err := fake.New(fake.Config{})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	w, err := New(Config{ID: h.id, DataDir: h.data, RunRoot: h.run, Driver: drv, Templates: oneTemplate{fakeImages},
		Cgroups: h.cg, BootTimeout: 10 * time.Second, Log: testLog(), DiskReserveMiB: freeMiB - disk - spare})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("setup: Start = %v", err)
	}
	t.Cleanup(func() { w.Close() })
	ctx := t.Context()
	spec := fakeSpec
	spec.DiskMiB = disk
	a, b, c := store.NewSandboxID(), store.NewSandboxID(), store.NewSandboxID()

	st, _ := w.Status(ctx)
	t.Logf("before: disk %d MiB, free for disks %d MiB", st.DiskMiB, st.FreeDiskMiB)
	if st.FreeDiskMiB < disk {
		t.Fatalf("Status().FreeDiskMiB = %d, want at least %d", st.FreeDiskMiB, disk)
	}
	if _, err := w.Create(ctx, CreateRequest{ID: a, Team: "team", Spec: spec}); err != nil {
		t.Fatalf("Create(first %d MiB disk) = %v", disk, err)
	}
	st, _ = w.Status(ctx)
	t.Logf("with one sandbox: free for disks %d MiB", st.FreeDiskMiB)
	if st.FreeDiskMiB >= disk {
		t.Errorf("Status().FreeDiskMiB = %d with the first disk promised, want under %d", st.FreeDiskMiB, disk)
	}

	_, err = w.Create(ctx, CreateRequest{ID: b, Team: "team", Spec: spec})
	if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), "a disk of 2048 MiB asked") ||
		!strings.Contains(err.Error(), "free for it") {
		t.Fatalf("Create(second %d MiB disk) = %v, want ResourceExhausted saying what was asked and what is free", disk, err)
	}
	t.Logf("refused: %v", err)

	huge := spec
	huge.DiskMiB = 1 << 22
	_, err = w.Create(ctx, CreateRequest{ID: c, Team: "team", Spec: huge})
	if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), "more than this worker can ever give") {
		t.Fatalf("Create(%d MiB disk) = %v, want ResourceExhausted: more than the worker can ever give", huge.DiskMiB, err)
	}
	t.Logf("refused: %v", err)

	if err := w.Delete(ctx, a); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	if _, err := w.Create(ctx, CreateRequest{ID: b, Team: "team", Spec: spec}); err != nil {
		t.Fatalf("Create(%d MiB disk) after the first was deleted = %v", disk, err)
	}
}
