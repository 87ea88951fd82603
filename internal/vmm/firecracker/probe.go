package firecracker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"space/internal/errkind"
	"space/internal/vmm"
)

// Version asks the binary for its version ("1.10.1").
func (d *Driver) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, d.bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %w", d.bin, err, errkind.FailedPrecondition)
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Firecracker v"); ok && v != "" {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s --version printed %.80q, want a line \"Firecracker vX.Y.Z\": %w", d.bin, out, errkind.FailedPrecondition)
}

// probeCmdline boots a kernel with no root file system: it panics
// looking for one, which is as far as the probe needs it to get.
const probeCmdline = "console=ttyS0 reboot=k panic=-1"

// ProbeKVM boots kernel (an ELF vmlinux) with no disk under this driver
// and returns nil once the guest's console shows the kernel's panic
// (it found no root file system), within timeout: KVM here runs stock
// guests. A KVM that opens but does not run them (a paravirtual one that
// needs special guest kernels, say) fails it. It leaves nothing behind.
// Errors wrap errkind.FailedPrecondition.
func (d *Driver) ProbeKVM(ctx context.Context, kernel string, timeout time.Duration) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("kvm: %w: %w", err, errkind.FailedPrecondition)
	}
	f.Close()
	dir, err := os.MkdirTemp("", "fcprobe")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	vm, err := d.Boot(ctx, vmm.Spec{RunDir: filepath.Join(dir, "vm"), Kernel: kernel, Cmdline: probeCmdline, MemoryMiB: 128})
	if err != nil {
		return fmt.Errorf("kvm probe boot: %w: %w", err, errkind.FailedPrecondition)
	}
	v := vm.(*VM)
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		v.Stop(sctx)
	}()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		out, _ := v.SerialLog()
		if bytes.Contains(out, []byte("Kernel panic")) {
			return nil
		}
		select {
		case <-ctx.Done():
			tail := out[max(0, len(out)-200):]
			return fmt.Errorf("kvm probe: the guest did not get as far as its panic within %v (console ends %q): %w", timeout, tail, errkind.FailedPrecondition)
		case <-t.C:
		}
	}
}
