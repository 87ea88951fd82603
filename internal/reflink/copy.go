// Package reflink copies files for snapshots and per-VM state: by sharing
// extents (a reflink) where the file system can, else by copying only the
// data regions so sparse files stay sparse.
package reflink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// Copy copies src to dst (replacing it) without filling in its holes: a
// reflink where the file system can share extents (XFS, btrfs), else only
// the data regions, so a sparse file stays sparse. dst is durable when
// Copy returns. A failed copy removes dst.
func Copy(ctx context.Context, src, dst string) (err error) {
	_, err = CopyReport(ctx, src, dst)
	return err
}

// CopyReport is Copy that also reports whether the copy was a reflink (a
// metadata operation whose cost does not grow with the file).
func CopyReport(ctx context.Context, src, dst string) (reflinked bool, err error) {
	return copyFile(ctx, src, dst, true)
}

// CopyVolatile is CopyReport without making dst durable: for files that
// only matter while the host runs (a restored VM's own memory and disk, a
// snapshot that lives as long as a fork), where a sync would cost a log
// force for nothing.
func CopyVolatile(ctx context.Context, src, dst string) (reflinked bool, err error) {
	return copyFile(ctx, src, dst, false)
}

// Move moves src to dst (replacing it): a rename where both are on one
// file system, else a CopyVolatile after which src is removed. For a file
// whose source is given up anyway (a spent snapshot's), where even a
// reflink copy costs in proportion to the file's extents.
func Move(ctx context.Context, src, dst string) error {
	err := os.Rename(src, dst)
	if !errors.Is(err, unix.EXDEV) {
		if err != nil {
			return fmt.Errorf("move: %w", err)
		}
		return nil
	}
	if _, err := CopyVolatile(ctx, src, dst); err != nil {
		return err
	}
	return os.Remove(src)
}

func copyFile(ctx context.Context, src, dst string, durable bool) (reflinked bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("copy: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return false, fmt.Errorf("copy: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("copy: %s is not a regular file: %w", src, errkind.InvalidArgument)
	}
	if dfi, err := os.Stat(dst); err == nil && os.SameFile(fi, dfi) {
		return false, fmt.Errorf("copy: %s and %s are the same file: %w", src, dst, errkind.InvalidArgument)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return false, fmt.Errorf("copy: %w", err)
	}
	defer func() {
		err = errors.Join(err, out.Close())
		if err != nil {
			os.Remove(dst)
			err = fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		if durable {
			return true, out.Sync() // the new extent map, not just data
		}
		return true, nil
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return false, err
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < fi.Size(); {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return false, fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return false, fmt.Errorf("seek hole: %w", err)
		}
		// Copy big regions in steps so a cancel takes effect soon.
		end := min(hole, data+64<<20)
		if _, err := io.CopyBuffer(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, end-data), buf); err != nil {
			return false, err
		}
		off = end
	}
	if durable {
		return false, out.Sync()
	}
	return false, nil
}
