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
	metaFile = "fake.json" // meta
	// guestArchive holds the guest's writable dirs, owners, modes and
	// overlay whiteouts kept: one regular file, so that a worker that
	// keeps a snapshot's files in its chunk store keeps all of it.
	guestArchive = "guest.tar"
)

// meta is what a snapshot says of itself; Restore checks it first.
type meta struct {
	Driver  string `json:"driver"`
	Version string `json:"version"`
	Disks   int    `json:"disks"` // the device layout: how many disks the spec had
}

// Snapshot pauses the guest, archives its writable dirs into dir
// (created; its parent must exist) and resumes it if it ran (vmm.Snapshotter). The
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
	err = archive(ctx, v.st.GuestDir, filepath.Join(dir, guestArchive))
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
// disks, is vmm.ErrIncompatible. spec.TakeSnapshot changes nothing: the
// archive is unpacked either way.
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
	if err := os.Mkdir(gdir, 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := unarchive(ctx, filepath.Join(dir, guestArchive), gdir); err != nil {
		os.RemoveAll(gdir)
		return nil, fmt.Errorf("restore: %w", err)
	}
	vm, err := d.start(ctx, spec, state{GuestDir: gdir, OwnGuestDir: own, Disks: len(spec.Disks)})
	if err != nil {
		os.RemoveAll(gdir)
		return nil, err
	}
	return vm, nil
}

// archive writes the tree at src into the tar file dst, with owners,
// modes, device nodes (overlay whiteouts) and extended attributes (overlay
// opaque directories).
func archive(ctx context.Context, src, dst string) error {
	return run(ctx, "tar", "--create", "--file", dst, "--directory", src, "--xattrs", "--xattrs-include=*", "--numeric-owner", "--sparse", ".")
}

// unarchive unpacks the tar file src into the directory dst as archive
// wrote it.
func unarchive(ctx context.Context, src, dst string) error {
	return run(ctx, "tar", "--extract", "--file", src, "--directory", dst, "--xattrs", "--xattrs-include=*", "--numeric-owner", "--same-owner", "--same-permissions")
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %s: %w", name, strings.TrimSpace(string(out)), err)
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
