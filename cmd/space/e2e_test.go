package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

	// The worker's heartbeat samples the guest every 5 s: stats shows
	// what its kernel says it uses.
	var rows []statsRow
	deadline := time.Now().Add(time.Minute)
	for {
		out, errOut, code = space("", "sandbox", "stats", "--no-stream", "-o", "json", sb.ID)
		rows = nil
		if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 {
			t.Fatalf("sandbox stats = %d %q %q", code, out, errOut)
		}
		if rows[0].Sample != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if s := rows[0].Sample; s == nil || s.CPUs < 1 || s.MemTotalBytes < 200<<20 || s.MemUsedBytes <= 0 || s.DiskTotalBytes <= 0 || s.DiskUsedBytes <= 0 || s.VMMPSSBytes < 0 {
		t.Errorf("sandbox stats of a real VM = %+v, want the guest's CPUs, memory and disk", s)
	}

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

// TestCLIFileGetFromGuest: a tree that guest root made to plant a root
// shell on the host (a setuid-root copy of the shell, setgid and sticky
// directories, a world-writable file, a fifo, a device node) comes out of
// file get and file get -r with none of that, while executables and
// symlinks come out as they were.
func TestCLIFileGetFromGuest(t *testing.T) {
	env := startRealServer(t)
	space := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		g := newGlobals(strings.NewReader(""), &out, &errb, func(k string) string { return env[k] })
		code := execute(t.Context(), g, args)
		return out.String(), errb.String(), code
	}
	out, errOut, code := space("sandbox", "create", "--memory", "256", "-o", "json")
	var sb api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.State != "running" {
		t.Fatalf("sandbox create = %d %q %q", code, out, errOut)
	}
	defer space("sandbox", "rm", sb.ID)
	setup := "set -e; mkdir -p /root/t/sub /root/t/sgid /root/t/tmp; cp /bin/sh /root/t/suid-sh; chmod 4755 /root/t/suid-sh; " +
		"chmod 2775 /root/t/sgid; chmod 1777 /root/t/tmp; mkfifo /root/t/fifo; mknod /root/t/null c 1 3; " +
		"printf '#!/bin/sh\\necho hi\\n' > /root/t/sub/run.sh; chmod 755 /root/t/sub/run.sh; chown 1234:5678 /root/t/sub/run.sh; " +
		"ln -s sub/run.sh /root/t/run; echo x > /root/t/w; chmod 666 /root/t/w"
	if out, errOut, code := space("exec", sb.ID, "--", "sh", "-c", setup); code != 0 {
		t.Fatalf("setup in the guest = %d %q %q", code, out, errOut)
	}

	dir := t.TempDir()
	if out, errOut, code := space("file", "get", "-r", sb.ID, "/root/t", filepath.Join(dir, "t")); code != 0 {
		t.Fatalf("file get -r = %d %q %q", code, out, errOut)
	} else if !strings.Contains(errOut, "left out 2 ") {
		t.Errorf("file get -r stderr = %q, want a warning that the fifo and the device were left out", errOut)
	}
	if out, errOut, code := space("file", "get", sb.ID, "/root/t/suid-sh", filepath.Join(dir, "sh")); code != 0 {
		t.Fatalf("file get = %d %q %q", code, out, errOut)
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	want := map[string]hostFile{
		"t":            {Mode: fs.ModeDir | 0o700, UID: uid, GID: gid}, // the staging directory's
		"t/suid-sh":    {Mode: 0o755, UID: uid, GID: gid},
		"t/sgid":       {Mode: fs.ModeDir | 0o755, UID: uid, GID: gid},
		"t/tmp":        {Mode: fs.ModeDir | 0o755, UID: uid, GID: gid},
		"t/sub":        {Mode: fs.ModeDir | 0o755, UID: uid, GID: gid},
		"t/sub/run.sh": {Mode: 0o755, UID: uid, GID: gid},
		"t/run":        {Mode: fs.ModeSymlink, UID: uid, GID: gid, Target: "sub/run.sh"},
		"t/w":          {Mode: 0o644, UID: uid, GID: gid},
		"sh":           {Mode: 0o755, UID: uid, GID: gid},
	}
	if diff := cmp.Diff(want, hostTree(t, dir)); diff != "" {
		t.Errorf("files on the host after file get from the guest (-want +got):\n%s", diff)
	}
}
