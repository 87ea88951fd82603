package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/guesttest"
	"space/internal/agent/proto"
	"space/internal/cgroup"
	"space/internal/errkind"
	"space/internal/imagebuild"
	"space/internal/storage"
	"space/internal/testenv"
)

type oneTemplate struct{ img *imagebuild.Artifacts }

func (o oneTemplate) Template(_ context.Context, name string) (*imagebuild.Artifacts, error) {
	if name != "default" {
		return nil, fmt.Errorf("template %q: %w", name, ErrNotFound)
	}
	return o.img, nil
}

// newVMWorker returns a worker with the real QEMU driver.
func newVMWorker(t *testing.T) *Worker {
	t.Helper()
	return newVMWorkerWith(t, func(*Config) {})
}

// newVMWorkerWith is newVMWorker with its configuration edited by edit.
func newVMWorkerWith(t testing.TB, edit func(*Config)) *Worker {
	t.Helper()
	img := guesttest.Images(t)
	drv, err := guesttest.Driver(t)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	id := fmt.Sprintf("wt%d", time.Now().UnixNano()%1e9)
	cg, _ := cgroup.Detect()
	cfg := Config{ID: id, DataDir: t.TempDir(), Driver: drv, Templates: oneTemplate{img}, Cgroups: cg}
	edit(&cfg)
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := w.Start(t.Context()); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		all, _ := w.List(ctx) // never fails
		for _, inf := range all {
			if err := w.Delete(ctx, inf.ID); err != nil {
				t.Errorf("cleanup: delete %s: %v", inf.ID, err)
			}
		}
		w.Close()
		if cg != nil {
			cg.Destroy(ctx, w.cgroupParent())
		}
		os.RemoveAll(w.cfg.RunRoot)
	})
	return w
}

// reflinkStorage returns a directory on a loop-mounted XFS image that
// reflinks, unmounted when the test's other cleanups have run.
func reflinkStorage(t testing.TB) string {
	t.Helper()
	testenv.RequireTool(t, testenv.TierUnit, "mkfs.xfs", "xfsprogs")
	data := t.TempDir()
	// Sparse: it costs what the tests write; large enough that the
	// disks its sandboxes are promised (disk admission) always fit.
	st, err := storage.Prepare(t.Context(), storage.Config{DataDir: data, LoopSize: 16 << 30})
	if err != nil || !st.Reflinked() {
		t.Fatalf("setup: storage.Prepare = %+v, %v; want reflink storage", st, err)
	}
	t.Cleanup(func() {
		if err := storage.Unmount(context.Background(), st.Dir); err != nil {
			t.Errorf("Unmount = %v", err)
		}
	})
	return st.Dir
}

func sandboxID(n int) string { return fmt.Sprintf("sbx_%s", strings.Repeat(string(rune('a'+n)), 20)) }

// shell runs cmd in sandbox id and returns its stdout.
func shell(t testing.TB, w *Worker, id, cmd string) string {
	t.Helper()
	a, err := w.agentFor(t.Context(), id)
	if err != nil {
		why := ""
		if s, gerr := w.get(id); gerr == nil {
			why = s.info().Error // why it failed, with the guest's console
		}
		t.Fatalf("agent of %s: %v; %s", id, err, why)
	}
	return agenttest.Output(t, a, cmd)
}

