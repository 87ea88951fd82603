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

	"space/api"
	"space/internal/agent/guesttest"
	"space/internal/cgroup"
	"space/internal/server"
	"space/internal/storage"
)

// TestCLIAgainstRealServer runs the client verbs against a real server
// with a real VM: output streams, exit codes propagate, detach/attach.
func TestCLIAgainstRealServer(t *testing.T) {
	env := startRealServer(t)
	space := func(stdin string, args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		g := newGlobals(strings.NewReader(stdin), &out, &errb, func(k string) string { return env[k] })
		code := execute(t.Context(), g, args)
		return out.String(), errb.String(), code
	}

	out, errOut, code := space("", "sandbox", "create", "--memory", "256", "-o", "json")
	var sb api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.State != "running" {
		t.Fatalf("sandbox create = %d %q %q", code, out, errOut)
	}
	defer space("", "sandbox", "rm", sb.ID)

	out, errOut, code = space("", "exec", sb.ID, "--", "sh", "-c", "echo hi; echo warn >&2; exit 42")
	if code != 42 || out != "hi\n" || errOut != "warn\n" {
		t.Errorf("exec = %d %q %q; want 42 \"hi\\n\" \"warn\\n\"", code, out, errOut)
	}
	out, _, code = space("line one\nline two\n", "exec", "-i", sb.ID, "--", "wc", "-l")
	if code != 0 || strings.TrimSpace(out) != "2" {
		t.Errorf("exec -i wc -l = %d %q", code, out)
	}
	out, errOut, code = space("", "exec", "--detach", sb.ID, "--", "sh", "-c", "sleep 1; echo late; exit 3")
	pid := strings.TrimSpace(out)
	if code != 0 || pid == "" {
		t.Fatalf("exec --detach = %d %q %q", code, out, errOut)
	}
	out, _, code = space("", "ps", sb.ID)
	if code != 0 || !strings.Contains(out, "sleep 1") {
		t.Errorf("ps = %d %q", code, out)
	}
	out, errOut, code = space("", "attach", sb.ID, pid)
	if code != 3 || out != "late\n" {
		t.Errorf("attach = %d %q %q; want 3 \"late\\n\"", code, out, errOut)
	}
	if _, _, code = space("", "sandbox", "rm", sb.ID); code != 0 {
		t.Errorf("sandbox rm = %d", code)
	}
	_, errOut, code = space("", "exec", sb.ID, "--", "true")
	if code != 125 || !strings.Contains(errOut, "not found") {
		t.Errorf("exec in removed sandbox = %d %q; want 125 and not found", code, errOut)
	}
}

// startRealServer runs a server with an embedded worker of real VMs for
// the rest of t, holding one test VM slot, and returns the environment
// the CLI reaches it with.
func startRealServer(t *testing.T) map[string]string {
	t.Helper()
	guesttest.Images(t)
	release := guesttest.AcquireSlot(t)
	t.Cleanup(release)
	agent := guesttest.Agent(t)
	dataDir := t.TempDir()
	workerID := "cli" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	t.Cleanup(func() {
		os.RemoveAll("/dev/shm/space-" + workerID)
		if h, err := cgroup.Detect(); err == nil {
			h.Destroy(context.Background(), "space-"+workerID)
		}
		storage.Unmount(context.Background(), filepath.Join(dataDir, "worker"))
	})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.Config{DataDir: dataDir, Listen: "127.0.0.1:0", CacheBase: guesttest.CacheBase(),
			AgentPath: agent, WorkerID: workerID, Ready: func(u string) { ready <- u }})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("setup: server: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return map[string]string{"SPACE_DATA_DIR": dataDir}
}
