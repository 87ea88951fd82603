package firecracker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/reflink"
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

// Metadata describes a snapshot. Snapshot writes it as snapshot.json next
// to the vmstate and memory files and the disk copies, last: a directory
// without it holds no complete snapshot.
type Metadata struct {
	Format             int    `json:"format"`              // 1
	Driver             string `json:"driver"`              // "firecracker"
	FirecrackerVersion string `json:"firecracker_version"` // only this version can load it
	Type               string `json:"type"`                // "Full" or "Diff"
	// Loadable is false for a diff that must first be merged onto its
	// base: every diff but the first one of a booted guest.
	Loadable   bool           `json:"loadable"`
	Created    time.Time      `json:"created"`
	HostCPU    string         `json:"host_cpu,omitempty"`    // /proc/cpuinfo model name
	HostKernel string         `json:"host_kernel,omitempty"` // uname -r
	VMState    string         `json:"vmstate"`               // file names in the directory
	Memory     string         `json:"memory"`
	Disks      []SnapshotDisk `json:"disks"`
	Layout     Layout         `json:"layout"`
}

// SnapshotDisk is one disk of a snapshot, in Spec.Disks order.
type SnapshotDisk struct {
	ReadOnly bool   `json:"read_only"`
	Size     int64  `json:"size"`           // of the image at snapshot time
	File     string `json:"file,omitempty"` // writable disks: the copy in the snapshot
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

// Snapshot writes a snapshot of the VM into dir, which it creates and
// which must not exist (errkind.Conflict): vmstate and memory (written by
// Firecracker), a copy of each writable disk (reflinked where the file
// system can) and snapshot.json ([Metadata]), last. It pauses a running
// VM for the snapshot and the disk copies and resumes it afterwards, even
// on error; a paused VM stays paused. The VM's vsock connections are
// reset (Firecracker resets them on every snapshot). Diffs need dirty
// tracking: Config.DirtyTracking, or Firecracker 1.13+.
//
// With opts.Diff and a VM started with a vmm.Spec.MemoryPath, the
// snapshot is complete and loadable, but Firecracker writes only the
// pages dirtied since the previous snapshot or restore: into a copy
// (reflinked where possible) of the memory file of that snapshot, which
// the VM keeps a link to at MemoryPath (Firecracker 1.6+ merges a diff in
// place into a file of the guest's size). The result is Reflinked when
// that copy and the disks' were reflinks: the memory file then shares the
// extents of every page not dirtied with the previous snapshot. Where no
// such base is left (or diffs cannot be taken) the snapshot is Full.
//
// With opts.Diff and no MemoryPath the memory file holds only the dirtied
// pages (sparse): a layer to merge onto its base, not loadable on its own
// unless it is the first snapshot of a booted guest; without dirty
// tracking that is an errkind.FailedPrecondition error.
//
// Snapshot implements vmm.Snapshotter; Handle changes afterwards.
func (v *VM) Snapshot(ctx context.Context, dir string, opts vmm.SnapshotOptions) (_ *vmm.Snapshot, err error) {
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
	canDiff := v.st.Layout.DirtyTracking || v.ver.AtLeast(1, 13)
	if opts.Diff && v.st.Base == "" && !canDiff {
		return nil, fmt.Errorf("diff without dirty tracking needs firecracker 1.13, have %s: %w", v.version, errkind.FailedPrecondition)
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
	kind, base := v.snapshotKind(opts.Diff, canDiff, taken)
	if v.st.Base != "" {
		defer func() {
			if err != nil {
				// Firecracker may have reset its dirty log: the next
				// snapshot must be a full one.
				v.dropBase()
				v.mu.Lock()
				v.snapshots++
				v.mu.Unlock()
			}
		}()
	}

	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("exists: %w", errkind.Conflict)
		}
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir) // a partial snapshot must not look like one
		}
	}()
	wctx, done := v.watch(ctx)
	defer done()
	info, err := v.api.Instance(wctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if info.State == fcapi.StateRunning {
		if err := v.api.PatchVM(wctx, fcapi.Paused); err != nil {
			return nil, err
		}
		defer func() {
			// The VM runs on whatever happened: a failed snapshot must not
			// leave the sandbox frozen.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if rerr := v.api.PatchVM(cctx, fcapi.Resumed); rerr != nil {
				err = errors.Join(err, fmt.Errorf("resume after snapshot: %w", rerr))
			}
		}()
	}
	md, reflinked, err := v.snapshotPaused(wctx, dir, kind, base, taken, opts.Paused)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	v.mu.Lock()
	v.snapshots++
	v.mu.Unlock()
	if v.st.Base != "" {
		v.setBase(filepath.Join(dir, memoryFile))
	}
	v.log.Info("snapshot taken", "dir", dir, "type", md.Type, "onto", base, "paused_for", took)
	return &vmm.Snapshot{Dir: dir, Driver: "firecracker", Version: v.version, Diff: kind == fcapi.Diff, Took: took, Reflinked: reflinked}, nil
}

