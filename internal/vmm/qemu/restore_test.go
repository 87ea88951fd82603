package qemu_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"space/internal/agent/guesttest"
	"space/internal/testenv"
	"space/internal/vmm"
	"space/internal/vmm/qemu"
)

// TestRestoreRefusesOtherQEMUVersion writes a snapshot whose metadata names
// another QEMU version: Restore must refuse it with ErrIncompatible and
// leave no QEMU running.
func TestRestoreRefusesOtherQEMUVersion(t *testing.T) {
	img := guesttest.Images(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	d, err := guesttest.Driver(t)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	kfi, _ := os.Stat(img.Kernel.Vmlinux)
	rfi, _ := os.Stat(img.Rootfs)
	snap := t.TempDir()
	meta := map[string]any{
		"format": 1, "driver": "qemu", "version": "1.0.0", "machine": "q35", "accel": "tcg",
		"vcpus": 1, "memory_mib": 128, "kernel": map[string]any{"size": kfi.Size()},
		"cmdline": "console=ttyS0", "disks": []map[string]any{{"read_only": true, "size": rfi.Size()}},
	}
	b, _ := json.Marshal(meta)
	os.WriteFile(filepath.Join(snap, "snapshot.json"), b, 0o600)
	f, _ := os.Create(filepath.Join(snap, "memory"))
	f.Truncate(128 << 20)
	f.Close()
	os.WriteFile(filepath.Join(snap, "state"), nil, 0o600)

	run, err := os.MkdirTemp("/dev/shm", "space-qemu-test-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer os.RemoveAll(run)
	_, err = d.Restore(t.Context(), snap, vmm.Spec{RunDir: filepath.Join(run, "vm"), Kernel: img.Kernel.Vmlinux,
		Disks: []vmm.Disk{{Path: img.Rootfs, ReadOnly: true}}})
	if !errors.Is(err, vmm.ErrIncompatible) {
		t.Fatalf("Restore(snapshot of qemu 1.0.0) = %v, want ErrIncompatible", err)
	}
	t.Logf("Restore = %v", err)
	entries, _ := os.ReadDir(filepath.Join(run, "vm"))
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".log" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	// No QEMU of ours is left running with that run dir.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), run) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			t.Errorf("process %d still runs with the run dir", pid)
		}
	}
}

// TestRunsAsUser checks that Config.User really drops QEMU to that user.
func TestRunsAsUser(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierQEMU)
	img := guesttest.Images(t)
	d, err := qemu.New(qemu.Config{User: &qemu.User{UID: 65534, GID: 65534}, Accel: "tcg"})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	run, err := os.MkdirTemp("/dev/shm", "space-qemu-test-")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer os.RemoveAll(run)
	vm, err := d.Start(t.Context(), qemu.Spec{Dir: filepath.Join(run, "vm"), Kernel: img.Kernel.Vmlinux, MemoryMiB: 64, Paused: true})
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	defer vm.Stop(context.Background())
	status, err := os.ReadFile("/proc/" + strconv.Itoa(vm.Pid()) + "/status")
	if err != nil {
		t.Fatalf("read status: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Gid:") {
			if f := strings.Fields(line); len(f) < 3 || f[1] != "65534" || f[2] != "65534" {
				t.Errorf("qemu %s, want 65534 (real and effective)", line)
			}
		}
	}
}
