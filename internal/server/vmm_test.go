package server

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/internal/errkind"
	"space/internal/image/kernel"
	"space/internal/imagebuild"
	"space/internal/testenv"
	"space/internal/vmm/firecracker/fcapi/fcapitest"
)

// The fake firecracker: this test binary, run as firecracker by a script.
const (
	envFakeFirecracker = "SPACE_TEST_FAKE_FIRECRACKER"
	envFakeFCSerial    = "SPACE_TEST_FAKE_FIRECRACKER_SERIAL"
)

// fakeFirecrackerMain stands in for a firecracker process whose guest
// prints what envFakeFCSerial says once started (a real kernel with no
// disk prints its panic).
func fakeFirecrackerMain() int {
	return fcapitest.RunProcess(os.Args[1:], fcapitest.Config{Version: "1.13.1", Serial: os.Getenv(envFakeFCSerial)}, os.Stdout, os.Stderr)
}

// fakeFirecrackerBinary writes a firecracker script that runs the fake,
// its guest printing serial.
func fakeFirecrackerBinary(t *testing.T, serial string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	dir, err := os.MkdirTemp("", "fcbin")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "firecracker")
	script := fmt.Sprintf("#!/bin/sh\nexport %s=1 %s=%q\nexec %q \"$@\"\n", envFakeFirecracker, envFakeFCSerial, serial, self)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return path
}

// TestChooseVMMWithFakeFirecracker checks --vmm auto and firecracker with
// a fake firecracker binary (none can run on the machines this suite was
// written on): auto takes Firecracker only when its binary is there and
// KVM boots a guest under it, and says why when it falls back to QEMU;
// firecracker asked for and unusable is an error that says why.
func TestChooseVMMWithFakeFirecracker(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // /dev/kvm is root's
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		testenv.Unavailable(t, testenv.TierKVM, "fake firecracker: /dev/kvm does not open for writing here; Firecracker's probe refuses before it boots")
	} else {
		f.Close()
	}
	dir := t.TempDir()
	vmlinux := filepath.Join(dir, "vmlinux")
	if err := os.WriteFile(vmlinux, []byte("vmlinux"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	img := &imagebuild.Artifacts{Kernel: &kernel.Kernel{Vmlinux: vmlinux}}
	defer func(d time.Duration) { fcProbeTimeout = d }(fcProbeTimeout)
	fcProbeTimeout = time.Second // the silent guest's probe waits for it
	panics := fakeFirecrackerBinary(t, "Kernel panic - not syncing: VFS: Unable to mount root fs\n")
	silent := fakeFirecrackerBinary(t, "")
	for _, tt := range []struct {
		name, vmm, binary string
		want              string // the kind chosen, or "" for an error
		why               string // in the log or the error
	}{
		{"auto without firecracker", VMMAuto, "/nonexistent/firecracker", VMMQEMU, "not found"},
		{"auto where kvm boots", VMMAuto, panics, VMMFirecracker, ""},
		{"auto where kvm does not boot", "", silent, VMMQEMU, "did not get as far as its panic"},
		{"firecracker where kvm boots", VMMFirecracker, panics, VMMFirecracker, ""},
		{"firecracker without it", VMMFirecracker, "/nonexistent/firecracker", "", "not found"},
		{"qemu", VMMQEMU, panics, VMMQEMU, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			wc := workerConfig{VMM: tt.vmm, Firecracker: Firecracker{Binary: tt.binary}, Images: img, Log: slog.New(slog.NewTextHandler(&logs, nil))}
			kind, fc, err := chooseVMM(t.Context(), wc, t.TempDir())
			if tt.want == "" {
				if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), tt.why) {
					t.Errorf("chooseVMM = %q, %v; want failed precondition saying %q", kind, err, tt.why)
				}
				return
			}
			if err != nil || kind != tt.want || (fc != nil) != (tt.want == VMMFirecracker) {
				t.Fatalf("chooseVMM = %q, %v, %v; want %q", kind, fc, err, tt.want)
			}
			if fc != nil && (fc.info.Kind != VMMFirecracker || fc.info.Version != "1.13.1" || fc.info.Accel != "kvm" || !fc.info.DiffSnapshots) {
				t.Errorf("firecracker's capabilities = %+v, want firecracker 1.13.1, kvm, diff snapshots", fc.info)
			}
			if tt.why != "" && !strings.Contains(logs.String(), tt.why) {
				t.Errorf("log of the choice does not say %q:\n%s", tt.why, logs.String())
			}
		})
	}
}
