package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/reflink"
	"space/internal/vmm"
)

var (
	_ vmm.Snapshotter = (*VM)(nil)
	_ vmm.Restorer    = (*Driver)(nil)
)

// Files of a snapshot directory.
const (
	snapMeta   = "snapshot.json"
	snapState  = "state"  // the migration stream: device state, no RAM
	snapMemory = "memory" // guest RAM
)

// snapFormat is the version of the snapshot directory layout.
const snapFormat = 1

// snapshotMeta is snapshot.json: what Restore must match before it loads
// the device state.
type snapshotMeta struct {
	Format    int        `json:"format"`
	Driver    string     `json:"driver"`
	Version   string     `json:"version"`
	Machine   string     `json:"machine"`
	Accel     string     `json:"accel"`
	VCPUs     int        `json:"vcpus"`
	MemoryMiB int        `json:"memory_mib"`
	Kernel    fileID     `json:"kernel"`
	Initrd    *fileID    `json:"initrd,omitempty"`
	Cmdline   string     `json:"cmdline"`
	Disks     []snapDisk `json:"disks"`
	NIC       bool       `json:"nic"`
	Vsock     bool       `json:"vsock"`
	Created   time.Time  `json:"created"`
	Reflinked bool       `json:"reflinked"`
}

type fileID struct {
	Size int64 `json:"size"`
}

type snapDisk struct {
	ReadOnly bool   `json:"read_only"`
	Size     int64  `json:"size"`
	File     string `json:"file,omitempty"` // copy in the snapshot, for writable disks
}

// Snapshot pauses the VM, saves its device state with x-ignore-shared (RAM
// lives in the shared memory file and is not streamed), copies the memory
// file and the writable disks (reflinks where the file system allows), and
// resumes the VM if it ran (vmm.Snapshotter). dir is created and must not
// hold a snapshot yet. QEMU has no diff snapshots: opts.Diff is ignored and
// the result says so.
func (v *VM) Snapshot(ctx context.Context, dir string, opts vmm.SnapshotOptions) (_ *vmm.Snapshot, err error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("snapshot to %s: exists: %w", dir, errkind.Conflict)
		}
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir) // a partial snapshot must not look like one
			err = fmt.Errorf("snapshot vm %d: %w", v.Pid(), err)
		}
	}()
	var status struct {
		Running bool   `json:"running"`
		Status  string `json:"status"`
	}
	if err := v.qmp.Execute(ctx, "query-status", nil, &status); err != nil {
		return nil, err
	}
	flushStart := time.Now()
	if status.Running {
		// Write back and commit what the guest dirtied while it still
		// runs, so the reflink below, with the guest paused, has little
		// left to write or remap. (sync_file_range alone leaves the
		// copy-on-write remapping to the reflink: measured 0.7 s paused
		// for a 2 GiB guest, against 0.27 s after an fdatasync.) A no-op
		// on tmpfs.
		if err := syncFile(v.spec.memoryPath()); err != nil {
			return nil, err
		}
	}
	flushed := time.Since(flushStart)
	start := time.Now()
	paused := false
	resume := func() error {
		if !paused {
			return nil
		}
		paused = false
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := v.qmp.Execute(cctx, "cont", nil, nil); err != nil {
			return fmt.Errorf("resume after snapshot: %w", err)
		}
		return nil
	}
	if status.Running {
		if err := v.qmp.Execute(ctx, "stop", nil, nil); err != nil {
			return nil, err
		}
		paused = true
		// The VM runs on whatever happened; a failed snapshot must not
		// leave the sandbox frozen.
		defer func() { err = errors.Join(err, resume()) }()
	}
	if err := v.saveState(ctx, filepath.Join(dir, snapState)); err != nil {
		return nil, err
	}
	if opts.Paused != nil {
		opts.Paused()
	}
	meta, err := v.meta()
	if err != nil {
		return nil, err
	}
	// Copied unsynced while the guest is paused; synced (unless the
	// snapshot is ephemeral) once it runs again: the copies are already
	// the instant's, only their durability is left.
	copies := []string{filepath.Join(dir, snapMemory)}
	meta.Reflinked, err = reflink.CopyVolatile(ctx, v.spec.memoryPath(), copies[0])
	if err != nil {
		return nil, err
	}
	for i, d := range v.spec.Disks {
		if d.ReadOnly {
			continue
		}
		name := "disk" + strconv.Itoa(i) + "." + d.Format
		linked, err := reflink.CopyVolatile(ctx, d.Path, filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		copies = append(copies, filepath.Join(dir, name))
		meta.Reflinked = meta.Reflinked && linked
		meta.Disks[i].File = name
	}
	took := time.Since(start)
	if err := resume(); err != nil {
		return nil, err
	}
	if !opts.Ephemeral {
		for _, p := range copies {
			if err := syncFile(p); err != nil {
				return nil, err
			}
		}
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return nil, err
	}
	// The metadata goes last: a directory without it is not a snapshot.
	if err := writeSynced(filepath.Join(dir, snapMeta), b); err != nil {
		return nil, err
	}
	v.log.Info("snapshot taken", "dir", dir, "written_back_for", flushed, "paused_for", took, "reflinked", meta.Reflinked)
	return &vmm.Snapshot{Dir: dir, Driver: "qemu", Version: v.version, Took: took, Reflinked: meta.Reflinked}, nil
}

// saveState streams the device state into path through a descriptor
// (QEMU's seccomp sandbox forbids the exec: transport).
func (v *VM) saveState(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := setIgnoreShared(ctx, v); err != nil {
		return err
	}
	if err := v.qmp.SendFile(ctx, "snapshot", f); err != nil {
		return err
	}
	if err := v.qmp.Execute(ctx, "migrate", map[string]string{"uri": "fd:snapshot"}, nil); err != nil {
		return err
	}
	if err := v.waitMigration(ctx); err != nil {
		return err
	}
	return f.Sync()
}

func setIgnoreShared(ctx context.Context, v *VM) error {
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}
	return v.qmp.Execute(ctx, "migrate-set-capabilities", caps, nil)
}

// waitMigration polls query-migrate until the migration completed or failed.
func (v *VM) waitMigration(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := v.qmp.Execute(ctx, "query-migrate", nil, &st); err != nil {
			// A lost monitor is usually QEMU dying: say why it did.
			select {
			case <-v.done:
				return fmt.Errorf("migration: %w", v.exitErr)
			case <-time.After(time.Second):
			}
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("migration: %w", context.Cause(ctx))
		case <-v.done:
			return fmt.Errorf("migration: qemu exited: %v", v.exitErr)
		}
	}
}

func (v *VM) meta() (*snapshotMeta, error) {
	m := &snapshotMeta{
		Format: snapFormat, Driver: "qemu", Version: v.version, Machine: "q35", Accel: v.spec.Accel,
		VCPUs: v.spec.VCPUs, MemoryMiB: v.spec.MemoryMiB, Cmdline: v.spec.Cmdline, Created: time.Now().UTC(),
		NIC: v.spec.NIC != nil, Vsock: v.spec.Vsock != nil,
	}
	fi, err := os.Stat(v.spec.Kernel)
	if err != nil {
		return nil, err
	}
	m.Kernel = fileID{Size: fi.Size()}
	if v.spec.Initrd != "" {
		fi, err := os.Stat(v.spec.Initrd)
		if err != nil {
			return nil, err
		}
		m.Initrd = &fileID{Size: fi.Size()}
	}
	for _, d := range v.spec.Disks {
		fi, err := os.Stat(d.Path)
		if err != nil {
			return nil, err
		}
		m.Disks = append(m.Disks, snapDisk{ReadOnly: d.ReadOnly, Size: fi.Size()})
	}
	return m, nil
}

// syncFile makes path's data and extent map durable.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Sync(), f.Close())
}

