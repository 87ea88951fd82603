package server

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/storage"
	"space/internal/testenv"
)

// TestDiskSize asks for a 512 MiB disk: the guest's file system is that
// size less ext4's metadata (at most 10% of it), and the guest that fills
// it gets ENOSPC from its own file system while another sandbox on the
// same worker still writes. Where the worker's storage is a loop-mounted
// image (as root on a file system that does not reflink), deleting the
// full sandbox gives the image's blocks back to the host.
func TestDiskSize(t *testing.T) {
	release := guesttest.AcquireAllSlots(t) // two VMs at once
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	const diskMiB = 512
	full, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256, DiskMiB: diskMiB})
	if err != nil {
		t.Fatalf("CreateSandbox(disk_mib %d) = %v", diskMiB, err)
	}
	if got, err := ts.client.Sandbox(ctx, full.ID); err != nil || got.DiskMiB != diskMiB {
		t.Errorf("Sandbox(%s).DiskMiB = %d, %v; want %d", full.ID, got.DiskMiB, err, diskMiB)
	}
	other, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256, DiskMiB: diskMiB})
	if err != nil {
		t.Fatalf("CreateSandbox(second) = %v", err)
	}

	beforeFill, _ := storage.Allocated(filepath.Join(ts.dataDir, "reflink.xfs"))

	// The writable layer is the overlay's upper layer: / reports its size.
	out, _, code := execOut(t, ts.client, full.ID, sh("df -Pm / | tail -n 1"))
	fields := strings.Fields(out)
	if code != 0 || len(fields) < 2 {
		t.Fatalf("df -Pm / = %q, exit %d", out, code)
	}
	size, err := strconv.Atoi(fields[1])
	if err != nil || size > diskMiB || size < diskMiB*9/10 {
		t.Errorf("guest file system of disk_mib %d: %s MiB (df -Pm /: %q), want %d..%d", diskMiB, fields[1], out, diskMiB*9/10, diskMiB)
	}
	t.Logf("disk_mib %d: the guest's df -m / says %d MiB", diskMiB, size)

	// Fill it: dd stops at ENOSPC, and the next write fails too.
	out, stderr, code := execOut(t, ts.client, full.ID, sh("dd if=/dev/zero of=/fill bs=1M 2>&1; sync; echo x > /more"))
	if code == 0 || !strings.Contains(out+stderr, "No space left on device") {
		t.Fatalf("filling the disk: exit %d, %q %q; want a failure with ENOSPC", code, out, stderr)
	}
	out, _, _ = execOut(t, ts.client, full.ID, sh("df -Pm / | tail -n 1; ls -l /fill"))
	t.Logf("full guest: %s", out)
	img := filepath.Join(ts.dataDir, "reflink.xfs") // see storage.Prepare
	allocated := func() int64 {
		n, err := storage.Allocated(img)
		if err != nil {
			return -1
		}
		return n
	}
	afterFill := allocated()
	t.Logf("storage image allocated before the fill %d MiB, after %d MiB", beforeFill>>20, afterFill>>20)

	// The other sandbox writes on.
	out, stderr, code = execOut(t, ts.client, other.ID, sh("dd if=/dev/zero of=/data bs=1M count=64 conv=fsync 2>&1 && echo written"))
	if code != 0 || !strings.Contains(out, "written") {
		t.Errorf("the other sandbox's write of 64 MiB: exit %d, %q %q; want it written", code, out, stderr)
	}
	// And the full one still answers (a read, a delete of its file).
	if out, _, code := execOut(t, ts.client, full.ID, sh("rm /fill && echo x > /more && cat /more")); code != 0 || out != "x\n" {
		t.Errorf("the full sandbox after freeing its file: exit %d, %q; want x", code, out)
	}

	if afterFill < 0 {
		t.Logf("no loop-mounted storage image at %s: not measuring what a delete gives back", img)
		return
	}
	if err := ts.client.DeleteSandbox(ctx, full.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	// XFS discards a deleted file's blocks once the delete's log
	// checkpoint is written, within about 30 seconds; other sandboxes
	// (the pool's) may write meanwhile, so ask for most of the fill back.
	start := time.Now()
	testenv.Eventually(t, 2*time.Minute, func() bool { return allocated() <= afterFill-400<<20 })
	t.Logf("storage image allocated %d MiB %v after the delete", allocated()>>20, time.Since(start).Round(time.Second))
}

// TestDiskAdmittedAgainstStorage runs a fake-VMM server whose worker has
// a 16 GiB storage image: a disk larger than it can ever give is refused
// at the API as invalid, saying how large a disk the worker gives, and
// creates that fit are admitted until the disks promised fill it, then
// refused as unavailable, saying that no worker has that much disk free.
func TestDiskAdmittedAgainstStorage(t *testing.T) {
	ts := startFakeServerWith(t, Config{StorageGiB: 16})
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	workers, err := ts.client.Workers(ctx)
	if err != nil || len(workers) != 1 || workers[0].DiskMiB == 0 {
		t.Fatalf("Workers = %+v, %v; want one that says its disk", workers, err)
	}
	w := workers[0]
	t.Logf("worker: disk_mib %d, free_disk_mib %d", w.DiskMiB, w.FreeDiskMiB)
	if w.DiskMiB >= 16<<10 {
		t.Errorf("worker disk_mib %d on a 16 GiB image, want less (the reserve)", w.DiskMiB)
	}

	_, err = ts.client.CreateSandbox(ctx, api.CreateSandbox{DiskMiB: 65536})
	var e *client.Error
	if !errors.As(err, &e) || e.Code != api.CodeInvalidArgument ||
		!strings.Contains(e.Message, fmt.Sprintf("disk_mib 65536 is more than any worker can give: the largest gives %d MiB", w.DiskMiB)) {
		t.Fatalf("CreateSandbox(disk_mib 65536) = %v, want invalid_argument saying the largest disk a worker gives", err)
	}

	const disk = 4096
	for n := 1; ; n++ {
		_, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{DiskMiB: disk})
		if err == nil {
			if n > 4 {
				t.Fatalf("CreateSandbox %d of disk_mib %d admitted on a 16 GiB image, want at most 3", n, disk)
			}
			continue
		}
		if !errors.As(err, &e) || e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "4096 MiB of disk free") {
			t.Fatalf("CreateSandbox %d of disk_mib %d = %v, want unavailable: no worker has the disk free", n, disk, err)
		}
		t.Logf("sandbox %d refused: %v", n, err)
		if n == 1 {
			t.Errorf("the first sandbox of disk_mib %d was refused, want it admitted", disk)
		}
		break
	}
}
