package firecracker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
)

// Files of a snapshot directory, and the names a jailed Firecracker
// writes or reads them under in its root.
const (
	vmstateFile    = "vmstate"
	memoryFile     = "memory"
	metadataFile   = "snapshot.json"
	jailVMState    = "snapshot.vmstate"
	jailMemory     = "snapshot.memory"
	metadataFormat = 1
)

// ErrNotPaused is returned by Snapshot while the VM's vCPUs run.
var ErrNotPaused = fmt.Errorf("vm is not paused: %w", errkind.FailedPrecondition)

// Metadata describes a snapshot. Snapshot writes it as snapshot.json next
// to the vmstate and memory files, last: a directory without it holds no
// complete snapshot.
type Metadata struct {
	Format             int    `json:"format"`              // 1
	Driver             string `json:"driver"`              // "firecracker"
	FirecrackerVersion string `json:"firecracker_version"` // only this version can load it
	Type               string `json:"type"`                // "Full" or "Diff"
	// Loadable is false for a diff that must first be merged onto its
	// base: every diff but the first one of a booted guest.
	Loadable   bool      `json:"loadable"`
	Created    time.Time `json:"created"`
	HostCPU    string    `json:"host_cpu,omitempty"`    // /proc/cpuinfo model name
	HostKernel string    `json:"host_kernel,omitempty"` // uname -r
	VMState    string    `json:"vmstate"`               // file names in the directory
	Memory     string    `json:"memory"`
	Layout     Layout    `json:"layout"`
}

// ReadMetadata reads the metadata of the snapshot in dir: an
// errkind.NotFound error if there is none, errkind.InvalidArgument if it
// does not parse.
func ReadMetadata(dir string) (*Metadata, error) {
	b, err := os.ReadFile(filepath.Join(dir, metadataFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("snapshot %s: no %s: %w", dir, metadataFile, errkind.NotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	var md Metadata
	if err := json.Unmarshal(b, &md); err != nil {
		return nil, fmt.Errorf("snapshot %s: %s: %v: %w", dir, metadataFile, err, errkind.InvalidArgument)
	}
	return &md, nil
}

// Snapshot writes a snapshot of the paused VM into dir (created 0700):
// vmstate, memory and snapshot.json. A diff holds only the pages dirtied
// since the last snapshot, boot or restore (a sparse memory file). The VM
// stays paused; its vsock connections are reset. Disks are not included:
// copy writable ones while the VM is still paused. It returns ErrNotPaused
// while the vCPUs run, an errkind.Conflict error if dir already holds a
// snapshot (restored VMs may map its memory file), and
// errkind.FailedPrecondition for a diff without dirty tracking before
// Firecracker 1.13. Handle changes afterwards.
func (v *VM) Snapshot(ctx context.Context, dir string, diff bool) (_ *Metadata, err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot vm %d: %w", v.proc.pid, err)
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("snapshot vm %d to %s: %w", v.proc.pid, dir, err)
		}
	}()
	if v.proc.exited() || v.stopping.Load() {
		return nil, vmm.ErrExited
	}
	kind := fcapi.Full
	if diff {
		kind = fcapi.Diff
		if !v.st.Layout.DirtyTracking && !v.ver.AtLeast(1, 13) {
			return nil, fmt.Errorf("diff without dirty tracking needs firecracker 1.13, have %s: %w", v.version, errkind.FailedPrecondition)
		}
	}
	v.mu.Lock()
	busy := v.snapshotting
	v.snapshotting = true
	taken := v.snapshots
	v.mu.Unlock()
	if busy {
		return nil, fmt.Errorf("another snapshot is being taken: %w", errkind.Conflict)
	}
	defer func() {
		v.mu.Lock()
		v.snapshotting = false
		v.mu.Unlock()
	}()

	wctx, done := v.watch(ctx)
	defer done()
	info, err := v.api.Instance(wctx)
	if err != nil {
		return nil, err
	}
	if info.State != fcapi.StatePaused {
		return nil, fmt.Errorf("state %q: %w", info.State, ErrNotPaused)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	dstState, dstMem, dstMeta := filepath.Join(dir, vmstateFile), filepath.Join(dir, memoryFile), filepath.Join(dir, metadataFile)
	for _, p := range []string{dstState, dstMem, dstMeta} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s exists: %w", p, errkind.Conflict)
		}
	}
	// Jailed, Firecracker writes inside its root; the files move out after.
	fcState, fcMem := dstState, dstMem
	if v.st.Jail != nil {
		fcState, fcMem = jailVMState, jailMemory
	}
	defer func() {
		if err != nil {
			for _, p := range []string{dstState, dstMem, filepath.Join(v.st.Root, jailVMState), filepath.Join(v.st.Root, jailMemory)} {
				removeIfExists(p)
			}
		}
	}()
	start := time.Now()
	if err := v.api.CreateSnapshot(wctx, fcapi.SnapshotCreate{SnapshotType: kind, SnapshotPath: fcState, MemFilePath: fcMem}); err != nil {
		return nil, err
	}
	if j := v.st.Jail; j != nil {
		if err := moveOut(filepath.Join(v.st.Root, jailVMState), dstState, j.UID, j.GID); err != nil {
			return nil, err
		}
		if err := moveOut(filepath.Join(v.st.Root, jailMemory), dstMem, j.UID, j.GID); err != nil {
			return nil, err
		}
	}
	md := &Metadata{
		Format:             metadataFormat,
		Driver:             "firecracker",
		FirecrackerVersion: v.version,
		Type:               string(kind),
		Loadable:           !diff || (!v.st.Restored && taken == 0),
		Created:            time.Now().UTC(),
		HostCPU:            hostCPU(),
		HostKernel:         hostKernel(),
		VMState:            vmstateFile,
		Memory:             memoryFile,
		Layout:             v.st.Layout,
	}
	if err := writeMetadata(dir, md); err != nil {
		return nil, err
	}
	v.mu.Lock()
	v.snapshots++
	v.mu.Unlock()
	v.log.Info("snapshot taken", "dir", dir, "type", kind, "took", time.Since(start))
	return md, nil
}

