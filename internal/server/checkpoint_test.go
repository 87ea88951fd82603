package server

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/chunkstore/chunkloc"
	"space/internal/testenv"
)

// apiJSON calls the API with body (JSON, or "") and decodes the answer
// into out (nil: not decoded); it returns the status and the raw answer.
func apiJSON(t testing.TB, ts *testServer, method, path, body string, out any) (int, string) {
	t.Helper()
	code, raw := rawCall(t, ts, method, path, body)
	if out != nil && code < 300 {
		if err := json.Unmarshal([]byte(raw), out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return code, raw
}

func history(t testing.TB, ts *testServer, id string) api.CheckpointList {
	t.Helper()
	var l api.CheckpointList
	if code, raw := apiJSON(t, ts, "GET", "/v1/sandboxes/"+id+"/checkpoints", "", &l); code != http.StatusOK {
		t.Fatalf("GET checkpoints of %s = %d %s", id, code, raw)
	}
	return l
}

// TestCheckpointsOnFakeVMM drives checkpoint policies through the API on
// the fake VMM (a host process for a guest; it saves and restores its
// files, not memory): scheduled checkpoints pruned to keep, one after a
// long command and none after a short one, a manual one, rolling back in
// place and branching from a checkpoint, bad input refused, and the
// checkpoints gone with their sandbox.
func TestCheckpointsOnFakeVMM(t *testing.T) {
	ts := startFakeServer(t, 0, 0)
	c := ts.client
	ctx := t.Context()
	var sb api.Sandbox
	code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes", `{"memory_mib":256,"checkpoints":{"every":"1s","keep":3}}`, &sb)
	if code != http.StatusCreated {
		t.Fatalf("create with a policy = %d %s", code, raw)
	}
	if p := sb.Checkpoints; p == nil || p.Every != "1s" || p.Keep != 3 || p.MinExec != "2s" {
		t.Fatalf("created sandbox's policy = %+v, want every 1s, keep 3 and the default min_exec", p)
	}
	// Scheduled checkpoints come, and pruning keeps three.
	testenv.Eventually(t, time.Minute, func() bool {
		l := history(t, ts, sb.ID)
		return len(l.Checkpoints) == 3 && l.Checkpoints[0].CreatedAt.After(sb.CreatedAt.Add(4*time.Second))
	})
	l := history(t, ts, sb.ID)
	for i, cp := range l.Checkpoints {
		if cp.Trigger != api.CheckpointSchedule || cp.SandboxID != sb.ID || cp.LogicalBytes <= 0 {
			t.Errorf("checkpoint %d = %+v, want a scheduled one of %s with its size", i, cp, sb.ID)
		}
		if i > 0 && !cp.CreatedAt.Before(l.Checkpoints[i-1].CreatedAt) {
			t.Errorf("history is not newest first: %v after %v", cp.CreatedAt, l.Checkpoints[i-1].CreatedAt)
		}
	}
	if l.Policy.Every != "1s" {
		t.Errorf("history's policy = %+v", l.Policy)
	}
	// Checkpoints are not snapshots the team named: not in that list.
	snaps, err := c.Snapshots(ctx, "")
	if err != nil || len(snaps) != 0 {
		t.Errorf("ListSnapshots = %d, %v; want none (checkpoints are listed with their sandbox)", len(snaps), err)
	}

	// After commands only: a short one takes none, a long one takes one
	// that names it.
	var set api.Sandbox // (decoding into sb would merge into its policy)
	if code, raw := apiJSON(t, ts, "PUT", "/v1/sandboxes/"+sb.ID+"/checkpoints/policy", `{"after_exec":true,"min_exec":"1s"}`, &set); code != http.StatusOK {
		t.Fatalf("set policy = %d %s", code, raw)
	}
	if p := set.Checkpoints; p == nil || p.Every != "" || !p.AfterExec || p.MinExec != "1s" {
		t.Fatalf("policy after PUT = %+v", p)
	}
	time.Sleep(2 * time.Second) // a scheduled one in flight lands
	newest := history(t, ts, sb.ID).Checkpoints[0].ID
	execOut(t, c, sb.ID, sh("true"))
	time.Sleep(3 * time.Second)
	if got := history(t, ts, sb.ID).Checkpoints[0]; got.ID != newest {
		t.Fatalf("a short command took checkpoint %+v", got)
	}
	execOut(t, c, sb.ID, sh("sleep 1.5; echo long"))
	testenv.Eventually(t, 30*time.Second, func() bool { return history(t, ts, sb.ID).Checkpoints[0].ID != newest })
	if got := history(t, ts, sb.ID).Checkpoints[0]; got.Trigger != api.CheckpointExec || got.Command != "/bin/sh -c sleep 1.5; echo long" {
		t.Errorf("checkpoint after the long command = %+v, want trigger exec naming it", got)
	}

	// Off; then by hand: roll back in place, and branch.
	var off api.Sandbox
	if code, raw := apiJSON(t, ts, "PUT", "/v1/sandboxes/"+sb.ID+"/checkpoints/policy", `{}`, &off); code != http.StatusOK || off.Checkpoints != nil {
		t.Fatalf("turn checkpoints off = %d %s", code, raw)
	}
	execOut(t, c, sb.ID, sh("mkdir -p /work && echo one > /work/f"))
	var cp api.Checkpoint
	if code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoints", "", &cp); code != http.StatusCreated || cp.Trigger != api.CheckpointManual {
		t.Fatalf("manual checkpoint = %d %s", code, raw)
	}
	execOut(t, c, sb.ID, sh("echo two > /work/f"))
	if code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes/"+sb.ID+"/restore", `{"checkpoint":"`+cp.ID+`"}`, nil); code != http.StatusOK {
		t.Fatalf("restore from checkpoint = %d %s", code, raw)
	}
	if out, _, _ := execOut(t, c, sb.ID, sh("cat /work/f")); out != "one\n" {
		t.Errorf("after restoring the checkpoint /work/f = %q, want one", out)
	}
	var branch api.Sandbox
	if code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes", `{"from_checkpoint":"`+cp.ID+`"}`, &branch); code != http.StatusCreated {
		t.Fatalf("create from checkpoint = %d %s", code, raw)
	}
	if out, _, _ := execOut(t, c, branch.ID, sh("cat /work/f")); out != "one\n" {
		t.Errorf("branch /work/f = %q, want one", out)
	}
	if got, err := c.Snapshot(ctx, cp.ID); err != nil || got.Checkpoint != api.CheckpointManual {
		t.Errorf("GET /v1/snapshots/%s = %+v, %v; want it shown as a manual checkpoint", cp.ID, got, err)
	}

	// Bad input is refused, naming the field, and changes nothing.
	named, err := c.CreateSnapshot(ctx, sb.ID, "named")
	if err != nil {
		t.Fatalf("CreateSnapshot = %v", err)
	}
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/v1/sandboxes", `{"checkpoints":{"every":"-1s"}}`, "checkpoints.every"},
		{"POST", "/v1/sandboxes", `{"checkpoints":{"keep":5000}}`, "checkpoints.keep"},
		{"POST", "/v1/sandboxes", `{"checkpoints":{"often":true}}`, "often"},
		{"POST", "/v1/sandboxes", `{"from_checkpoint":"nope"}`, "from_checkpoint"},
		{"POST", "/v1/sandboxes", `{"from_checkpoint":"` + named.ID + `"}`, "from_checkpoint"},
		{"POST", "/v1/sandboxes", `{"from_checkpoint":"` + cp.ID + `","from_snapshot":"named"}`, "from_checkpoint"},
		{"PUT", "/v1/sandboxes/" + sb.ID + "/checkpoints/policy", `{"every":"1x"}`, "policy.every"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/restore", `{"checkpoint":"` + cp.ID + `","snapshot":"named"}`, "snapshot"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/restore", `{"checkpoint":"named"}`, "checkpoint"},
	} {
		code, raw := rawCall(t, ts, tc.method, tc.path, tc.body)
		var e api.Error
		json.Unmarshal([]byte(raw), &e)
		if code != http.StatusBadRequest || e.Error.Field != tc.field {
			t.Errorf("%s %s %s = %d %s; want 400 on field %s", tc.method, tc.path, tc.body, code, raw, tc.field)
		}
	}
	if got, err := c.Sandbox(ctx, sb.ID); err != nil || got.Checkpoints != nil {
		t.Errorf("after refused input the policy = %+v, %v; want still off", got.Checkpoints, err)
	}
	if all, _ := c.Sandboxes(ctx, client.ListOptions{}); len(all) != 2 {
		t.Errorf("refused creates made sandboxes: %d listed, want 2", len(all))
	}

	// Deleting the sandbox deletes its checkpoints, not the named snapshot.
	ids := []string{}
	for _, cp := range history(t, ts, sb.ID).Checkpoints {
		ids = append(ids, cp.ID)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	for _, id := range ids {
		if _, err := c.Snapshot(ctx, id); !client.IsNotFound(err) {
			t.Errorf("checkpoint %s after its sandbox was deleted: %v, want not found", id, err)
		}
	}
	if _, err := c.Snapshot(ctx, named.ID); err != nil {
		t.Errorf("named snapshot after its sandbox was deleted: %v", err)
	}
	if !strings.HasPrefix(cp.ID, "snp_") {
		t.Errorf("checkpoint id %q is not a snapshot id", cp.ID)
	}
}

