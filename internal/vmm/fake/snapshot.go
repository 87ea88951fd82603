package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/vmm"
)

// Files in a snapshot directory.
const (
	metaFile      = "fake.json" // meta
	snapGuestDirs = "guest"     // the copy of the guest's writable dirs
)

// meta is what a snapshot says of itself; Restore checks it first.
type meta struct {
	Driver  string `json:"driver"`
	Version string `json:"version"`
	Disks   int    `json:"disks"` // the device layout: how many disks the spec had
}

// Snapshot pauses the guest, copies its writable dirs into dir (created;
// its parent must exist) and resumes it if it ran (vmm.Snapshotter). The
// guest's processes, and whatever lives only in their memory, are not in
// the snapshot: a restored guest starts with none. opts.Diff is ignored
// (every snapshot is full); opts.Ephemeral skips the sync.
func (v *VM) Snapshot(ctx context.Context, dir string, opts vmm.SnapshotOptions) (_ *vmm.Snapshot, err error) {
	if err := v.d.fault(ctx, PointSnapshot); err != nil {
		return nil, fmt.Errorf("snapshot vm %d: %w", v.h.PID, err)
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("snapshot vm %d: %w", v.h.PID, err)
		}
	}()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	v.mu.Lock()
	defer v.mu.Unlock()
	wasPaused := v.paused
	t0 := time.Now()
	if !wasPaused {
		if err := v.pauseLocked(ctx); err != nil {
			return nil, errors.Join(err, v.resumeLocked())
		}
	}
	if opts.Paused != nil {
		opts.Paused()
	}
	err = copyTree(ctx, v.st.GuestDir, filepath.Join(dir, snapGuestDirs))
	if !wasPaused {
		if rerr := v.resumeLocked(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("resume: %w", rerr))
		}
	}
	if err != nil {
		return nil, err
	}
	took := time.Since(t0)
	b, err := json.Marshal(meta{Driver: Name, Version: Version, Disks: v.st.Disks})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, metaFile), b, 0o600); err != nil {
		return nil, err
	}
	if !opts.Ephemeral {
		if err := syncFS(dir); err != nil {
			return nil, err
		}
	}
	return &vmm.Snapshot{Dir: dir, Driver: Name, Version: Version, Took: took}, nil
}

// Restore boots a new guest on a copy of the writable dirs in the
// snapshot at dir (vmm.Restorer); spec places them as for Boot. A
// snapshot of another driver or version, or taken with another number of
// disks, is vmm.ErrIncompatible. With spec.TakeSnapshot the snapshot's
// dirs are moved, not copied, where the file system allows it.
func (d *Driver) Restore(ctx context.Context, dir string, spec vmm.Spec) (vmm.VM, error) {
	if err := d.fault(ctx, PointRestore); err != nil {
		return nil, fmt.Errorf("restore %s: %w", dir, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("restore %s: no %s (not a fake vmm's snapshot): %w", dir, metaFile, vmm.ErrIncompatible)
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("restore %s: %s: %v: %w", dir, metaFile, err, vmm.ErrIncompatible)
	}
	if m.Driver != Name || m.Version != Version {
		return nil, fmt.Errorf("restore %s: snapshot of %s %s, this is %s %s: %w", dir, m.Driver, m.Version, Name, Version, vmm.ErrIncompatible)
	}
	if m.Disks != len(spec.Disks) {
		return nil, fmt.Errorf("restore %s: snapshot has %d disks, spec %d: %w", dir, m.Disks, len(spec.Disks), vmm.ErrIncompatible)
	}
	if err := d.checkSpec(spec); err != nil {
		return nil, err
	}
	gdir, own := guestDir(spec)
	if err := os.RemoveAll(gdir); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(gdir), 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	src := filepath.Join(dir, snapGuestDirs)
	moved := spec.TakeSnapshot && os.Rename(src, gdir) == nil
	if !moved {
		if err := copyTree(ctx, src, gdir); err != nil {
			os.RemoveAll(gdir)
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	vm, err := d.start(ctx, spec, state{GuestDir: gdir, OwnGuestDir: own, Disks: len(spec.Disks)})
	if err != nil {
		os.RemoveAll(gdir)
		return nil, err
	}
	return vm, nil
}

// copyTree copies directory src to dst (which must not exist), keeping
// owners, modes and times, sharing extents where the file system can.
func copyTree(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %s: %w", src, strings.TrimSpace(string(out)), err)
	}
	return nil
}

// syncFS flushes the file system dir is on.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