// snapshotKind decides between a Full snapshot and a Diff, and for a diff
// with a base, the memory file it is merged onto ("" for none).
func (v *VM) snapshotKind(diff, canDiff bool, taken int) (fcapi.SnapshotType, string) {
	switch {
	case !diff:
		return fcapi.Full, ""
	case v.st.Base == "":
		return fcapi.Diff, "" // a layer
	case !canDiff || !v.ver.AtLeast(1, 6):
		return fcapi.Full, ""
	case !v.st.Restored && taken == 0:
		return fcapi.Diff, "" // every page the guest touched since boot
	}
	if fi, err := os.Stat(v.st.Base); err != nil || !fi.Mode().IsRegular() {
		return fcapi.Full, ""
	}
	return fcapi.Diff, v.st.Base
}

// setBase makes the VM's base link (handleState.Base) point at memory, a
// complete memory file of the guest as it is now. If that fails there is
// no base, and the next snapshot is full.
func (v *VM) setBase(memory string) {
	tmp := v.st.Base + ".new"
	err := removeIfExists(tmp)
	if err == nil {
		err = os.Link(memory, tmp)
	}
	if err == nil {
		err = os.Rename(tmp, v.st.Base)
	}
	if err != nil {
		os.Remove(tmp)
		v.log.Warn("no base for the next diff snapshot", "memory", memory, "err", err)
		v.dropBase()
	}
}

// dropBase removes the VM's base link.
func (v *VM) dropBase() {
	if err := removeIfExists(v.st.Base); err != nil {
		v.log.Warn("remove diff snapshot base", "err", err)
	}
}

