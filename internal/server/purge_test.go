package server

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/cgroup"
	"space/internal/errkind"
	"space/internal/testenv"
)

// TestPurgeWorker runs a server on the fake VMM, makes sandboxes (one
// with a network and its egress gateway), stops the server
// (its guests run on, as VMs do), and purges its data dir as an
// uninstall does: no guest process, network namespace, control group,
// run file, mount or data file of the worker is left. (The fake's
// guests take socket NICs, as QEMU's do; tap NICs in network namespaces,
// Firecracker's, are removed by the same sandbox deletion.) A purge while the
// server runs is refused and removes nothing.
func TestPurgeWorker(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	dataDir, workerID := newDataDir(t), newWorkerID(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{DataDir: dataDir, WorkerID: workerID, Listen: "127.0.0.1:0", CacheBase: t.TempDir(),
			VMM: VMMFake, Version: "test", Ready: func(u string) { ready <- u }})
	}()
	var url string
	select {
	case url = <-ready:
	case err := <-done:
		t.Fatalf("setup: server: %v", err)
	case <-time.After(time.Minute):
		t.Fatalf("setup: server not ready in 1m")
	}
	key, err := os.ReadFile(filepath.Join(dataDir, AdminKeyFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	c, err := client.New(url, strings.TrimSpace(string(key)))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	netnsBefore := netnsList(t)
	if _, err := c.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 256}); err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := c.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 256, Network: &api.Network{}}); err != nil {
		t.Fatalf("create with a network: %v", err)
	}
	h, err := cgroup.Detect()
	if err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "detect cgroups: "+err.Error())
	}
	groups := cgroupDirs(h, "space-"+workerID)
	if len(groups) == 0 {
		t.Fatalf("setup: no control group space-%s", workerID)
	}

	if err := PurgeWorker(t.Context(), WorkerConfig{DataDir: dataDir, VMM: VMMFake}); !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "in use") {
		t.Errorf("PurgeWorker while the server runs = %v, want failed precondition: in use", err)
	}
	if _, err := c.Sandboxes(t.Context(), client.ListOptions{}); err != nil {
		t.Errorf("the server after a refused purge: %v", err)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("server: %v", err)
	}
	if err := PurgeWorker(t.Context(), WorkerConfig{DataDir: dataDir, VMM: VMMFake}); err != nil {
		t.Fatalf("PurgeWorker = %v", err)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir after purge: %v, want gone", err)
	}
	for _, g := range groups {
		if _, err := os.Stat(g); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("control group %s after purge: %v, want gone (its guests killed)", g, err)
		}
	}
	if got := netnsList(t); len(got) != len(netnsBefore) {
		t.Errorf("network namespaces after purge: %v, want as before: %v", got, netnsBefore)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", "space-"+workerID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run root after purge: %v, want gone", err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), dataDir) {
		t.Errorf("a mount under the purged data dir is left")
	}
	if err := PurgeWorker(t.Context(), WorkerConfig{DataDir: dataDir, VMM: VMMFake}); err != nil {
		t.Errorf("PurgeWorker again = %v, want nothing to do", err)
	}
}

func netnsList(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// cgroupDirs returns the directories of the group name in every
// hierarchy h has that exist.
func cgroupDirs(h *cgroup.Hierarchy, name string) []string {
	var out []string
	for _, root := range h.Roots() {
		if _, err := os.Stat(filepath.Join(root, name)); err == nil {
			out = append(out, filepath.Join(root, name))
		}
	}
	return out
}
