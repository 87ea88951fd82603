// Package storage prepares a worker's local storage for VM memory files,
// writable layers and snapshots: a directory where copying a file is a
// reflink (shared extents, a metadata operation), so snapshots and clones
// cost the same whatever the guest's RAM.
//
// Where the data directory's own file system cannot reflink (ext4, tmpfs),
// Prepare can create an XFS image (reflink=1) inside it and loop-mount it
// (root only; opt out with Config.NoLoop). Otherwise copies fall back to
// sparse full copies, and the Store says so.
//
// The loop device does direct I/O where the image's file system allows it:
// through a buffered loop device everything written to the image would sit
// cached twice (XFS's page cache and the image file's), and a sync of one
// file would write out whatever the image file held dirty, which for
// guest memory follows how much the guests wrote lately rather than what
// that one file needs.
//
// The image is mounted with online discard: when a file in it is deleted
// (a sandbox's disk, a snapshot), XFS discards its blocks once the delete
// is committed, and the loop device punches them out of the image file,
// so that the image costs the host what is stored in it now, not the most
// it ever held. An image mounted without it (by an older worker) is
// trimmed once when Prepare finds it (see [Trim]).
package storage

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// Mode is how copies are made in a Store. Values are wire format.
type Mode string

// Modes.
const (
	ModeReflink     Mode = "reflink"      // the data dir's own file system reflinks
	ModeReflinkLoop Mode = "reflink-loop" // a loop-mounted XFS image in the data dir
	ModeCopy        Mode = "copy"         // no reflinks: sparse full copies
)

// Config configures Prepare.
type Config struct {
	// DataDir holds the XFS image (reflink.xfs). Required.
	DataDir string
	// Dir is the directory made reflink-capable: the image's mount point
	// when one is needed. "" = DataDir/reflink. An existing directory
	// that holds files and is not a mount point is never mounted over
	// (that would hide them): the storage then copies.
	Dir string
	// NoLoop forbids creating and mounting an XFS image.
	NoLoop bool
	// LoopSize is the XFS image's size (sparse: it costs what is stored);
	// 0 = 64 GiB.
	LoopSize int64
	// Log receives what Prepare chose. nil = discard.
	Log *slog.Logger
}

// Store is prepared storage: Dir is where memory files, disks and snapshots
// go, in every mode.
type Store struct {
	Dir  string
	Mode Mode
	// DirectIO says the loop device of ModeReflinkLoop does direct I/O
	// on its image (false: buffered, or no loop device).
	DirectIO bool
	// Backing is the directory holding the image of ModeReflinkLoop, on
	// the host's file system, or "" in other modes. The image is sparse:
	// it grows only as far as that file system has room.
	Backing string
}

// Reflinked reports whether copies in the store share extents.
func (s *Store) Reflinked() bool { return s.Mode != ModeCopy }

const (
	loopImage = "reflink.xfs"
	loopMount = "reflink"
)

// Prepare returns the storage at cfg.Dir, mounting the XFS image there if
// it is needed and allowed (and not mounted already: a restarted worker
// finds its mount in place). It never unmounts anything; VMs outlive the
// worker.
func Prepare(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("storage: data dir not set: %w", errkind.InvalidArgument)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	mnt := cmp.Or(cfg.Dir, filepath.Join(cfg.DataDir, loopMount))
	if source, mounted, err := mountSource(mnt); err != nil {
		return nil, err
	} else if mounted {
		st := &Store{Dir: mnt, Mode: ModeReflinkLoop, DirectIO: directIO(log, source), Backing: cfg.DataDir}
		if discard, err := mountedWithDiscard(mnt); err == nil && !discard {
			// Mounted by a worker from before online discard: give back
			// what it kept, once; a new mount discards as it goes.
			n, err := Trim(mnt)
			log.Warn("storage image mounted without online discard: deleted files keep their blocks in the image until it is mounted again",
				"dir", mnt, "trimmed_mib", n>>20, "trim_err", err)
		}
		return st, nil
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if ok, err := Reflinks(mnt); err != nil {
		return nil, err
	} else if ok {
		log.Info("storage reflinks natively", "dir", mnt)
		return &Store{Dir: mnt, Mode: ModeReflink}, nil
	}
	why := ""
	switch {
	case cfg.NoLoop:
		why = "loop mount disabled"
	case os.Geteuid() != 0:
		why = "loop mount needs root"
	case !emptyDir(mnt):
		why = "the directory holds files from before reflink storage; not mounting over them"
	default:
		if err := mountLoop(ctx, cfg, mnt); err != nil {
			why = err.Error()
		} else {
			st := &Store{Dir: mnt, Mode: ModeReflinkLoop, Backing: cfg.DataDir}
			if source, _, err := mountSource(mnt); err == nil {
				st.DirectIO = directIO(log, source)
			}
			log.Info("storage on a loop-mounted XFS image", "dir", mnt, "direct_io", st.DirectIO)
			return st, nil
		}
	}
	log.Warn("storage cannot reflink: snapshots and clones make full copies", "dir", mnt, "why", why)
	return &Store{Dir: mnt, Mode: ModeCopy}, nil
}

// emptyDir reports whether dir has no entries (a probe file Reflinks left
// would not count: it removes its own).
func emptyDir(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) == 0
}

