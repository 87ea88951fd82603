package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/cgroup"
	"space/internal/storage"
	"space/internal/testenv"
)

// TestCheckpointsAgainstFakeVMMServer runs `space server` with the fake
// VMM (its guests are jailed host processes; it needs root but no guest
// images) and a default checkpoint policy, and the checkpoint verbs
// against it: the default reaches new sandboxes, a command triggers a
// checkpoint, history, restore and branch from a checkpoint, the policy
// changed in place, and checkpoints going with their sandbox.
func TestCheckpointsAgainstFakeVMMServer(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	dataDir := t.TempDir()
	workerID := "ck" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	t.Cleanup(func() {
		if h, err := cgroup.Detect(); err == nil {
			h.Destroy(context.Background(), "space-"+workerID)
		}
		os.RemoveAll("/dev/shm/space-" + workerID)
		storage.Unmount(context.Background(), filepath.Join(dataDir, "worker"))
	})
	env := map[string]string{"SPACE_DATA_DIR": dataDir, "SPACE_CACHE_DIR": t.TempDir()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		g, _, _ := newTestGlobals(t, env)
		_, err := run(ctx, g, []string{"server", "--vmm", "fake", "--listen", "127.0.0.1:0", "--pool", "0",
			"--worker-id", workerID, "--checkpoints", "after_exec,min_exec=1s,keep=10", "--chunk-gc-interval", "1s"})
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("space server: %v", err)
		}
	}()
	space := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		g := newGlobals(strings.NewReader(""), &out, &errb, func(k string) string { return env[k] })
		code := execute(t.Context(), g, args)
		return out.String(), errb.String(), code
	}
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := space(args...)
		if code != 0 {
			t.Fatalf("space %q = %d, stderr %q", args, code, errOut)
		}
		return out
	}
	testenv.Eventually(t, time.Minute, func() bool {
		select {
		case err := <-done:
			t.Fatalf("setup: space server: %v", err)
		default:
		}
		_, _, code := space("sandbox", "ls")
		return code == 0
	})

	var sb api.Sandbox
	if err := json.Unmarshal([]byte(must("sandbox", "create", "-o", "json")), &sb); err != nil {
		t.Fatalf("sandbox create -o json: %v", err)
	}
	defer space("sandbox", "rm", sb.ID)
	want := &api.CheckpointPolicy{AfterExec: true, MinExec: "1s", Keep: 10}
	if diff := cmp.Diff(want, sb.Checkpoints); diff != "" {
		t.Errorf("a sandbox created without a policy has one differing from the server's --checkpoints (-want +got):\n%s", diff)
	}

	// Only a command of 1s or more triggers a checkpoint: the short ones
	// below leave the history alone.
	must("exec", sb.ID, "--", "sh", "-c", "echo one > /tmp/state; sleep 1.5")
	var l api.CheckpointList
	testenv.Eventually(t, 30*time.Second, func() bool {
		if err := json.Unmarshal([]byte(must("sandbox", "history", sb.ID, "-o", "json")), &l); err != nil {
			t.Fatalf("sandbox history -o json: %v", err)
		}
		return len(l.Checkpoints) > 0
	})
	if cp := l.Checkpoints[0]; cp.Trigger != api.CheckpointExec || !strings.Contains(cp.Command, "echo one") {
		t.Errorf("after a command the history has %+v, want an exec checkpoint naming the command", cp)
	}
	afterOne := l.Checkpoints[0].ID

	must("exec", "--detach", sb.ID, "--", "sh", "-c", "echo two > /tmp/state") // detached: no checkpoint
	testenv.Eventually(t, 10*time.Second, func() bool {
		return must("exec", sb.ID, "--", "cat", "/tmp/state") == "two\n"
	})
	manual := strings.TrimSpace(must("sandbox", "checkpoint", sb.ID))
	hist := must("sandbox", "history", sb.ID)
	if !strings.Contains(hist, manual+"  ") || !strings.Contains(hist, "manual") || !strings.Contains(hist, afterOne) {
		t.Errorf("sandbox history =\n%s\nwant %s (manual) and %s", hist, manual, afterOne)
	}
	if out := must("snapshot", "ls"); strings.Contains(out, afterOne) || strings.Contains(out, manual) {
		t.Errorf("snapshot ls lists checkpoints:\n%s", out)
	}

	must("sandbox", "restore", sb.ID, "--checkpoint", afterOne)
	if got := must("exec", sb.ID, "--", "cat", "/tmp/state"); got != "one\n" {
		t.Errorf("after restore --checkpoint %s /tmp/state = %q, want %q", afterOne, got, "one\n")
	}
	if _, errOut, code := space("sandbox", "restore", sb.ID, "--checkpoint", "snp_nosuchcheckpoint0"); code != exitFailure || errOut == "" {
		t.Errorf("restore --checkpoint of an unknown ID = %d %q, want a failure", code, errOut)
	}

	var branch api.Sandbox
	if err := json.Unmarshal([]byte(must("sandbox", "create", "--from-checkpoint", manual, "--checkpoints", "off", "-o", "json")), &branch); err != nil {
		t.Fatalf("sandbox create --from-checkpoint: %v", err)
	}
	defer space("sandbox", "rm", branch.ID)
	if branch.Checkpoints != nil {
		t.Errorf("a branch created with --checkpoints off has policy %+v, want none", branch.Checkpoints)
	}
	if got := must("exec", branch.ID, "--", "cat", "/tmp/state"); got != "two\n" {
		t.Errorf("the branch from %s has /tmp/state %q, want %q", manual, got, "two\n")
	}

	if got, want := must("sandbox", "checkpoints", sb.ID, "--every", "1h", "--keep", "5"),
		"every 1h0m0s, after commands of 1s or more, keep 5\n"; got != want {
		t.Errorf("sandbox checkpoints --every 1h --keep 5 printed %q, want %q", got, want)
	}
	if got, want := must("sandbox", "checkpoints", branch.ID), "off\n"; got != want {
		t.Errorf("sandbox checkpoints of the branch printed %q, want %q", got, want)
	}

	must("sandbox", "rm", sb.ID)
	if _, errOut, code := space("snapshot", "get", manual); code != exitFailure || !strings.Contains(errOut, "not found") {
		t.Errorf("snapshot get of a deleted sandbox's checkpoint = %d %q, want not found", code, errOut)
	}
}
