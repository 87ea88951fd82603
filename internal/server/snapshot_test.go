package server

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/testenv"
	"space/internal/worker"
)

// TestSnapshotRestoreForkAPI runs the checkpoint story through the API: a
// file and a running counter survive snapshot → change → restore; three
// forks and a sandbox created from the snapshot each have them and
// diverge; deleting the snapshot leaves them running.
func TestSnapshotRestoreForkAPI(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	c := ts.client
	a, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	run := func(id, cmd string) string {
		t.Helper()
		out, _, code := execOut(t, c, id, sh(cmd))
		if code != 0 {
			t.Fatalf("exec %q in %s: exit %d", cmd, id, code)
		}
		return out
	}
	count := func(id string) int {
		n, _ := strconv.Atoi(strings.TrimSpace(run(id, "cat /tmp/count 2>/dev/null || echo 0")))
		return n
	}
	run(a.ID, "echo one > /root/f")
	identity := "cat /etc/machine-id /proc/sys/kernel/random/boot_id"
	idA := run(a.ID, identity)
	if _, err := c.StartDetached(ctx, a.ID, api.Exec{Detach: true,
		Shell: "echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"}); err != nil {
		t.Fatalf("StartDetached = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count(a.ID) > 3 })

	chunks := filepath.Join(ts.dataDir, "chunks")
	before := dirBytes(t, chunks)
	sn, err := c.CreateSnapshot(ctx, a.ID, "before")
	if err != nil || sn.State != "ready" || sn.LogicalBytes <= 0 || sn.NewBytes <= 0 || sn.Name != "before" {
		t.Fatalf("CreateSnapshot = %+v, %v", sn, err)
	}
	if grew := dirBytes(t, chunks) - before; grew != sn.NewBytes {
		t.Errorf("snapshot new_bytes = %d, the chunk store grew by %d", sn.NewBytes, grew)
	}
	// A second snapshot of an idle sandbox stores little: only what changed.
	before = dirBytes(t, chunks)
	again, err := c.CreateSnapshot(ctx, a.ID, "")
	if err != nil {
		t.Fatalf("second CreateSnapshot = %v", err)
	}
	// (A running counter and the guest kernel touch memory all the time,
	// and a touched page costs its whole chunk, compressed.)
	if grew := dirBytes(t, chunks) - before; grew != again.NewBytes || again.NewBytes*2 > sn.NewBytes {
		t.Errorf("second snapshot new_bytes = %d (store grew %d), first %d: want a fraction", again.NewBytes, grew, sn.NewBytes)
	}
	// On reflink storage the worker compares extents with the first
	// snapshot: it reads what changed, not the guest's whole memory. (XFS
	// remaps rewritten blocks in runs of up to a few MiB, so an idle
	// guest's scattered writes still cost a good part of its memory.)
	if again.ReadBytes*4 > sn.ReadBytes*3 {
		t.Errorf("second snapshot read %d bytes, the first %d: want only what changed read", again.ReadBytes, sn.ReadBytes)
	}
	t.Logf("second snapshot of the same sandbox: new %d KiB, read %d KiB (first: read %d MiB) of %d MiB logical",
		again.NewBytes>>10, again.ReadBytes>>10, sn.ReadBytes>>20, again.LogicalBytes>>20)
	if err := c.DeleteSnapshot(ctx, again.ID); err != nil {
		t.Fatalf("DeleteSnapshot = %v", err)
	}
	atSnap := count(a.ID)
	t.Logf("snapshot %s: logical %d MiB, new %d MiB, paused %d ms", sn.ID, sn.LogicalBytes>>20, sn.NewBytes>>20, sn.PausedMS)
	if _, err := c.CreateSnapshot(ctx, a.ID, "before"); !client.IsConflict(err) {
		t.Errorf("second snapshot named before = %v, want conflict", err)
	}

	run(a.ID, "echo two > /root/f; kill $(cat /tmp/counter.pid); rm /tmp/count")
	got, err := c.RestoreSandbox(ctx, a.ID, "before")
	if err != nil || got.State != "running" || got.VM == nil || got.VM.StartedBy != "restore" {
		t.Fatalf("RestoreSandbox = %+v, %v", got, err)
	}
	if f := run(a.ID, "cat /root/f"); f != "one\n" {
		t.Errorf("after restore /root/f = %q, want one", f)
	}
	// Rolled back to its own snapshot, it is the machine it was.
	if got := run(a.ID, identity); got != idA {
		t.Errorf("after restore machine-id and boot_id = %q, want %q as before", got, idA)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count(a.ID) > atSnap })

	kids, err := c.ForkSandbox(ctx, a.ID, 3)
	if err != nil || len(kids) != 3 {
		t.Fatalf("ForkSandbox = %v, %v", kids, err)
	}
	for i, k := range kids {
		if k.State != "running" || k.ID == a.ID {
			t.Errorf("fork %d = %+v", i, k)
		}
		if f := run(k.ID, "cat /root/f; hostname"); f != "one\n"+worker.Hostname(k.ID)+"\n" {
			t.Errorf("fork %d: /root/f and hostname = %q, want one and its own name", i, f)
		}
		testenv.Eventually(t, 30*time.Second, func() bool { return count(k.ID) > 0 })
	}
	// Each fork is a machine of its own.
	seen := map[string]string{}
	for _, id := range []string{a.ID, kids[0].ID, kids[1].ID, kids[2].ID} {
		for _, v := range strings.Fields(run(id, identity)) {
			if other, ok := seen[v]; ok {
				t.Errorf("%s and %s share the machine-id or boot_id %s", id, other, v)
			}
			seen[v] = id
		}
	}
	run(kids[0].ID, "echo mine > /root/only0")
	for _, id := range []string{a.ID, kids[1].ID, kids[2].ID} {
		if out := run(id, "cat /root/only0 2>/dev/null || echo absent"); out != "absent\n" {
			t.Errorf("%s sees fork 0's file: %q", id, out)
		}
	}
	// Forks start from one memory image; each got fresh entropy, so their
	// random streams differ.
	rnd := "head -c 16 /dev/urandom | od -An -tx1"
	if r1, r2 := run(kids[1].ID, rnd), run(kids[2].ID, rnd); r1 == r2 {
		t.Errorf("two forks read the same random bytes %q", r1)
	}

	// Delete the forks to make room, then a sandbox from the named snapshot.
	for _, k := range kids {
		if err := c.DeleteSandbox(ctx, k.ID); err != nil {
			t.Fatalf("DeleteSandbox = %v", err)
		}
	}
	b, err := c.CreateSandbox(ctx, api.CreateSandbox{FromSnapshot: "before"})
	if err != nil || b.VM == nil || b.VM.StartedBy != "restore" || b.MemoryMiB != 192 {
		t.Fatalf("CreateSandbox(from_snapshot) = %+v, %v", b, err)
	}
	if f := run(b.ID, "cat /root/f"); f != "one\n" {
		t.Errorf("from snapshot: /root/f = %q, want one", f)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{FromSnapshot: "before", MemoryMiB: 512}); err == nil {
		t.Errorf("CreateSandbox(from_snapshot with memory) = nil error, want invalid")
	}

	sns, err := c.Snapshots(ctx, "")
	if err != nil || len(sns) != 1 || sns[0].ID != sn.ID {
		t.Errorf("Snapshots = %+v, %v; want only %s (the fork's own snapshot is gone)", sns, err, sn.ID)
	}
	if err := c.DeleteSnapshot(ctx, "before"); err != nil {
		t.Fatalf("DeleteSnapshot = %v", err)
	}
	if f := run(b.ID, "cat /root/f"); f != "one\n" {
		t.Errorf("after the snapshot is deleted: /root/f = %q", f)
	}
	if _, err := c.RestoreSandbox(ctx, a.ID, "before"); !client.IsNotFound(err) {
		t.Errorf("RestoreSandbox(deleted snapshot) = %v, want not found", err)
	}

	// Suspend: the VM goes, the sandbox stays; resume brings it back as it was.
	cur, _ := c.Sandbox(ctx, a.ID)
	c0 := count(a.ID)
	susp, err := c.SuspendSandbox(ctx, a.ID)
	if err != nil || susp.State != "suspended" || susp.SuspendedSnapshot == "" || susp.VM != nil {
		t.Fatalf("SuspendSandbox = %+v, %v", susp, err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return syscall.Kill(cur.VM.PID, 0) != nil })
	var ce *client.Error
	if _, err := c.Exec(ctx, a.ID, sh("true"), io.Discard, io.Discard); !asClientError(err, &ce) || ce.Status != 409 {
		t.Errorf("Exec in a suspended sandbox = %v, want 409", err)
	}
	res, err := c.ResumeSandbox(ctx, a.ID)
	if err != nil || res.State != "running" || res.VM == nil || res.VM.StartedBy != "restore" || res.SuspendedSnapshot != "" {
		t.Fatalf("ResumeSandbox = %+v, %v", res, err)
	}
	if f := run(a.ID, "cat /root/f"); f != "one\n" {
		t.Errorf("after resume /root/f = %q", f)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count(a.ID) > c0 })
	if sns := mustSnapshots(t, c); len(sns) != 0 {
		t.Errorf("after resume snapshots = %+v, want the suspend snapshot gone", sns)
	}

	// A full snapshot quota refuses new snapshots.
	if _, err := c.SetQuota(ctx, "", api.Quota{SnapshotMiB: 1}); err != nil {
		t.Fatalf("SetQuota = %v", err)
	}
	if _, err := c.CreateSnapshot(ctx, a.ID, ""); err != nil {
		t.Fatalf("first snapshot under a 1 MiB quota = %v (the quota counts what is stored before)", err)
	}
	if _, err := c.CreateSnapshot(ctx, a.ID, ""); err == nil || !asClientError(err, &ce) || ce.Status != 429 {
		t.Errorf("snapshot over quota = %v, want 429", err)
	}
	for _, s := range mustSnapshots(t, c) {
		c.DeleteSnapshot(ctx, s.ID)
	}
	entries, _ := os.ReadDir(filepath.Join(ts.dataDir, "worker", "snapshots"))
	if len(entries) != 0 {
		t.Errorf("worker snapshot dirs left: %v", entries)
	}
}

