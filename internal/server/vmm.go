package server

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"time"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/vmm"
	"space/internal/vmm/fake"
	"space/internal/vmm/firecracker"
	"space/internal/vmm/firecracker/fcapi"
	"space/internal/vmm/qemu"
	"space/internal/worker"
)

// The hypervisor drivers a worker can run (Config.VMM, WorkerConfig.VMM).
const (
	// VMMAuto runs Firecracker where its binary is found and KVM boots a
	// stock guest under it, else QEMU (with KVM where a probe boot under
	// it works, else TCG).
	VMMAuto        = "auto"
	VMMQEMU        = "qemu"
	VMMFirecracker = "firecracker"
	// VMMFake runs guests as jailed host processes (package vmm/fake):
	// for control-plane tests and load tests, not a sandbox.
	VMMFake = "fake"
)

func checkVMM(kind string) error {
	switch kind {
	case "", VMMAuto, VMMQEMU, VMMFirecracker, VMMFake:
		return nil
	}
	return fmt.Errorf("vmm %q, want %s, %s, %s or %s: %w", kind, VMMAuto, VMMQEMU, VMMFirecracker, VMMFake, errkind.InvalidArgument)
}

// Firecracker configures the Firecracker driver.
type Firecracker struct {
	// Binary is the firecracker executable, a path or a name on PATH; ""
	// = firecracker.
	Binary string
	// Jailer, if set, is the jailer executable (of Binary's release):
	// every Firecracker then runs through it, chrooted, as UID and GID.
	// "" runs Firecracker directly.
	Jailer string
	// UID and GID are what jailed Firecrackers run as; 0 =
	// DefaultFirecrackerUID and GID.
	UID, GID int
}

// HostPaths say where on the host a worker keeps what its VMs need while
// they run. A worker in a container (a Kubernetes pod) points them at the
// host's, mounted into it, so that its VMs outlive the container and the
// next one re-adopts them.
type HostPaths struct {
	// CgroupRoot is the cgroup hierarchy the VMs' groups are made in (the
	// host's /sys/fs/cgroup, mounted into the container); "" = this
	// process's own /sys/fs/cgroup.
	CgroupRoot string
	// RunRoot holds the VMs' run directories (sockets, memory files): a
	// tmpfs that outlives the worker; "" = /dev/shm/space-<worker id>.
	RunRoot string
}

// DefaultFirecrackerUID and GID are what jailed Firecrackers run as by
// default: like QEMU's (qemu.DefaultUID), an ID no account uses.
const (
	DefaultFirecrackerUID = qemu.DefaultUID + 1
	DefaultFirecrackerGID = qemu.DefaultGID + 1
)

// fcProbeTimeout bounds Firecracker's KVM probe boot: a kernel with no
// disk reaches its panic in well under a second under KVM. A variable
// for tests.
var fcProbeTimeout = 20 * time.Second

// openDriver returns the driver wc.VMM names (choosing, for auto), what
// the worker reports of it, and the boot timeout that suits it. jailDir
// is a directory on the worker's storage, where a jailed Firecracker's
// chroots go (its disks are hard-linked into them).
func openDriver(ctx context.Context, wc workerConfig, cache *cachedir.Dir, jailDir string) (vmm.Driver, worker.VMMInfo, time.Duration, error) {
	kind, fc, err := chooseVMM(ctx, wc, jailDir)
	if err != nil {
		return nil, worker.VMMInfo{}, 0, err
	}
	if fc != nil {
		return fc.drv, fc.info, 30 * time.Second, nil
	}
	switch kind {
	case VMMQEMU:
		return openQEMU(ctx, wc, cache)
	case VMMFake:
		wc.Log.Warn("vmm fake: guests are jailed host processes, not virtual machines; for tests and load tests only, never for untrusted code")
		if wc.Progress != nil {
			fmt.Fprintln(wc.Progress, "space: WARNING: --vmm fake: sandboxes are jailed host processes, NOT virtual machines (tests and load tests only)")
		}
		fd, err := fake.New(fake.Config{Log: wc.Log, Faults: wc.FakeFaults})
		if err != nil {
			return nil, worker.VMMInfo{}, 0, err
		}
		// A fake guest answers within milliseconds of its start.
		return fd, worker.VMMInfo{Kind: VMMFake, Version: fake.Version, Accel: fake.Accel}, 10 * time.Second, nil
	}
	return nil, worker.VMMInfo{}, 0, checkVMM(wc.VMM)
}