// moveOut moves a file out of a jail, keeping it sparse and owned by the
// jail's uid (so that a jailed restore can read it).
func moveOut(src, dst string, uid, gid int) error {
	err := os.Rename(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		if err = copySparse(src, dst, 0o600); err == nil {
			err = errors.Join(os.Lchown(dst, uid, gid), os.Remove(src))
		}
	}
	if err != nil {
		return err
	}
	return os.Chmod(dst, 0o600)
}

func writeMetadata(dir string, md *Metadata) error {
	b, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".snapshot-*.json")
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, metadataFile))
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Restore starts a fresh Firecracker and loads the snapshot in
// snapshotDir into it with the File memory backend: guest memory is a
// private copy-on-write mapping of the memory file, which must stay
// unchanged while the VM lives. The VM runs when Restore returns. spec
// gives the run dir, the disks (same count and read-only flags as at
// snapshot time, with the contents of that moment) and the NIC (same
// presence and MAC; the tap may differ on 1.12+); zero VCPUs and
// MemoryMiB mean the snapshot's, other values must equal them; kernel,
// initrd and command line are ignored. A snapshot of another Firecracker
// version, CPU model or layout is vmm.ErrIncompatible; one that is not
// loadable on its own (a later diff) errkind.FailedPrecondition.
func (d *Driver) Restore(ctx context.Context, snapshotDir string, spec vmm.Spec) (vmm.VM, error) {
	start := time.Now()
	snapshotDir, err := filepath.Abs(snapshotDir)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", snapshotDir, err)
	}
	md, err := ReadMetadata(snapshotDir)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	spec, err = normalize(spec, false)
	if err != nil {
		return nil, err
	}
	layout, err := restoreLayout(md, spec, hostCPU(), d.dirtyTracking)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", snapshotDir, err)
	}
	snapState, snapMem := filepath.Join(snapshotDir, md.VMState), filepath.Join(snapshotDir, md.Memory)
	for _, p := range []string{snapState, snapMem} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("restore %s: %w: %w", snapshotDir, err, errkind.NotFound)
		}
	}
	var files []placement
	for i, disk := range md.Layout.Disks {
		ro := spec.Disks[i].ReadOnly
		files = append(files, placement{src: spec.Disks[i].Path, name: disk.Path, writable: !ro, linkOnly: !ro})
	}
	fcState, fcMem := snapState, snapMem
	if d.jail != nil {
		files = append(files, placement{src: snapState, name: jailVMState, linkOnly: true}, placement{src: snapMem, name: jailMemory, linkOnly: true})
		fcState, fcMem = jailVMState, jailMemory
	}
	v, err := d.start(ctx, spec.RunDir, files, layout, true)
	if err != nil {
		return nil, fmt.Errorf("restore %s in %s: %w", snapshotDir, spec.RunDir, err)
	}
	fail := func(err error) (vmm.VM, error) {
		return nil, v.abort(ctx, fmt.Errorf("restore %s in %s: %w", snapshotDir, spec.RunDir, err))
	}
	if v.version != md.FirecrackerVersion {
		return fail(fmt.Errorf("snapshot of firecracker %s, running %s: %w", md.FirecrackerVersion, v.version, vmm.ErrIncompatible))
	}
	var tap string
	if spec.NIC != nil {
		tap = spec.NIC.TapName
	}
	req, err := loadRequest(v.ver, fcState, fcMem, layout.DirtyTracking, md.Layout.NIC, tap)
	if err != nil {
		return fail(err)
	}
	wctx, done := v.watch(ctx)
	err = v.api.LoadSnapshot(wctx, req)
	done()
	if err != nil {
		// Firecracker exits after a failed load.
		return fail(err)
	}
	v.log.Info("vm restored", "snapshot", snapshotDir, "restore_total", time.Since(start), "version", v.version)
	return v, nil
}