// Restore starts a VM from the snapshot in dir (vmm.Restorer): the memory
// file is copied (reflinked where possible) into the new run directory and
// mapped shared, so the clone owns its memory; the writable disks are
// copied to the paths spec gives (with spec.TakeSnapshot both are moved
// there, which spends the snapshot); QEMU starts with -incoming defer and
// loads the device state. The VM runs when Restore returns; the guest
// agent sees a new host connection and needs its post-restore call.
func (d *Driver) Restore(ctx context.Context, dir string, s vmm.Spec) (_ vmm.VM, err error) {
	b, err := os.ReadFile(filepath.Join(dir, snapMeta))
	if err != nil {
		return nil, fmt.Errorf("restore %s: not a snapshot: %w", dir, errors.Join(err, errkind.NotFound))
	}
	var m snapshotMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("restore %s: metadata: %v: %w", dir, err, vmm.ErrIncompatible)
	}
	if err := compatible(&m, s); err != nil {
		return nil, fmt.Errorf("restore %s: %w", dir, err)
	}
	spec := Spec{
		Dir: s.RunDir, Kernel: s.Kernel, Initrd: s.Initrd, Cmdline: m.Cmdline, VCPUs: m.VCPUs,
		MemoryMiB: m.MemoryMiB, Accel: m.Accel, Paused: true, Incoming: true,
		MemoryFrom: filepath.Join(dir, snapMemory), MoveMemory: s.TakeSnapshot, MemoryPath: s.MemoryPath, Placer: s.Placer,
	}
	var placed []string
	defer func() {
		if err != nil {
			for _, p := range placed {
				os.Remove(p)
			}
		}
	}()
	for i, disk := range s.Disks {
		spec.Disks = append(spec.Disks, Disk{Path: disk.Path, Format: "raw", ReadOnly: disk.ReadOnly})
		if disk.ReadOnly {
			continue
		}
		if err := place(ctx, filepath.Join(dir, m.Disks[i].File), disk.Path, s.TakeSnapshot); err != nil {
			return nil, fmt.Errorf("restore %s: disk %d: %w", dir, i, err)
		}
		placed = append(placed, disk.Path)
	}
	nic, err := openNIC(s.NIC)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", dir, err)
	}
	if nic != nil {
		defer nic.closeTap() // QEMU has its own copy
		spec.NIC = nic
	}
	if m.Vsock {
		// The clone gets a CID of its own; the guest learns it from the
		// transport reset vhost-vsock sends after the load.
		vs, err := OpenVsock()
		if err != nil {
			return nil, fmt.Errorf("restore %s: %w", dir, err)
		}
		defer vs.FD.Close()
		spec.Vsock = vs
	}
	start := time.Now()
	v, err := d.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			err = errors.Join(err, v.Stop(cctx))
		}
	}()
	if v.version != m.Version {
		return nil, fmt.Errorf("restore %s: snapshot of qemu %s, this is %s: %w", dir, m.Version, v.version, vmm.ErrIncompatible)
	}
	if err := v.loadState(ctx, filepath.Join(dir, snapState)); err != nil {
		return nil, fmt.Errorf("restore %s: %w", dir, err)
	}
	if err := v.qmp.Execute(ctx, "cont", nil, nil); err != nil {
		return nil, fmt.Errorf("restore %s: %w", dir, err)
	}
	v.log.Info("vm restored", "from", dir, "took", time.Since(start))
	return v, nil
}

func (v *VM) loadState(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := setIgnoreShared(ctx, v); err != nil {
		return err
	}
	if err := v.qmp.SendFile(ctx, "snapshot", f); err != nil {
		return err
	}
	if err := v.qmp.Execute(ctx, "migrate-incoming", map[string]string{"uri": "fd:snapshot"}, nil); err != nil {
		return err
	}
	return v.waitMigration(ctx)
}

// compatible checks that a snapshot can load into this QEMU with this spec.
func compatible(m *snapshotMeta, s vmm.Spec) error {
	switch {
	case m.Format != snapFormat:
		return fmt.Errorf("snapshot format %d, this driver reads %d: %w", m.Format, snapFormat, vmm.ErrIncompatible)
	case m.Driver != "qemu":
		return fmt.Errorf("snapshot of driver %q: %w", m.Driver, vmm.ErrIncompatible)
	case len(s.Disks) != len(m.Disks):
		return fmt.Errorf("snapshot has %d disks, spec %d: %w", len(m.Disks), len(s.Disks), vmm.ErrIncompatible)
	case (s.NIC != nil) != m.NIC:
		return fmt.Errorf("snapshot has a nic: %v, spec: %v: %w", m.NIC, s.NIC != nil, vmm.ErrIncompatible)
	}
	fi, err := os.Stat(s.Kernel)
	if err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	if fi.Size() != m.Kernel.Size {
		return fmt.Errorf("snapshot was taken with another kernel: %w", vmm.ErrIncompatible)
	}
	for i, d := range s.Disks {
		if d.ReadOnly != m.Disks[i].ReadOnly {
			return fmt.Errorf("disk %d read-only %v, snapshot %v: %w", i, d.ReadOnly, m.Disks[i].ReadOnly, vmm.ErrIncompatible)
		}
		if d.ReadOnly {
			fi, err := os.Stat(d.Path)
			if err != nil {
				return fmt.Errorf("disk %d: %w", i, err)
			}
			if fi.Size() != m.Disks[i].Size {
				return fmt.Errorf("disk %d is not the image the snapshot ran on: %w", i, vmm.ErrIncompatible)
			}
		}
	}
	return nil
}
