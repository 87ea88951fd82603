package vmmtest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/guesttest"
	"space/internal/agent/proto"
	"space/internal/guestvm"
	"space/internal/storage"
	"space/internal/testenv"
	"space/internal/vmm"
)

// NewBenchDriver returns a fresh driver for a benchmark.
type NewBenchDriver func(b *testing.B) vmm.Driver

// Bench reports, in one run: cold boot and restore, each until a first
// `exec true` completed; a live snapshot of a running guest; the restore
// time of a 2 GiB guest over that of a 256 MiB guest (flat in RAM is 1.0);
// and the VMM's resident memory beyond what the guest touched.
func Bench(b *testing.B, newDriver NewBenchDriver) {
	b.Run("tmpfs", func(b *testing.B) { bench(b, newDriver, "/dev/shm") })
	// Memory files and snapshots on reflink storage: snapshot and restore
	// copies become extent sharing (loop-mounted XFS on hosts like this).
	b.Run("reflink", func(b *testing.B) {
		testenv.RequireRoot(b, testenv.TierNetns)
		dataDir, err := os.MkdirTemp("", "space-bench-store-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			storage.Unmount(context.Background(), filepath.Join(dataDir, "reflink"))
			os.RemoveAll(dataDir)
		})
		st, err := storage.Prepare(b.Context(), storage.Config{DataDir: dataDir, LoopSize: 16 << 30})
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("storage mode %s", st.Mode)
		bench(b, newDriver, st.Dir)
	})
}

func bench(b *testing.B, newDriver NewBenchDriver, runBase string) {
	d := newDriver(b)
	img := guesttest.Images(b)
	bootOne := func(memMiB int) (*guestvm.VM, time.Duration, func()) {
		release := guesttest.AcquireSlot(b)
		run, data := benchDirs(b, runBase)
		start := time.Now()
		vm, err := guestvm.Boot(b.Context(), guestvm.Config{Images: img, Driver: d, RunDir: run, DataDir: data, MemoryMiB: memMiB})
		if err != nil {
			release()
			b.Fatalf("boot: %v", err)
		}
		execTrue(b, vm.Client)
		took := time.Since(start)
		return vm, took, func() { closeVM(b, vm); release() }
	}
	restoreOne := func(snap string) time.Duration {
		release := guesttest.AcquireSlot(b)
		defer release()
		run, data := benchDirs(b, runBase)
		start := time.Now()
		vm, err := guestvm.Restore(b.Context(), guestvm.Config{Images: img, Driver: d, RunDir: run, DataDir: data}, snap)
		if err != nil {
			b.Fatalf("restore: %v", err)
		}
		execTrue(b, vm.Client)
		took := time.Since(start)
		closeVM(b, vm)
		return took
	}
	snapshotOf := func(memMiB int) (string, *vmm.Snapshot, time.Duration) {
		vm, _, done := bootOne(memMiB)
		defer done()
		dir := filepath.Join(benchSnapRoot(b, runBase), "mem"+strconv.Itoa(memMiB))
		start := time.Now()
		s, err := vm.Snapshot(b.Context(), dir)
		if err != nil {
			b.Fatalf("snapshot: %v", err)
		}
		total := time.Since(start)
		execTrue(b, vm.Client) // it keeps running
		return dir, s, total
	}

	for b.Loop() {
		vm, cold, done := bootOne(512)
		info, _ := vm.VMM.Info()
		touched := guestTouchedKiB(b, vm.Client)
		done()
		snap256, s256, total256 := snapshotOf(256)
		snap2g, _, _ := snapshotOf(2048)
		r256 := restoreOne(snap256)
		r2g := restoreOne(snap2g)
		b.ReportMetric(cold.Seconds(), "cold-boot-s")
		b.ReportMetric(r256.Seconds(), "restore-s")
		b.ReportMetric(s256.Took.Seconds()*1000, "snapshot-paused-ms")
		b.ReportMetric(total256.Seconds()*1000, "snapshot-total-ms")
		b.ReportMetric(r2g.Seconds()/r256.Seconds(), "restore-2G/256M")
		b.ReportMetric(float64(info.RSS>>20)-float64(touched>>10), "rss-beyond-guest-MiB")
		b.Logf("cold boot %v; restore 256M %v, 2G %v; snapshot paused %v (total %v, reflinked %v); idle RSS %d MiB, guest-touched %d MiB",
			cold, r256, r2g, s256.Took, total256, s256.Reflinked, info.RSS>>20, touched>>10)
	}
}

func execTrue(b *testing.B, c *client.Client) {
	b.Helper()
	if _, err := c.Exec(b.Context(), proto.ExecRequest{Argv: []string{"true"}}, client.IO{}); err != nil {
		b.Fatalf("exec true: %v", err)
	}
}

// guestTouchedKiB is the guest's own view of the RAM it uses (MemTotal -
// MemFree), the pages the VMM has had to back.
func guestTouchedKiB(b *testing.B, c *client.Client) int64 {
	b.Helper()
	var out bytes.Buffer
	c.Exec(b.Context(), proto.ExecRequest{Shell: "awk '/MemTotal/{t=$2} /MemFree/{f=$2} END{print t-f}' /proc/meminfo"}, client.IO{Stdout: &out})
	n, _ := strconv.ParseInt(strings.TrimSpace(out.String()), 10, 64)
	return n
}

func closeVM(b *testing.B, vm *guestvm.VM) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := vm.Close(ctx); err != nil {
		b.Errorf("close: %v", err)
	}
}

func benchDirs(b *testing.B, base string) (run, data string) {
	run, err := os.MkdirTemp(base, "space-bench-")
	if err != nil {
		b.Fatal(err)
	}
	data, err = os.MkdirTemp(base, "space-bench-data-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(run); os.RemoveAll(data) })
	return run, data
}

func benchSnapRoot(b *testing.B, base string) string {
	dir, err := os.MkdirTemp(base, "space-bench-snap-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