// TestSnapshotRestoreFork takes a live snapshot, changes the sandbox,
// rolls it back in place, and forks two copies from the snapshot: files
// and a running counter come back as at the snapshot, and the copies
// diverge on their own.
func TestSnapshotRestoreFork(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	// On reflink storage, as the server runs it: memory files live with
	// the disks, next to the snapshots.
	w := newVMWorkerWith(t, func(cfg *Config) { cfg.DataDir, cfg.ReflinkStorage = reflinkStorage(t), true })
	ctx := t.Context()
	spec := Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024}
	a := sandboxID(0)
	if _, err := w.Create(ctx, CreateRequest{ID: a, Team: "team", Spec: spec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	shell(t, w, a, "echo one > /root/f; sync")
	agent, _ := w.agentFor(ctx, a)
	if _, err := agent.StartProcess(ctx, proto.ProcStart{ExecRequest: proto.ExecRequest{
		Shell: "echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"}}); err != nil {
		t.Fatalf("start counter: %v", err)
	}
	count := func(id string) int {
		n, _ := strconv.Atoi(strings.TrimSpace(shell(t, w, id, "cat /tmp/count 2>/dev/null || echo 0")))
		return n
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count(a) > 5 })

	t0 := time.Now()
	snap, err := w.Snapshot(ctx, a, SnapshotRequest{SnapshotID: "snap_one"})
	if err != nil {
		t.Fatalf("Snapshot = %v", err)
	}
	atSnap := count(a)
	t.Logf("snapshot: %d MiB logical, guest paused %d ms, call %v", snap.LogicalBytes>>20, snap.PausedMS, time.Since(t0))
	if _, err := w.Snapshot(ctx, a, SnapshotRequest{SnapshotID: "snap_one"}); err == nil {
		t.Errorf("second Snapshot with the same id = nil error")
	}

	// Change everything, then roll back.
	shell(t, w, a, "echo two > /root/f; kill $(cat /tmp/counter.pid); rm -f /tmp/count; sync")
	if got := shell(t, w, a, "sleep 0.5; cat /tmp/count 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Fatalf("the counter still runs before the restore: %q", got)
	}
	if inf, err := w.Restore(ctx, a, "snap_one"); err != nil || inf.State != "running" || inf.VM.StartedBy != "restore" {
		t.Fatalf("Restore = %+v, %v", inf, err)
	}
	if got := shell(t, w, a, "cat /root/f"); got != "one\n" {
		t.Errorf("after restore /root/f = %q, want one", got)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count(a) > atSnap })
	if c := count(a); c < atSnap || c > atSnap+200 {
		t.Errorf("after restore the counter is %d, want it to go on from %d", c, atSnap)
	}

	// Fork two copies from the snapshot; the second takes its files (a
	// fork's last child), which spends it.
	b, c := sandboxID(1), sandboxID(2)
	dir, _ := w.snapshotDir("snap_one")
	snapMemory, err := os.Stat(filepath.Join(dir, "vm", "memory"))
	if err != nil {
		t.Fatalf("snapshot memory file: %v", err)
	}
	for _, id := range []string{b, c} {
		inf, err := w.Create(ctx, CreateRequest{ID: id, Team: "team", FromSnapshot: "snap_one", TakeSnapshot: id == c})
		if err != nil {
			t.Fatalf("Create(%s from snap_one) = %v", id, err)
		}
		t.Logf("fork %s started in %d ms", id, inf.VM.BootMS)
		if got := shell(t, w, id, "cat /root/f"); got != "one\n" {
			t.Errorf("fork %s: /root/f = %q, want one", id, got)
		}
		testenv.Eventually(t, 30*time.Second, func() bool { return count(id) > atSnap })
	}
	if _, err := w.SnapshotInfo(ctx, "snap_one"); !errors.Is(err, errkind.NotFound) {
		t.Errorf("SnapshotInfo of a spent snapshot = %v, want not found", err)
	}
	if left, _ := filepath.Glob(filepath.Join(w.snapshotsDir(), "*")); len(left) != 0 {
		t.Errorf("snapshot files left after the last fork took them: %v", left)
	}
	sc, _ := w.get(c)
	if fi, err := os.Stat(filepath.Join(sc.diskDir(), "memory")); err != nil || !os.SameFile(fi, snapMemory) {
		t.Errorf("memory of the fork that took the snapshot: %v, %v; want the snapshot's file, moved", fi, err)
	}
	shell(t, w, b, "echo mine > /root/only-b")
	if got := shell(t, w, c, "cat /root/only-b 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Errorf("fork c sees fork b's file: %q", got)
	}
	if got := shell(t, w, a, "cat /root/only-b 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Errorf("parent sees fork b's file: %q", got)
	}
	if err := w.DeleteSnapshot(ctx, "snap_one"); !errors.Is(err, errkind.NotFound) {
		t.Errorf("DeleteSnapshot of a spent snapshot = %v, want not found", err)
	}
	for _, id := range []string{b, c} {
		if got := shell(t, w, id, "cat /root/f"); got != "one\n" {
			t.Errorf("fork %s after its snapshot is gone: /root/f = %q", id, got)
		}
	}
}

// TestSnapshotWithoutNIC restores a sandbox of the kind every sandbox was
// before each got a NIC (a spec without network): it boots rather than
// restoring a warm template with a NIC, its snapshot restores without a
// NIC, and a policy change says clearly why there is none to change.
func TestSnapshotWithoutNIC(t *testing.T) {
	release := guesttest.AcquireAllSlots(t)
	defer release()
	w := newVMWorker(t)
	ctx := t.Context()
	spec := Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024}
	if err := w.Warm(ctx, spec); err != nil {
		t.Fatalf("Warm = %v", err)
	}
	a, b := sandboxID(0), sandboxID(1)
	inf, err := w.create(ctx, a, "team", spec, createOpts{})
	if err != nil || inf.VM.StartedBy != "boot" {
		t.Fatalf("create without network = %+v, %v; want a boot", inf, err)
	}
	nics := "ls /sys/class/net | tr '\\n' ' '"
	if got := shell(t, w, a, nics); got != "lo " {
		t.Errorf("interfaces without network: %q, want only lo", got)
	}
	if _, err := w.Snapshot(ctx, a, SnapshotRequest{SnapshotID: "snap_nonic"}); err != nil {
		t.Fatalf("Snapshot = %v", err)
	}
	if inf, err = w.CreateFromSnapshot(ctx, b, "team", "snap_nonic", nil); err != nil || inf.Spec.Network != nil {
		t.Fatalf("CreateFromSnapshot = %+v, %v; want a sandbox without network", inf, err)
	}
	if got := shell(t, w, b, nics); got != "lo " {
		t.Errorf("interfaces of the restore: %q, want only lo", got)
	}
	if _, err := w.SetNetwork(ctx, b, Network{Allow: []string{"example.com"}}); !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "no network interface") {
		t.Errorf("SetNetwork without a NIC = %v, want a failed precondition saying why", err)
	}
	// A create through the API gets a NIC, from the warm template; the
	// snapshot without one cannot replace its VM.
	c := sandboxID(2)
	if inf, err = w.Create(ctx, CreateRequest{ID: c, Team: "team", Spec: spec}); err != nil || inf.VM.StartedBy != "warm" || inf.Spec.Network == nil {
		t.Fatalf("Create = %+v, %v; want a warm restore with a network", inf, err)
	}
	if _, err := w.Restore(ctx, c, "snap_nonic"); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Restore of a snapshot without a NIC into a sandbox with one = %v, want a failed precondition", err)
	}
	if got := shell(t, w, c, nics); len(strings.Fields(got)) != 2 {
		t.Errorf("interfaces of a new sandbox: %q, want lo and a NIC", got)
	}
}