// snapshotPaused writes the snapshot of the paused VM: Firecracker's files
// (a diff merged onto a copy of base, if base is set), the disk copies,
// then the metadata. It reports whether memory and disks are reflinks.
func (v *VM) snapshotPaused(ctx context.Context, dir string, kind fcapi.SnapshotType, base string, taken int, paused func()) (_ *Metadata, reflinked bool, err error) {
	dstState, dstMem := filepath.Join(dir, vmstateFile), filepath.Join(dir, memoryFile)
	// Jailed, Firecracker writes inside its root; the files move out after.
	fcState, fcMem, hostMem := dstState, dstMem, dstMem
	if v.st.Jail != nil {
		fcState, fcMem, hostMem = jailVMState, jailMemory, filepath.Join(v.st.Root, jailMemory)
		// A leftover memory file of the guest's size would make a diff
		// merge into it.
		for _, name := range []string{jailVMState, jailMemory} {
			if err := removeIfExists(filepath.Join(v.st.Root, name)); err != nil {
				return nil, false, err
			}
		}
	}
	if base != "" {
		// Firecracker merges the diff into this copy (never into the
		// base itself: clones may map it).
		if reflinked, err = reflink.CopyVolatile(ctx, base, hostMem); err != nil {
			return nil, false, fmt.Errorf("diff base: %w", err)
		}
		if j := v.st.Jail; j != nil {
			if err := os.Lchown(hostMem, j.UID, j.GID); err != nil {
				return nil, false, err
			}
		}
		if err := os.Chmod(hostMem, 0o600); err != nil {
			return nil, false, err
		}
	}
	if err := v.api.CreateSnapshot(ctx, fcapi.SnapshotCreate{SnapshotType: kind, SnapshotPath: fcState, MemFilePath: fcMem}); err != nil {
		return nil, false, err
	}
	if paused != nil {
		paused()
	}
	if j := v.st.Jail; j != nil {
		if err := moveOut(filepath.Join(v.st.Root, jailVMState), dstState, j.UID, j.GID); err != nil {
			return nil, false, err
		}
		if err := moveOut(filepath.Join(v.st.Root, jailMemory), dstMem, j.UID, j.GID); err != nil {
			return nil, false, err
		}
	} else {
		// Firecracker creates them with its umask; guest memory is private.
		if err := errors.Join(os.Chmod(dstState, 0o600), os.Chmod(dstMem, 0o600)); err != nil {
			return nil, false, err
		}
	}
	md := &Metadata{
		Format:             metadataFormat,
		Driver:             "firecracker",
		FirecrackerVersion: v.version,
		Type:               string(kind),
		Loadable:           kind == fcapi.Full || base != "" || (!v.st.Restored && taken == 0),
		Created:            time.Now().UTC(),
		HostCPU:            hostCPU(),
		HostKernel:         hostKernel(),
		VMState:            vmstateFile,
		Memory:             memoryFile,
		Layout:             v.st.Layout,
	}
	// The disks as Firecracker sees them (links to the caller's files):
	// the writable ones are copied while the guest cannot write.
	for i, disk := range v.st.Layout.Disks {
		src := filepath.Join(v.st.Root, disk.Path)
		fi, err := os.Stat(src)
		if err != nil {
			return nil, false, err
		}
		sd := SnapshotDisk{ReadOnly: disk.ReadOnly, Size: fi.Size()}
		if !disk.ReadOnly {
			sd.File = "disk" + strconv.Itoa(i)
			linked, err := reflink.CopyReport(ctx, src, filepath.Join(dir, sd.File))
			if err != nil {
				return nil, false, fmt.Errorf("disk %d: %w", i, err)
			}
			reflinked = reflinked && linked
			if err := os.Chmod(filepath.Join(dir, sd.File), 0o600); err != nil {
				return nil, false, err
			}
		}
		md.Disks = append(md.Disks, sd)
	}
	if err := writeMetadata(dir, md); err != nil {
		return nil, false, err
	}
	return md, reflinked, nil
}

