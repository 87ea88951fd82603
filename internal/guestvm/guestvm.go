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
	"space/internal/agent/ring"
	"space/internal/errkind"
	"space/internal/image/kernel"
	"space/internal/image/rootfs"
	"space/internal/imagebuild"
	"space/internal/vmm"
)

// Config describes one guest.
type Config struct {
	// Images are the kernel, initramfs and root file system. Required.
	Images *imagebuild.Artifacts
	// Driver boots the VM. Required.
	Driver vmm.Driver
	// RunDir holds the VM's sockets, and its memory file unless
	// MemoryInDataDir; it should be on tmpfs (guest RAM is a shared
	// mapping of a file there) and short (unix socket paths). Created, and
	// removed by Close. Required.
	RunDir string
	// DataDir holds the writable layer. Created, and removed by Close.
	// Required.
	DataDir string
	// MemoryInDataDir puts the guest's memory file in DataDir, next to
	// the writable layer: on reflink-capable storage snapshots and
	// restores then share its extents rather than copy it.
	MemoryInDataDir bool
	// VCPUs is the number of vCPUs; 0 = 1.
	VCPUs int
	// MemoryMiB is the guest RAM; 0 = 512.
	MemoryMiB int
	// DiskMiB is the writable layer's size to the MiB (a sparse file: it
	// costs the host only what the guest writes); 0 = 4096. The guest's
	// file system is that size less ext4's metadata and journal.
	DiskMiB int64
	// Hostname is the guest's hostname; "" = "sandbox".
	Hostname string
	// NIC is the guest's network interface, or nil for none. Its
	// addresses are set through the agent (ConfigureNetwork).
	NIC *vmm.NIC
	// Placer puts the VMM process in its control group, or nil.
	Placer vmm.Placer
	// KeepIdentity makes Restore leave the guest the machine-id and
	// boot_id in the snapshot: the guest goes on as the machine it was (a
	// sandbox resumed from its own suspend snapshot, or rolled back to its
	// own checkpoint), not as a new one. Otherwise it gets new ones.
	KeepIdentity bool
	// TakeSnapshot lets Restore move the snapshot's files into the new VM
	// rather than copy them (vmm.Spec.TakeSnapshot): the snapshot is
	// spent, whatever the outcome.
	TakeSnapshot bool
	// Started, if set, is called once the VMM runs and before the agent
	// is awaited: the worker persists the VM's handle there, so a crash
	// from then on finds the VM. An error from it aborts the boot.
	Started func(vmm.VM) error
}

// VM is a running guest with a connected agent.
type VM struct {
	VMM      vmm.VM
	Client   *client.Client
	BootTime time.Duration // VMM start to the agent's first health reply
	// Identity is the guest's machine-id and boot_id as the host gave
	// them; zero if the guest kept the snapshot's (Config.KeepIdentity,
	// or an agent that predates them). A booted guest's BootID is "" (its
	// kernel drew one).
	Identity Identity

	cfg Config
}

// Boot boots the guest, waits until its agent answers and gives it a
// machine-id of its own. On error nothing is left running or on disk.
func Boot(ctx context.Context, cfg Config) (*VM, error) {
	if cfg.VCPUs == 0 {
		cfg.VCPUs = 1
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = 512
	}
	if cfg.DiskMiB == 0 {
		cfg.DiskMiB = 4096
	}
	v, err := start(ctx, cfg, func(ctx context.Context) (vmm.VM, error) {
		rw := filepath.Join(cfg.DataDir, "rw.img")
		if err := rootfs.NewWritableLayer(ctx, rw, cfg.DiskMiB<<20); err != nil {
			return nil, fmt.Errorf("writable layer: %w", err)
		}
		params := guestinit.Params{RW: "/dev/vdb", Hostname: cfg.Hostname}
		return cfg.Driver.Boot(ctx, vmm.Spec{
			RunDir:     filepath.Join(cfg.RunDir, "vm"),
			Kernel:     cfg.Images.Kernel.Vmlinux,
			Initrd:     cfg.Images.Initramfs,
			Cmdline:    kernel.Cmdline(params.Args()...),
			VCPUs:      cfg.VCPUs,
			MemoryMiB:  cfg.MemoryMiB,
			Disks:      []vmm.Disk{{Path: cfg.Images.Rootfs, ReadOnly: true}, {Path: rw}},
			NIC:        cfg.NIC,
			Placer:     cfg.Placer,
			MemoryPath: cfg.memoryPath(),
		})
	})
	if err != nil {
		return nil, err
	}
	// The image may bring a machine-id (baked into it when it was built)
	// or none: either way the guest gets its own. Its kernel drew its
	// boot_id as it booted.
	id := Identity{MachineID: NewIdentity().MachineID}
	if v.Identity, err = postRestore(ctx, v.Client, "", id); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return nil, errors.Join(fmt.Errorf("machine id: %w", err), v.Close(cctx))
	}
	return v, nil
}

// start runs launch (a boot or a restore) with the directories in place,
// then connects to the agent. On error it undoes everything.
// memoryPath is vmm.Spec.MemoryPath for cfg.
func (cfg Config) memoryPath() string {
	if cfg.MemoryInDataDir {
		return filepath.Join(cfg.DataDir, "memory")
	}
	return ""
}

