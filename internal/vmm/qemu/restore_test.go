package qemu_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"space/internal/agent/guesttest"
	"space/internal/vmm"
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
