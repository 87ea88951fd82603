package firecracker

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"space/internal/errkind"
	"space/internal/testenv"
)

// kvmOpens reports whether /dev/kvm opens for writing, as ProbeKVM
// requires before it boots.
func kvmOpens() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err == nil {
		f.Close()
	}
	return err == nil
}

// TestVersionOfBinary checks Version parses `firecracker --version`, here
// the fake firecracker's.
func TestVersionOfBinary(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{version: "1.10.1"})
	d := newTestDriver(t, Config{Binary: fc.path})
	if v, err := d.Version(t.Context()); err != nil || v != "1.10.1" {
		t.Errorf("Version = %q, %v; want 1.10.1", v, err)
	}
}

// TestProbeKVMWithFakeFirecracker checks the probe's decision on what
// the guest's console shows, with the fake firecracker standing in for
// the VMM (no firecracker binary can run on the machines the suite was
// written on): a console with the kernel's panic passes; a silent guest
// fails once the timeout passes, saying so; either way the probe's run
// directory is gone and the fake has exited.
func TestProbeKVMWithFakeFirecracker(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // /dev/kvm is root's
	if !kvmOpens() {
		testenv.Unavailable(t, testenv.TierKVM, "fake firecracker: /dev/kvm does not open for writing here; the probe refuses before it boots")
	}
	dir := shortTempDir(t, "fck")
	kernel := filepath.Join(dir, "vmlinux")
	if err := os.WriteFile(kernel, []byte("vmlinux"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "fcprobe*"))

	fc := newFakeFirecracker(t, fakeOptions{serial: "[    0.5] Kernel panic - not syncing: VFS: Unable to mount root fs\n"})
	d := newTestDriver(t, Config{Binary: fc.path})
	if err := d.ProbeKVM(t.Context(), kernel, 10*time.Second); err != nil {
		t.Errorf("ProbeKVM with a guest that panics = %v, want nil", err)
	}

	silent := newFakeFirecracker(t, fakeOptions{})
	d = newTestDriver(t, Config{Binary: silent.path})
	t0 := time.Now()
	err := d.ProbeKVM(t.Context(), kernel, 500*time.Millisecond)
	if !errors.Is(err, errkind.FailedPrecondition) || time.Since(t0) > 15*time.Second {
		t.Errorf("ProbeKVM with a silent guest = %v after %v, want failed precondition at its timeout", err, time.Since(t0))
	}
	after, _ := filepath.Glob(filepath.Join(os.TempDir(), "fcprobe*"))
	if len(after) > len(before) {
		t.Errorf("probe run dirs left: %v (before: %v)", after, before)
	}
}