func mustSnapshots(t *testing.T, c *client.Client) []api.Snapshot {
	t.Helper()
	sns, err := c.Snapshots(t.Context(), "")
	if err != nil {
		t.Fatalf("Snapshots = %v", err)
	}
	return sns
}

func asClientError(err error, target **client.Error) bool { return errors.As(err, target) }

// dirBytes sums the sizes of the files below dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// TestCorruptChunkThroughAPI damages one stored chunk of a snapshot that
// the worker has to reassemble: starting a sandbox from it fails with an
// error that says so, and leaves nothing behind.
func TestCorruptChunkThroughAPI(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	ctx := t.Context()
	c := ts.client
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192, DiskMiB: 1024})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	execOut(t, c, sb.ID, sh("head -c 4M /dev/urandom > /root/data; sync"))
	sn, err := c.CreateSnapshot(ctx, sb.ID, "")
	if err != nil {
		t.Fatalf("CreateSnapshot = %v", err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	// The worker forgets its copy, as a worker that never saw it would
	// not have one, and one stored chunk rots.
	if err := os.RemoveAll(filepath.Join(ts.dataDir, "worker", "snapshots", sn.ID)); err != nil {
		t.Fatalf("setup: %v", err)
	}
	var chunk string
	filepath.WalkDir(filepath.Join(ts.dataDir, "chunks", "chunks"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && chunk == "" {
			chunk = p
		}
		return nil
	})
	if chunk == "" {
		t.Fatalf("setup: no chunk stored")
	}
	f, err := os.OpenFile(chunk, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		t.Fatalf("setup: chunk %s: %v, %v", chunk, fi, err)
	}
	at := fi.Size() / 2 // raw or compressed, a byte inside it
	b := make([]byte, 1)
	f.ReadAt(b, at)
	b[0] ^= 0xff
	f.WriteAt(b, at)
	f.Close()

	_, err = c.CreateSandbox(ctx, api.CreateSandbox{FromSnapshot: sn.ID})
	if err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("CreateSandbox from a snapshot with a damaged chunk = %v, want an error naming the corruption", err)
	}
	t.Logf("as expected: %v", err)
	if all, err := c.Sandboxes(ctx, client.ListOptions{}); err != nil || len(all) != 0 {
		t.Errorf("sandboxes after the failed create = %+v, %v; want none", all, err)
	}
	assertNoLeftovers(t, ts)
	if entries, _ := os.ReadDir(filepath.Join(ts.dataDir, "worker", "snapshots")); len(entries) != 0 {
		t.Errorf("a half-fetched snapshot is left: %v", entries)
	}
}