// moveOut moves a file out of a jail, keeping it sparse, and leaves it
// owned by the jail's uid:gid, mode 0600, so that a jailed restore (with
// the same ids) can read it and nobody else can.
func moveOut(src, dst string, uid, gid int) error {
	err := os.Rename(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		if err = copySparse(src, dst, 0o600); err == nil {
			err = os.Remove(src)
		}
	}
	if err != nil {
		return err
	}
	return errors.Join(os.Lchown(dst, uid, gid), os.Chmod(dst, 0o600))
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
// snapshotDir into it (vmm.Restorer). Guest memory is a private
// copy-on-write mapping of the snapshot's memory file (the File backend),
// which must therefore stay unchanged while the VM lives; clones of one
// snapshot share its page cache. spec gives the run dir and the disks:
// read-only ones as they were (same size), writable ones as the paths the
// snapshot's copies are placed at (reflinked where possible; moved with
// spec.TakeSnapshot, the memory file staying where it is). The NIC must
// be present as it was; its tap may differ on 1.12+ and the guest keeps
// the snapshot's MAC. Zero VCPUs and MemoryMiB mean the snapshot's, other
// values must equal them; kernel, initrd and command line are ignored.
// The VM runs when Restore returns. A snapshot of another driver,
// Firecracker version, CPU model or layout is vmm.ErrIncompatible; one
// that is not loadable on its own (a later diff)
// errkind.FailedPrecondition; a missing one errkind.NotFound. Jailed, the
// snapshot files are hard-linked into the jail: they must be on the chroot
// base's file system and readable by the jail's uid or gid (as Snapshot
// leaves them), else errkind.FailedPrecondition.
func (d *Driver) Restore(ctx context.Context, snapshotDir string, spec vmm.Spec) (_ vmm.VM, err error) {
	start := time.Now()
	snapshotDir, err = filepath.Abs(snapshotDir)
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
	defer func() {
		if err != nil {
			err = fmt.Errorf("restore %s in %s: %w", snapshotDir, spec.RunDir, err)
		}
	}()
	layout, err := restoreLayout(md, spec, hostCPU(), d.dirtyTracking)
	if err != nil {
		return nil, err
	}
	snapState, snapMem := filepath.Join(snapshotDir, md.VMState), filepath.Join(snapshotDir, md.Memory)
	for _, p := range []string{snapState, snapMem} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%w: %w", err, errkind.NotFound)
		}
	}
	placed, err := placeDisks(ctx, snapshotDir, md, spec)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			for _, p := range placed {
				os.Remove(p)
			}
		}
	}()
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
	v, err := d.start(ctx, spec.RunDir, files, layout, true, spec)
	if err != nil {
		return nil, err
	}
	if v.version != md.FirecrackerVersion {
		return nil, v.abort(ctx, fmt.Errorf("snapshot of firecracker %s, running %s: %w", md.FirecrackerVersion, v.version, vmm.ErrIncompatible))
	}
	var tap string
	if spec.NIC != nil {
		tap = spec.NIC.TapName
	}
	req, err := loadRequest(v.ver, fcState, fcMem, layout.DirtyTracking, md.Layout.NIC, tap)
	if err != nil {
		return nil, v.abort(ctx, err)
	}
	wctx, done := v.watch(ctx)
	err = v.api.LoadSnapshot(wctx, req)
	done()
	if err != nil {
		// Firecracker exits after a failed load.
		return nil, v.abort(ctx, err)
	}
	if v.st.Base != "" {
		// The guest's memory is the snapshot's file: its first diff
		// merges onto a copy of that.
		v.setBase(snapMem)
	}
	v.log.Info("vm restored", "snapshot", snapshotDir, "restore_total", time.Since(start), "version", v.version)
	return v, nil
}

// placeDisks checks the read-only disks against the snapshot and copies
// the snapshot's writable disks to the paths spec gives. It returns the
// paths it wrote.
func placeDisks(ctx context.Context, dir string, md *Metadata, spec vmm.Spec) (placed []string, err error) {
	if len(md.Disks) != len(spec.Disks) {
		return nil, fmt.Errorf("snapshot has %d disks, spec %d: %w", len(md.Disks), len(spec.Disks), vmm.ErrIncompatible)
	}
	defer func() {
		if err != nil {
			for _, p := range placed {
				os.Remove(p)
			}
		}
	}()
	for i, disk := range spec.Disks {
		sd := md.Disks[i]
		if disk.ReadOnly != sd.ReadOnly {
			return placed, fmt.Errorf("disk %d read-only %v, snapshot %v: %w", i, disk.ReadOnly, sd.ReadOnly, vmm.ErrIncompatible)
		}
		if disk.ReadOnly {
			fi, err := os.Stat(disk.Path)
			if err != nil {
				return placed, fmt.Errorf("disk %d: %w", i, err)
			}
			if fi.Size() != sd.Size {
				return placed, fmt.Errorf("disk %d is not the image the snapshot ran on (%d bytes, was %d): %w", i, fi.Size(), sd.Size, vmm.ErrIncompatible)
			}
			continue
		}
		if sd.File == "" || sd.File != filepath.Base(sd.File) || sd.File == ".." {
			return placed, fmt.Errorf("disk %d: snapshot file %q: %w", i, sd.File, vmm.ErrIncompatible)
		}
		if err := placeDisk(ctx, filepath.Join(dir, sd.File), disk.Path, spec.TakeSnapshot); err != nil {
			return placed, fmt.Errorf("disk %d: %w", i, err)
		}
		placed = append(placed, disk.Path)
		if err := os.Chmod(disk.Path, 0o600); err != nil {
			return placed, err
		}
	}
	return placed, nil
}

// placeDisk puts the snapshot's disk copy src at dst: moved there
// (reflink.Move) if take is set, else copied (reflinked where possible).
func placeDisk(ctx context.Context, src, dst string, take bool) error {
	if take {
		return reflink.Move(ctx, src, dst)
	}
	return reflink.Copy(ctx, src, dst)
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