// restoreLayout checks that spec and this host fit the snapshot and
// returns the restored VM's layout.
func restoreLayout(md *Metadata, spec vmm.Spec, cpu string, dirtyTracking bool) (Layout, error) {
	incompatible := func(format string, args ...any) (Layout, error) {
		return Layout{}, fmt.Errorf(format+": %w", append(args, vmm.ErrIncompatible)...)
	}
	if md.Format != metadataFormat || md.Driver != "firecracker" {
		return incompatible("snapshot format %d of driver %q", md.Format, md.Driver)
	}
	if !md.Loadable {
		return Layout{}, fmt.Errorf("a %s snapshot layer must be merged onto its base before it can be loaded: %w", md.Type, errkind.FailedPrecondition)
	}
	if md.HostCPU != "" && cpu != "" && md.HostCPU != cpu {
		return incompatible("snapshot taken on cpu %q, this host has %q", md.HostCPU, cpu)
	}
	l := md.Layout
	if spec.VCPUs != 0 && spec.VCPUs != l.VCPUs {
		return incompatible("snapshot has %d vcpus, spec %d", l.VCPUs, spec.VCPUs)
	}
	if spec.MemoryMiB != 0 && spec.MemoryMiB != l.MemoryMiB {
		return incompatible("snapshot has %d MiB, spec %d", l.MemoryMiB, spec.MemoryMiB)
	}
	if len(spec.Disks) != len(l.Disks) {
		return incompatible("snapshot has %d disks, spec %d", len(l.Disks), len(spec.Disks))
	}
	for i, disk := range l.Disks {
		if disk.ReadOnly != spec.Disks[i].ReadOnly {
			return incompatible("disk %d: read-only %v in the snapshot, %v in spec", i, disk.ReadOnly, spec.Disks[i].ReadOnly)
		}
		if disk.Path == "" || strings.Contains(disk.Path, "/") || disk.Path == "." || disk.Path == ".." {
			return incompatible("disk %d: path %q is not a plain name", i, disk.Path)
		}
	}
	if l.Vsock.Path == "" || strings.Contains(l.Vsock.Path, "/") {
		return incompatible("vsock path %q is not a plain name", l.Vsock.Path)
	}
	switch {
	case (spec.NIC == nil) != (l.NIC == nil):
		return incompatible("network interface in snapshot: %v, in spec: %v", l.NIC != nil, spec.NIC != nil)
	case spec.NIC != nil:
		if spec.NIC.MAC != "" && !strings.EqualFold(spec.NIC.MAC, l.NIC.MAC) {
			return incompatible("the guest keeps mac %s from the snapshot, spec wants %s", l.NIC.MAC, spec.NIC.MAC)
		}
		nic := *l.NIC
		nic.TapName = spec.NIC.TapName
		l.NIC = &nic
	}
	l.Disks = append([]DiskLayout(nil), l.Disks...)
	l.DirtyTracking = dirtyTracking
	return l, nil
}

// loadRequest builds the snapshot load request for Firecracker version v.
func loadRequest(v fcapi.Version, state, mem string, dirtyTracking bool, saved *NICLayout, tap string) (fcapi.SnapshotLoad, error) {
	if !v.AtLeast(1, 1) {
		return fcapi.SnapshotLoad{}, fmt.Errorf("firecracker %s has no memory backends (1.1+): %w", v, vmm.ErrIncompatible)
	}
	req := fcapi.SnapshotLoad{
		SnapshotPath: state,
		MemBackend:   &fcapi.MemBackend{BackendType: fcapi.BackendFile, BackendPath: mem},
		ResumeVM:     true,
	}
	if dirtyTracking {
		// track_dirty_pages arrived in 1.13; enable_diff_snapshots is its
		// older, deprecated name.
		if v.AtLeast(1, 13) {
			req.TrackDirtyPages = true
		} else {
			req.EnableDiffSnapshots = true
		}
	}
	if saved != nil && tap != "" && tap != saved.TapName {
		if !v.AtLeast(1, 12) {
			return fcapi.SnapshotLoad{}, fmt.Errorf("tap %s instead of %s needs network overrides (firecracker 1.12+, have %s): %w", tap, saved.TapName, v, vmm.ErrIncompatible)
		}
		req.NetworkOverrides = []fcapi.NetworkOverride{{IfaceID: saved.ID, HostDevName: tap}}
	}
	return req, nil
}

// hostCPU returns the CPU model name from /proc/cpuinfo, or "".
func hostCPU() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, val, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(val)
		}
	}
	return ""
}

// hostKernel returns the kernel release, or "".
func hostKernel() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