func start(ctx context.Context, cfg Config, launch func(context.Context) (vmm.VM, error)) (_ *VM, err error) {
	if cfg.Images == nil || cfg.Driver == nil || cfg.RunDir == "" || cfg.DataDir == "" {
		return nil, fmt.Errorf("guestvm: images, driver, run dir and data dir are required: %w", errkind.InvalidArgument)
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
	t0 := time.Now()
	vm, err := launch(ctx)
	if err != nil {
		return nil, err
	}
	v.VMM = vm
	if cfg.Started != nil {
		if err := cfg.Started(vm); err != nil {
			return nil, err
		}
	}
	c, err := Connect(ctx, vm)
	if err != nil {
		return nil, fmt.Errorf("agent: %w%s", err, consoleTail(vm))
	}
	v.Client = c
	v.BootTime = time.Since(t0)
	return v, nil
}

// rings maps each VM's ring file once per process: the host's slot
// allocator must be one per VM, whichever connection uses it.
var rings = ring.NewShared()

// Connect dials the VM's agent channel and waits until the agent answers,
// failing early if the VM exits.
func Connect(ctx context.Context, vm vmm.VM) (*client.Client, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-vm.Done():
			cancel(fmt.Errorf("vm exited: %w", errkind.Unavailable))
		case <-ctx.Done():
		}
	}()
	ep := vm.Handle().Agent
	var opts []client.Option
	if m := vm.Handle().Memory; m != nil {
		gm := ring.GuestMemory{Path: m.Path}
		for _, r := range m.Ranges {
			gm.Ranges = append(gm.Ranges, ring.MemRange{GPA: r.GPA, Offset: r.Offset, Size: r.Size})
		}
		opts = append(opts, client.WithRing(func(chunks []uint64) (*ring.Region, func(), error) { return rings.Open(gm, chunks) }),
			client.WithGuestMemory(gm))
	}
	switch ep.Kind {
	case "unix":
		return client.DialUnixWait(ctx, ep.Path, opts...)
	case "hybrid-vsock":
		return client.DialWait(ctx, func(ctx context.Context) (*client.Client, error) {
			return client.DialHybridVsock(ctx, ep.Path, ep.Port)
		})
	case "vsock":
		return client.DialWait(ctx, func(ctx context.Context) (*client.Client, error) {
			return client.DialVsock(ctx, ep.CID, ep.Port)
		})
	}
	return nil, fmt.Errorf("agent endpoint kind %q: %w", ep.Kind, errkind.InvalidArgument)
}

// serialLogger is a VM that keeps its console output.
type serialLogger interface{ SerialLog() ([]byte, error) }

// consoleTail returns the end of the VM's console output for an error
// message, or "" when the driver keeps none.
func consoleTail(vm vmm.VM) string {
	sl, ok := vm.(serialLogger)
	if !ok {
		return ""
	}
	log, err := sl.SerialLog()
	if err != nil || len(log) == 0 {
		return ""
	}
	return "; guest console:\n" + string(tail(log, 4096))
}

// Close powers the guest off (briefly asking the agent first), stops the VM
// and removes its files. It is safe to call more than once.
func (v *VM) Close(ctx context.Context) error {
	var errs []error
	if v.Client != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if v.Client.Shutdown(sctx, false) == nil && v.VMM != nil {
			select { // a clean power-off leaves a clean writable layer
			case <-v.VMM.Done():
			case <-sctx.Done():
			}
		}
		cancel()
		v.Client.Close()
	}
	if v.VMM != nil {
		errs = append(errs, v.VMM.Stop(ctx))
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

// Snapshot snapshots the guest (memory, device state and writable layer)
// into dir; the guest keeps running. The driver must be a vmm.Snapshotter.
func (v *VM) Snapshot(ctx context.Context, dir string) (*vmm.Snapshot, error) {
	s, ok := v.VMM.(vmm.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("snapshot: %T cannot snapshot: %w", v.VMM, errkind.FailedPrecondition)
	}
	return s.Snapshot(ctx, dir, vmm.SnapshotOptions{})
}

// Restore starts a guest from a snapshot of a guestvm guest with the same
// images, gives it its own writable layer (a copy of the snapshot's) and
// fresh identity: clock, entropy, hostname, machine-id and boot_id (unless
// cfg.KeepIdentity) via the agent's post-restore call (PostRestore). cfg.VCPUs and cfg.MemoryMiB are ignored: they are the snapshot's.
// BootTime includes the post-restore call.
func Restore(ctx context.Context, cfg Config, snapDir string) (*VM, error) {
	r, ok := cfg.Driver.(vmm.Restorer)
	if !ok {
		return nil, fmt.Errorf("restore: %T cannot restore: %w", cfg.Driver, errkind.FailedPrecondition)
	}
	t0 := time.Now()
	v, err := start(ctx, cfg, func(ctx context.Context) (vmm.VM, error) {
		return r.Restore(ctx, snapDir, vmm.Spec{
			RunDir:       filepath.Join(cfg.RunDir, "vm"),
			Kernel:       cfg.Images.Kernel.Vmlinux,
			Initrd:       cfg.Images.Initramfs,
			Disks:        []vmm.Disk{{Path: cfg.Images.Rootfs, ReadOnly: true}, {Path: filepath.Join(cfg.DataDir, "rw.img")}},
			NIC:          cfg.NIC,
			Placer:       cfg.Placer,
			MemoryPath:   cfg.memoryPath(),
			TakeSnapshot: cfg.TakeSnapshot,
		})
	})
	if err != nil {
		return nil, err
	}
	id := NewIdentity()
	if cfg.KeepIdentity {
		id = Identity{}
	}
	if v.Identity, err = postRestore(ctx, v.Client, cfg.Hostname, id); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return nil, errors.Join(fmt.Errorf("post-restore: %w", err), v.Close(cctx))
	}
	v.BootTime = time.Since(t0)
	return v, nil
}
