package storage

import (
	"fmt"
	"math"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fitrim is the FITRIM ioctl, _IOWR('X', 121, struct fstrim_range), which
// golang.org/x/sys does not define.
const fitrim = 0xc0185879

// fstrimRange is the kernel's struct fstrim_range.
type fstrimRange struct {
	start, len, minLen uint64
}

// Trim discards the free blocks of the file system holding dir (what
// fstrim(8) does) and returns how many bytes the file system trimmed.
// On a loop-mounted image (ModeReflinkLoop) the loop device punches those
// ranges out of the image file: the blocks of files deleted inside go
// back to the host's file system, which otherwise keeps the image at its
// high-water mark. It syncs the file system first, so that what was just
// deleted is trimmed. A file system that cannot trim (tmpfs) returns an error
// wrapping unix.EOPNOTSUPP or unix.ENOTTY.
func Trim(dir string) (int64, error) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, fmt.Errorf("trim: %w", err)
	}
	defer f.Close()
	// Freed extents reach the free space only once the file system has
	// committed the deletes. XFS inactivates deleted inodes in the
	// background: its statfs waits for that, its sync commits the log.
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("trim %s: statfs: %w", dir, err)
	}
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return 0, fmt.Errorf("trim %s: sync: %w", dir, err)
	}
	r := fstrimRange{len: math.MaxUint64}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fitrim, uintptr(unsafe.Pointer(&r))); errno != 0 {
		return 0, fmt.Errorf("trim %s: %w", dir, errno)
	}
	return int64(r.len), nil
}

// Allocated returns the bytes of disk the file at path takes (its
// allocated blocks, not its apparent size: a sparse file costs what was
// written to it).
func Allocated(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}