// chooseVMM resolves wc.VMM: for Firecracker (asked for, or chosen by
// auto) it returns the opened driver too. Auto logs what it chose and,
// when it fell back to QEMU, why.
func chooseVMM(ctx context.Context, wc workerConfig, jailDir string) (string, *openedFirecracker, error) {
	switch wc.VMM {
	case "", VMMAuto:
		fd, err := openFirecracker(ctx, wc, filepath.Join(jailDir, "jailer"))
		if err != nil {
			wc.Log.Info("vmm chosen", "vmm", VMMQEMU, "by", VMMAuto, "firecracker_not_used", err.Error())
			return VMMQEMU, nil, nil
		}
		wc.Log.Info("vmm chosen", "vmm", VMMFirecracker, "by", VMMAuto, "version", fd.info.Version)
		return VMMFirecracker, &fd, nil
	case VMMFirecracker:
		fd, err := openFirecracker(ctx, wc, filepath.Join(jailDir, "jailer"))
		if err != nil {
			return "", nil, fmt.Errorf("vmm firecracker: %w", err)
		}
		return VMMFirecracker, &fd, nil
	}
	return wc.VMM, nil, checkVMM(wc.VMM)
}

// openQEMU returns the QEMU driver, with the accelerator its probe
// chose.
func openQEMU(ctx context.Context, wc workerConfig, cache *cachedir.Dir) (vmm.Driver, worker.VMMInfo, time.Duration, error) {
	qcfg := qemu.Config{Binary: qemuBinary, Log: wc.Log, AccelCache: filepath.Join(cache.Root(), "accel-probe.json")}
	// As root, QEMU runs jailed as qemu.DefaultUID and DefaultGID.
	qd, err := qemu.New(qcfg)
	if err != nil {
		return nil, worker.VMMInfo{}, 0, err
	}
	accel := "unknown" // a purge boots nothing
	if !wc.Purge {
		if accel, err = qd.Accel(ctx, wc.Images.Kernel.Vmlinux); err != nil {
			return nil, worker.VMMInfo{}, 0, err
		}
	}
	wc.Log.Info("accelerator chosen", "accel", accel)
	version, err := qemuVersion(ctx, qemuBinary)
	if err != nil {
		wc.Log.Warn("qemu version unknown", "err", err) // only reported, in the worker's capabilities
	}
	// Waits scale with the accelerator: a TCG guest boots in seconds, a
	// KVM one in well under one.
	bootTimeout := 2 * time.Minute
	if accel == "kvm" {
		bootTimeout = 30 * time.Second
	}
	return qd, worker.VMMInfo{Kind: VMMQEMU, Version: version, Accel: accel}, bootTimeout, nil
}

type openedFirecracker struct {
	drv  *firecracker.Driver
	info worker.VMMInfo
}

// openFirecracker returns the Firecracker driver wc configures, once its
// binary answers its version and KVM boots the default template's
// kernel under it; otherwise an error that says which failed.
func openFirecracker(ctx context.Context, wc workerConfig, chroots string) (openedFirecracker, error) {
	bin := wc.Firecracker.Binary
	if bin == "" {
		bin = "firecracker"
	}
	if _, err := exec.LookPath(bin); err != nil {
		return openedFirecracker{}, fmt.Errorf("binary %q not found: %w", bin, errkind.FailedPrecondition)
	}
	cfg := firecracker.Config{Binary: bin, Log: wc.Log}
	if wc.Firecracker.Jailer != "" {
		uid, gid := wc.Firecracker.UID, wc.Firecracker.GID
		if uid == 0 {
			uid = DefaultFirecrackerUID
		}
		if gid == 0 {
			gid = DefaultFirecrackerGID
		}
		cfg.Jailer = &firecracker.JailerConfig{Binary: wc.Firecracker.Jailer, UID: uid, GID: gid, ChrootBaseDir: chroots}
	}
	d, err := firecracker.New(cfg)
	if err != nil {
		return openedFirecracker{}, err
	}
	version, err := d.Version(ctx)
	if err != nil {
		return openedFirecracker{}, err
	}
	v, err := fcapi.ParseVersion(version)
	if err != nil {
		return openedFirecracker{}, fmt.Errorf("version %q: %w", version, errors.Join(err, errkind.FailedPrecondition))
	}
	if !wc.Purge { // a purge boots nothing
		t0 := time.Now()
		if err := d.ProbeKVM(ctx, wc.Images.Kernel.Vmlinux, fcProbeTimeout); err != nil {
			return openedFirecracker{}, err
		}
		wc.Log.Info("firecracker kvm probe boot", "ok", true, "took", time.Since(t0).Round(time.Millisecond), "version", version, "jailer", cfg.Jailer != nil)
	}
	// Without KVM dirty tracking, diffs need Firecracker 1.13's mincore.
	return openedFirecracker{drv: d, info: worker.VMMInfo{Kind: VMMFirecracker, Version: version, Accel: "kvm", DiffSnapshots: v.AtLeast(1, 13)}}, nil
}