// TestCheckpointsRealVM checkpoints a 512 MiB QEMU guest every 2 s
// while a counter runs in it, and checks what the checkpoints stored (a
// fraction of the first: only what changed) and the pauses; rolls the
// guest back in place to a checkpoint from the middle of its history
// (a marker file and the counter are back where they were, and the
// counter goes on); branches from another; and prunes the history down
// to two, after which the chunk store's garbage collection frees bytes.
func TestCheckpointsRealVM(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	var sb api.Sandbox
	if code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes", `{"memory_mib":512,"checkpoints":{"every":"2s","keep":10}}`, &sb); code != http.StatusCreated {
		t.Fatalf("create = %d %s", code, raw)
	}
	startCounter(t, c, sb.ID)
	run := func(id, cmd string) string {
		t.Helper()
		out, errOut, code := execOut(t, c, id, sh(cmd))
		if code != 0 {
			t.Fatalf("exec %q in %s: exit %d: %s", cmd, id, code, errOut)
		}
		return out
	}
	// Phase a: wait for two checkpoints after the marker is written, so
	// the second surely has it; then phase b and more checkpoints.
	run(sb.ID, "echo a > /root/phase; sync")
	marked := time.Now()
	var mid api.Checkpoint
	testenv.Eventually(t, 2*time.Minute, func() bool {
		n := 0
		for _, cp := range history(t, ts, sb.ID).Checkpoints {
			if cp.CreatedAt.After(marked) {
				n++
				if n == 1 {
					mid = cp
				}
			}
		}
		return n >= 2
	})
	atMid := readCounter(t, c, sb.ID)
	run(sb.ID, "echo b > /root/phase; sync")
	bAt := time.Now()
	testenv.Eventually(t, 2*time.Minute, func() bool {
		l := history(t, ts, sb.ID).Checkpoints
		return len(l) >= 6 && l[0].CreatedAt.After(bAt.Add(2*time.Second))
	})
	l := history(t, ts, sb.ID).Checkpoints
	first := l[len(l)-1]
	for _, cp := range l {
		t.Logf("checkpoint %s %s: stored %d B, read %d B, logical %d B, paused %d ms", cp.ID, cp.Trigger, cp.StoredBytes, cp.ReadBytes, cp.LogicalBytes, cp.PausedMS)
		if cp.Trigger != api.CheckpointSchedule || cp.PausedMS <= 0 || cp.StoredBytes <= 0 {
			t.Errorf("checkpoint %+v: want a scheduled one with its pause and bytes", cp)
		}
	}
	// The newest ones follow others of a guest that changed little:
	// each stores a small part of what the first did, which had nothing
	// to share but the template. (Figures: go test -v; the benchmark
	// measures the cost of an idle checkpoint.)
	if newest := l[0]; newest.StoredBytes*4 > first.StoredBytes {
		t.Errorf("newest checkpoint stored %d bytes, the first %d: want a small part", newest.StoredBytes, first.StoredBytes)
	}

	// Roll back to the middle: the marker and the counter are as they were.
	before := readCounter(t, c, sb.ID)
	if code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes/"+sb.ID+"/restore", `{"checkpoint":"`+mid.ID+`"}`, nil); code != http.StatusOK {
		t.Fatalf("restore = %d %s", code, raw)
	}
	if got := strings.TrimSpace(run(sb.ID, "cat /root/phase")); got != "a" {
		t.Errorf("after restoring %s /root/phase = %q, want a", mid.ID, got)
	}
	back := readCounter(t, c, sb.ID)
	if back >= before || back > atMid+5 {
		t.Errorf("counter after the restore = %d; it was %d when the checkpoint's successor was taken and %d just before the restore", back, atMid, before)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return readCounter(t, c, sb.ID) > back })

	// Branch from the newest: it has phase b, and its own life.
	var branch api.Sandbox
	if code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes", `{"from_checkpoint":"`+l[0].ID+`"}`, &branch); code != http.StatusCreated {
		t.Fatalf("branch = %d %s", code, raw)
	}
	if got := strings.TrimSpace(run(branch.ID, "cat /root/phase")); got != "b" {
		t.Errorf("branch /root/phase = %q, want b", got)
	}
	if err := c.DeleteSandbox(ctx, branch.ID); err != nil {
		t.Fatalf("DeleteSandbox(branch) = %v", err)
	}

	// Prune to two; collect; the chunk store shrinks.
	chunks := filepath.Join(ts.dataDir, "chunks")
	grown := dirBytes(t, chunks)
	if code, raw := apiJSON(t, ts, "PUT", "/v1/sandboxes/"+sb.ID+"/checkpoints/policy", `{"every":"1h","keep":2}`, nil); code != http.StatusOK {
		t.Fatalf("set keep 2 = %d %s", code, raw)
	}
	testenv.Eventually(t, 2*time.Minute, func() bool { return len(history(t, ts, sb.ID).Checkpoints) == 2 })
	// Out of the history once its removal began; gone once it ended.
	for _, cp := range l[2:] {
		testenv.Eventually(t, time.Minute, func() bool {
			_, err := c.Snapshot(ctx, cp.ID)
			return client.IsNotFound(err)
		})
	}
	store, err := chunkloc.Open(ctx, chunkloc.Location{Dir: chunks}, chunkloc.Options{})
	if err != nil {
		t.Fatalf("open the chunk store: %v", err)
	}
	st, err := store.GC(ctx)
	if err != nil {
		t.Fatalf("GC = %v", err)
	}
	freed := grown - dirBytes(t, chunks)
	t.Logf("pruning %d checkpoints and GC freed %d bytes (%d chunks)", len(l)-2, freed, st.ChunksDeleted)
	if st.ChunksDeleted == 0 || freed <= 0 {
		t.Errorf("GC after pruning deleted %d chunks, freed %d bytes; want some", st.ChunksDeleted, freed)
	}
}
