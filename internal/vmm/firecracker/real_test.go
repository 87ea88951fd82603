package firecracker

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/guestinit"
	"space/internal/agent/guesttest"
	"space/internal/image/kernel"
	"space/internal/image/rootfs"
	"space/internal/testenv"
	"space/internal/vmm"
	"space/internal/vmm/vmmtest"
)

// requireFirecracker gates tests that boot real Firecracker VMs: the
// binary must be on PATH and the host must have KVM. Whether KVM can
// actually run a guest is probed by booting one (probeGuest), never by
// opening /dev/kvm, which succeeds on hosts whose guests then hang.
func requireFirecracker(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("firecracker"); err != nil {
		testenv.Unavailable(t, testenv.TierFirecracker, "firecracker: binary not found")
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		testenv.Unavailable(t, testenv.TierFirecracker, "kvm: "+err.Error())
	}
}

// probeGuest boots the stock kernel alone and waits for its banner on the
// console: if none comes, KVM here cannot run a guest.
func probeGuest(t *testing.T, d *Driver, vmlinux string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	run := filepath.Join(shortTempDir(t, "fcprobe"), "vm")
	vm, err := d.Boot(ctx, vmm.Spec{RunDir: run, Kernel: vmlinux, Cmdline: "console=ttyS0 loglevel=8", MemoryMiB: 128})
	if err != nil {
		t.Fatalf("setup: probe boot: %v", err)
	}
	defer vm.Stop(context.WithoutCancel(ctx))
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(filepath.Join(run, consoleLog)); strings.Contains(string(b), "Linux version") {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	testenv.Unavailable(t, testenv.TierFirecracker, "kvm: a stock guest printed nothing within 15s")
}

// TestRealFirecrackerBoot boots the SPACE guest (kernel, initramfs with
// the agent, root image, writable layer) under the real Firecracker,
// talks to the agent over hybrid vsock, then snapshots the VM and talks
// to the agent again in the restored one.
func TestRealFirecrackerBoot(t *testing.T) {
	requireFirecracker(t)
	img := guesttest.Images(t)
	d := newTestDriver(t, Config{Log: testLogger(t)})
	probeGuest(t, d, img.Kernel.Vmlinux)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	data := shortTempDir(t, "fcdata")
	rw := filepath.Join(data, "rw.img")
	if err := rootfs.NewWritableLayer(ctx, rw, 1<<30); err != nil {
		t.Fatalf("setup: writable layer: %v", err)
	}
	params := guestinit.Params{RW: "/dev/vdb", Transport: "vsock", VsockPort: AgentPort}
	spec := vmm.Spec{
		RunDir:    filepath.Join(shortTempDir(t, "fcreal"), "vm"),
		Kernel:    img.Kernel.Vmlinux,
		Initrd:    img.Initramfs,
		Cmdline:   kernel.Cmdline(params.Args()...),
		VCPUs:     1,
		MemoryMiB: 512,
		Disks:     []vmm.Disk{{Path: img.Rootfs, ReadOnly: true}, {Path: rw}},
	}
	vm, err := d.Boot(ctx, spec)
	if err != nil {
		t.Fatalf("Boot: %v", err)
	}
	v := vm.(*VM)
	defer v.Stop(context.WithoutCancel(ctx))
	dialAgent(ctx, t, v)

	snap := filepath.Join(shortTempDir(t, "fcsnap"), "s")
	if _, err := v.Snapshot(ctx, snap, vmm.SnapshotOptions{}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	dialAgent(ctx, t, v) // the source runs on; its vsock connections were reset
	stopVM(t, v)

	spec.RunDir = filepath.Join(shortTempDir(t, "fcreal"), "clone")
	spec.Disks[1].Path = filepath.Join(data, "clone-rw.img")
	rvm, err := d.Restore(ctx, snap, spec)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	rv := rvm.(*VM)
	defer rv.Stop(context.WithoutCancel(ctx))
	dialAgent(ctx, t, rv)
}

// TestConformanceRealFirecracker runs the vmm conformance suite (real
// guests) against the driver.
func TestConformanceRealFirecracker(t *testing.T) {
	requireFirecracker(t)
	img := guesttest.Images(t)
	probeGuest(t, newTestDriver(t, Config{}), img.Kernel.Vmlinux)
	vmmtest.Run(t, func(t *testing.T) vmm.Driver {
		return newTestDriver(t, Config{Log: testLogger(t)})
	})
}

// dialAgent connects to the VM's agent over hybrid vsock, retrying while
// the guest boots, and checks that it answers.
func dialAgent(ctx context.Context, t *testing.T, v *VM) {
	t.Helper()
	h := v.Handle()
	if h.Agent.Kind != "hybrid-vsock" {
		t.Fatalf("agent endpoint %+v, want hybrid-vsock", h.Agent)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := client.DialHybridVsock(actx, h.Agent.Path, h.Agent.Port)
		if err == nil {
			err = c.WaitReady(actx)
			if err == nil {
				cancel()
				c.Close()
				return
			}
			c.Close()
		}
		cancel()
		select {
		case <-v.Done():
			t.Fatalf("firecracker exited before the agent answered; console:\n%s", tail(filepath.Join(v.runDir, consoleLog), 4096))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not answer over vsock: %v; console:\n%s", err, tail(filepath.Join(v.runDir, consoleLog), 4096))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testLogger sends the driver's log lines to the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}
