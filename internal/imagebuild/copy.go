package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// CopyImage copies the disk image src to dst (replacing it) without filling
// in its holes: a reflink where the file system can share extents (XFS,
// btrfs), else only the data regions, so a sparse image stays sparse. A
// failed copy removes dst.
func CopyImage(ctx context.Context, src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy image: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("copy image: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("copy image: %s is not a regular file: %w", src, errkind.InvalidArgument)
	}
	if dfi, err := os.Stat(dst); err == nil && os.SameFile(fi, dfi) {
		return fmt.Errorf("copy image: %s and %s are the same file: %w", src, dst, errkind.InvalidArgument)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("copy image: %w", err)
	}
	defer func() {
		err = errors.Join(err, out.Close())
		if err != nil {
			os.Remove(dst)
			err = fmt.Errorf("copy image %s to %s: %w", src, dst, err)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < fi.Size(); {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		// Copy big regions in steps so a cancel takes effect soon.
		end := min(hole, data+64<<20)
		if _, err := io.CopyBuffer(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, end-data), buf); err != nil {
			return err
		}
		off = end
	}
	return out.Sync()
}
