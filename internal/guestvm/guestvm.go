// Package guestvm boots a SPACE guest from built images and connects to its
// agent: the images, a fresh writable layer, a QEMU VM and the agent client,
// torn down together. It is the first slice of what the worker does per
// sandbox; the worker takes it over with the lifecycle API.
package guestvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/guestinit"
	"space/internal/errkind"
	"space/internal/image/kernel"
	"space/internal/image/rootfs"
	"space/internal/imagebuild"
	"space/internal/vmm/qemu"
)

// Config describes one guest.
type Config struct {
	// Images are the kernel, initramfs and root file system. Required.
	Images *imagebuild.Artifacts
	// Driver boots the VM. Required.
	Driver *qemu.Driver
	// RunDir holds the VM's sockets and memory file; it should be on tmpfs
	// (guest RAM is a shared mapping of a file there) and short (unix
	// socket paths). Created, and removed by Close. Required.
	RunDir string
	// DataDir holds the writable layer. Created, and removed by Close.
	// Required.
	DataDir string
	// VCPUs is the number of vCPUs; 0 = 1.
	VCPUs int
	// MemoryMiB is the guest RAM; 0 = 512.
	MemoryMiB int
	// DiskGiB is the writable layer's size (sparse: it costs only what the
	// guest writes); 0 = 4.
	DiskGiB int
	// Hostname is the guest's hostname; "" = "sandbox".
	Hostname string
}

// VM is a running guest with a connected agent.
type VM struct {
	QEMU     *qemu.VM
	Client   *client.Client
	BootTime time.Duration // VMM start to the agent's first health reply

	cfg Config
}

// Boot boots the guest and waits until its agent answers. On error nothing
// is left running or on disk.
func Boot(ctx context.Context, cfg Config) (_ *VM, err error) {
	if cfg.Images == nil || cfg.Driver == nil || cfg.RunDir == "" || cfg.DataDir == "" {
		return nil, fmt.Errorf("guestvm: images, driver, run dir and data dir are required: %w", errkind.InvalidArgument)
	}
	if cfg.VCPUs == 0 {
		cfg.VCPUs = 1
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = 512
	}
	if cfg.DiskGiB == 0 {
		cfg.DiskGiB = 4
	}
	v := &VM{cfg: cfg}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			err = errors.Join(err, v.Close(cctx))
		}
	}()
	for _, d := range []string{cfg.RunDir, cfg.DataDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	rw := filepath.Join(cfg.DataDir, "rw.img")
	if err := rootfs.NewWritableLayer(ctx, rw, int64(cfg.DiskGiB)<<30); err != nil {
		return nil, fmt.Errorf("writable layer: %w", err)
	}
	params := guestinit.Params{RW: "/dev/vdb", Port: qemu.AgentPort, Hostname: cfg.Hostname}
	start := time.Now()
	vm, err := cfg.Driver.Boot(ctx, qemu.Spec{
		Dir:       filepath.Join(cfg.RunDir, "vm"),
		Kernel:    cfg.Images.Kernel.Vmlinux,
		Initrd:    cfg.Images.Initramfs,
		Cmdline:   kernel.Cmdline(params.Args()...),
		VCPUs:     cfg.VCPUs,
		MemoryMiB: cfg.MemoryMiB,
		Disks: []qemu.Disk{
			{Path: cfg.Images.Rootfs, Format: "raw", ReadOnly: true},
			{Path: rw, Format: "raw"},
		},
	})
	if err != nil {
		return nil, err
	}
	v.QEMU = vm
	c, err := Connect(ctx, vm)
	if err != nil {
		log, _ := vm.SerialLog()
		return nil, fmt.Errorf("agent: %w; guest console:\n%s", err, tail(log, 4096))
	}
	v.Client = c
	v.BootTime = time.Since(start)
	return v, nil
}

// Connect dials the VM's agent channel and waits until the agent answers,
// failing early if the VM exits.
func Connect(ctx context.Context, vm *qemu.VM) (*client.Client, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-vm.Done():
			cancel(fmt.Errorf("vm exited: %w", errkind.Unavailable))
		case <-ctx.Done():
		}
	}()
	return client.DialUnixWait(ctx, vm.AgentSocket())
}

// Close powers the guest off (briefly asking the agent first), stops the VM
// and removes its files. It is safe to call more than once.
func (v *VM) Close(ctx context.Context) error {
	var errs []error
	if v.Client != nil {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if v.Client.Shutdown(sctx, false) == nil && v.QEMU != nil {
			v.QEMU.Wait(sctx) // a clean power-off leaves a clean writable layer
		}
		cancel()
		v.Client.Close()
	}
	if v.QEMU != nil {
		errs = append(errs, v.QEMU.Stop(ctx))
	}
	errs = append(errs, os.RemoveAll(v.cfg.RunDir), os.RemoveAll(v.cfg.DataDir))
	return errors.Join(errs...)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