// Reflinks reports whether files in dir can be reflinked, by trying it.
func Reflinks(dir string) (bool, error) {
	a, err := os.CreateTemp(dir, ".reflink-probe-")
	if err != nil {
		return false, fmt.Errorf("storage probe: %w", err)
	}
	defer os.Remove(a.Name())
	defer a.Close()
	if _, err := a.Write([]byte("probe")); err != nil {
		return false, fmt.Errorf("storage probe: %w", err)
	}
	b, err := os.CreateTemp(dir, ".reflink-probe-")
	if err != nil {
		return false, fmt.Errorf("storage probe: %w", err)
	}
	defer os.Remove(b.Name())
	defer b.Close()
	return unix.IoctlFileClone(int(b.Fd()), int(a.Fd())) == nil, nil
}

func mountLoop(ctx context.Context, cfg Config, mnt string) error {
	for _, tool := range []string{"mkfs.xfs", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (apt package %s)", tool, map[string]string{"mkfs.xfs": "xfsprogs", "mount": "mount"}[tool])
		}
	}
	size := cfg.LoopSize
	if size == 0 {
		size = 64 << 30
	}
	img := filepath.Join(cfg.DataDir, loopImage)
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		tmp := img + ".tmp"
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(size)
		f.Close()
		if err == nil {
			err = run(ctx, "mkfs.xfs", "-q", "-m", "reflink=1", tmp)
		}
		if err == nil {
			err = os.Rename(tmp, img)
		}
		if err != nil {
			os.Remove(tmp)
			return fmt.Errorf("make xfs image: %w", err)
		}
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	if err := run(ctx, "mount", "-o", "loop,noatime,discard", img, mnt); err != nil {
		return fmt.Errorf("mount xfs image: %w", err)
	}
	if ok, err := Reflinks(mnt); err != nil || !ok {
		run(ctx, "umount", mnt)
		return fmt.Errorf("mounted xfs image does not reflink (%v)", err)
	}
	return nil
}

// Unmount unmounts the image mounted at dir, if one is (for tests and
// uninstall; a running worker never calls it). When something still uses
// the mount it is detached lazily, and the error says what was busy.
func Unmount(ctx context.Context, dir string) error {
	if mounted, err := isMountPoint(dir); err != nil || !mounted {
		return err
	}
	err := run(ctx, "umount", dir) // the loop device detaches with it (autoclear)
	if err != nil && run(ctx, "umount", "-l", dir) == nil {
		return fmt.Errorf("storage %s was busy, detached lazily: %w", dir, err)
	}
	return err
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// isMountPoint reports whether path is a mount point of this mount
// namespace.
func isMountPoint(path string) (bool, error) {
	_, mounted, err := mountSource(path)
	return mounted, err
}

// mountSource reports whether path is a mount point of this mount
// namespace, and what is mounted there (a device such as /dev/loop3).
// The last mount at path wins.
func mountSource(path string) (source string, mounted bool, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [tags] - type source super
		fields := strings.Fields(sc.Text())
		if len(fields) <= 4 || unescape(fields[4]) != abs {
			continue
		}
		mounted, source = true, ""
		for i, fld := range fields {
			if fld == "-" && i+2 < len(fields) {
				source = unescape(fields[i+2])
				break
			}
		}
	}
	return source, mounted, sc.Err()
}

// mountedWithDiscard reports whether the file system mounted at path
// discards freed blocks online (the discard mount option).
func mountedWithDiscard(path string) (bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	discard := false
	for line := range strings.Lines(string(b)) {
		fields := strings.Fields(line)
		if len(fields) <= 4 || unescape(fields[4]) != abs {
			continue
		}
		// Mount options, then after "-": type, source, super options.
		discard = false
		for _, fld := range fields {
			for _, opt := range strings.Split(fld, ",") {
				discard = discard || opt == "discard"
			}
		}
	}
	return discard, nil
}

// directIO turns direct I/O on for loop device dev (/dev/loopN; anything
// else is left alone) and reports whether it is on. A file system under
// the image that cannot do direct I/O keeps the device buffered.
func directIO(log *slog.Logger, dev string) bool {
	if !strings.HasPrefix(dev, "/dev/loop") {
		return false
	}
	f, err := os.Open(dev)
	if err != nil {
		log.Warn("loop device stays buffered", "device", dev, "err", err)
		return false
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_DIRECT_IO, 1); err != nil {
		log.Warn("loop device stays buffered", "device", dev, "err", err)
		return false
	}
	return true
}

// unescape undoes mountinfo's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
