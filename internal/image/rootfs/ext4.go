package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

const (
	mib = 1 << 20

	// blockSize is fixed: mke2fs would pick 1 KiB blocks for small images.
	blockSize = 4096

	// lazyInit keeps images sparse and mkfs fast: zeroing inode tables and
	// the journal of a fresh sparse file would only write zeros.
	lazyInit = "lazy_itable_init=1,lazy_journal_init=1"

	// WritableLabel is the ext4 label of a writable layer made by
	// [NewWritableLayer].
	WritableLabel = "space-rw"
)

// Ext4Options tunes [MakeExt4].
type Ext4Options struct {
	// Size is the image size in bytes. Zero means computed from the content:
	// its size times 1.25 plus 64 MiB, rounded up to a MiB. The image is
	// sparse, so unused space costs no disk.
	Size int64
	// Label is the file system label, at most 16 bytes. Empty means none.
	Label string
}

// MakeExt4 writes an ext4 image of srcDir to img (replacing it), without
// mounting: mkfs.ext4 -d copies the tree, keeping ownership, modes, device
// nodes and extended attributes; the root directory is owned by 0:0.
//
// Errors wrap [errkind.FailedPrecondition] when mkfs.ext4 is missing (the
// message names the apt package), [errkind.ResourceExhausted] when the file
// system holding img is too full, and [errkind.InvalidArgument] for bad
// options. A failed run removes img.
func MakeExt4(ctx context.Context, srcDir, img string, opts Ext4Options) error {
	if len(opts.Label) > 16 {
		return fmt.Errorf("ext4 label %q longer than 16 bytes: %w", opts.Label, errkind.InvalidArgument)
	}
	if opts.Size < 0 {
		return fmt.Errorf("ext4 image size %d: %w", opts.Size, errkind.InvalidArgument)
	}
	fi, err := os.Stat(srcDir)
	if err != nil {
		return fmt.Errorf("make ext4 image: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("make ext4 image: %s is not a directory: %w", srcDir, errkind.InvalidArgument)
	}
	use, err := measure(srcDir)
	if err != nil {
		return fmt.Errorf("make ext4 image: measure %s: %w", srcDir, err)
	}
	size := opts.Size
	if size == 0 {
		size = roundUp(use.bytes+use.bytes/4+64*mib, mib)
	}
	// mke2fs's default of one inode per 16 KiB runs out on trees of many
	// small files; leave a quarter spare for the guest.
	inodes := max(size/16384, use.inodes+use.inodes/4+4096)
	args := []string{"-q", "-F", "-t", "ext4", "-b", strconv.Itoa(blockSize), "-m", "0",
		"-N", strconv.FormatInt(inodes, 10), "-d", srcDir,
		"-E", "root_owner=0:0," + lazyInit}
	if opts.Label != "" {
		args = append(args, "-L", opts.Label)
	}
	// The data written is about the content; metadata adds a little.
	if err := mkfs(ctx, img, size, use.bytes+16*mib, args); err != nil {
		return fmt.Errorf("make ext4 image of %s: %w", srcDir, err)
	}
	return nil
}

// NewWritableLayer creates img as an empty, sparse ext4 file system of size
// bytes, labelled [WritableLabel], for a sandbox's writable overlay layer. It
// keeps the journal, since a VM may be killed with the layer mounted. Errors
// are as for [MakeExt4].
func NewWritableLayer(ctx context.Context, img string, size int64) error {
	if size < 16*mib {
		return fmt.Errorf("writable layer size %d below 16 MiB: %w", size, errkind.InvalidArgument)
	}
	args := []string{"-q", "-F", "-t", "ext4", "-b", strconv.Itoa(blockSize), "-m", "0",
		"-L", WritableLabel, "-E", "root_owner=0:0," + lazyInit}
	// An empty 10 GiB layer takes about 4.3 MiB of disk; leave room.
	need := 16*mib + size/1024
	if err := mkfs(ctx, img, size, need, args); err != nil {
		return fmt.Errorf("make writable layer: %w", err)
	}
	return nil
}

// mkfs runs mkfs.ext4 with args on img, a new sparse file of size bytes,
// after checking that the file system holding it has need bytes free.
func mkfs(ctx context.Context, img string, size, need int64, args []string) (err error) {
	tool, err := lookTool("mkfs.ext4", "e2fsprogs", sbinDirs...)
	if err != nil {
		return err
	}
	dir := filepath.Dir(img)
	if err := checkFree(dir, need); err != nil {
		return err
	}
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(img)
		}
	}()
	if err := f.Truncate(size); err != nil {
		f.Close()
		return noSpace(dir, err)
	}
	if err := f.Close(); err != nil {
		return noSpace(dir, err)
	}
	out, err := run(ctx, tool, append(args, img)...)
	if err != nil {
		// mke2fs reports the host's ENOSPC only as text; "Could not
		// allocate block" would be the image itself being full.
		if strings.Contains(out, "No space left on device") {
			return fmt.Errorf("no space left on %s (%w): %w", dir, err, errkind.ResourceExhausted)
		}
		if strings.Contains(out, "Could not allocate block") {
			return fmt.Errorf("image size %d MiB too small for the content (%w): %w", size/mib, err, errkind.ResourceExhausted)
		}
		return err
	}
	return nil
}

// checkFree returns an error wrapping [errkind.ResourceExhausted] when the
// file system holding dir has less than need bytes available.
func checkFree(dir string, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return &fs.PathError{Op: "statfs", Path: dir, Err: err}
	}
	if free := int64(st.Bavail) * st.Bsize; free < need {
		return fmt.Errorf("no space left on %s: need about %d MiB, %d MiB free: %w",
			dir, need/mib+1, free/mib, errkind.ResourceExhausted)
	}
	return nil
}

// noSpace turns ENOSPC and EFBIG into errors wrapping
// [errkind.ResourceExhausted].
func noSpace(dir string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) {
		return fmt.Errorf("no space left on %s (%w): %w", dir, err, errkind.ResourceExhausted)
	}
	return err
}

// usage is what a directory tree needs in an ext4 image.
type usage struct {
	bytes  int64 // data and directory blocks, hard links counted once
	inodes int64
}

// measure walks dir without following symlinks.
func measure(dir string) (usage, error) {
	var u usage
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat data", path)
		}
		if !fi.IsDir() && st.Nlink > 1 {
			id := [2]uint64{st.Dev, st.Ino}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		u.inodes++
		switch {
		case fi.Mode().IsRegular():
			// Apparent size, not blocks: it never underestimates, and the
			// image is sparse anyway.
			u.bytes += roundUp(max(fi.Size(), st.Blocks*512), blockSize)
		case fi.IsDir():
			u.bytes += roundUp(max(fi.Size(), blockSize), blockSize)
		case fi.Mode()&fs.ModeSymlink != 0 && fi.Size() >= 60: // longer targets need a block
			u.bytes += blockSize
		}
		return nil
	})
	return u, err
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }
