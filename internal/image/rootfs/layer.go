package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	maxSymlinks    = 40 // per path, as the kernel allows
	xattrPrefix    = "SCHILY.xattr."
)

// unpacker applies image layers to a root directory, one after the other.
type unpacker struct {
	root   string
	isRoot bool // the process may chown and mknod

	// dirs holds the mode and times of directories, applied by finish so
	// that later entries neither change the times nor need write access.
	dirs map[string]*tar.Header // host path → its latest header
}

func newUnpacker(root string) *unpacker {
	return &unpacker{root: filepath.Clean(root), isRoot: os.Geteuid() == 0, dirs: map[string]*tar.Header{}}
}

// apply applies one layer: first its whiteouts and opaque markers, which by
// the OCI image spec hide only what lower layers made, then its entries.
func (u *unpacker) apply(ctx context.Context, l v1.Layer) error {
	if err := u.eachEntry(ctx, l, u.whiteout); err != nil {
		return err
	}
	return u.eachEntry(ctx, l, u.entry)
}

func (u *unpacker) eachEntry(ctx context.Context, l v1.Layer, fn func(rel string, hdr *tar.Header, r io.Reader) error) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		rel, err := cleanName(hdr.Name)
		if err != nil {
			return err
		}
		if err := fn(rel, hdr, tr); err != nil {
			return err
		}
	}
}

// cleanName turns a tar entry name into a clean relative path, rejecting
// names that leave the root.
func cleanName(name string) (string, error) {
	rel := path.Clean(strings.TrimLeft(name, "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("entry %q leaves the root: %w", name, errkind.InvalidArgument)
	}
	return rel, nil
}

// whiteout handles rel if it is a whiteout or opaque marker.
func (u *unpacker) whiteout(rel string, _ *tar.Header, _ io.Reader) error {
	dirRel, base := path.Split(rel)
	if !strings.HasPrefix(base, whiteoutPrefix) {
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if base != opaqueMarker && (name == "" || name == "." || name == "..") {
		return fmt.Errorf("whiteout %q names no file: %w", rel, errkind.InvalidArgument)
	}
	dir, err := u.resolve(dirRel, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // nothing below to hide
	}
	if err != nil {
		return fmt.Errorf("whiteout %s: %w", rel, err)
	}
	if base == opaqueMarker {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("opaque directory %s: %w", dirRel, err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("opaque directory %s: %w", dirRel, err)
			}
		}
		return nil
	}
	if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("whiteout %s: %w", rel, err)
	}
	return nil
}

// entry creates rel from hdr, replacing what lower layers left there
// (directories merge).
func (u *unpacker) entry(rel string, hdr *tar.Header, r io.Reader) error {
	if strings.HasPrefix(path.Base(rel), whiteoutPrefix) {
		return nil // handled before the entries
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("root entry of type %q is not a directory: %w", hdr.Typeflag, errkind.InvalidArgument)
		}
		return u.setMeta(rel, u.root, hdr)
	}
	dirRel, base := path.Split(rel)
	dir, err := u.resolve(dirRel, true)
	if err != nil {
		return fmt.Errorf("create %s: %w", rel, err)
	}
	p := filepath.Join(dir, base)
	if fi, err := os.Lstat(p); err == nil {
		if fi.IsDir() && hdr.Typeflag == tar.TypeDir {
			return u.setMeta(rel, p, hdr)
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("replace %s: %w", rel, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("create %s: %w", rel, err)
	}
	delete(u.dirs, p)

	switch hdr.Typeflag {
	case tar.TypeDir:
		err = os.Mkdir(p, 0o700)
	case tar.TypeReg:
		err = writeFile(p, r)
	case tar.TypeSymlink:
		err = os.Symlink(hdr.Linkname, p)
	case tar.TypeLink:
		return u.link(rel, p, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		mode := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		err = unix.Mknod(p, mode|0o600, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))))
		if err != nil {
			err = &fs.PathError{Op: "mknod", Path: p, Err: err}
		}
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("entry %s: unsupported tar type %q: %w", rel, hdr.Typeflag, errkind.InvalidArgument)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", rel, err)
	}
	return u.setMeta(rel, p, hdr)
}

func writeFile(p string, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// link makes p a hard link to the entry target names.
func (u *unpacker) link(rel, p, target string) error {
	trel, err := cleanName(target)
	if err != nil {
		return fmt.Errorf("hard link %s: %w", rel, err)
	}
	if trel == "." {
		return fmt.Errorf("hard link %s to the root: %w", rel, errkind.InvalidArgument)
	}
	tdirRel, tbase := path.Split(trel)
	tdir, err := u.resolve(tdirRel, false)
	if err != nil {
		return fmt.Errorf("hard link %s to %s: %w", rel, target, err)
	}
	tp := filepath.Join(tdir, tbase)
	fi, err := os.Lstat(tp)
	if err != nil {
		return fmt.Errorf("hard link %s: %w", rel, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("hard link %s to directory %s: %w", rel, target, errkind.InvalidArgument)
	}
	// link(2) does not follow a symlink at tp: the link is to the symlink.
	if err := os.Link(tp, p); err != nil {
		return fmt.Errorf("hard link %s: %w", rel, err)
	}
	return nil
}

// setMeta gives p (rel in the image) hdr's owner, mode, extended attributes
// and times; directories get their mode and times in finish.
func (u *unpacker) setMeta(rel, p string, hdr *tar.Header) error {
	if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil && (u.isRoot || !errors.Is(err, syscall.EPERM)) {
		return fmt.Errorf("entry %s: %w", rel, err)
	}
	if hdr.Typeflag == tar.TypeDir {
		u.dirs[p] = hdr
	} else if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears setuid bits.
		if err := unix.Fchmodat(unix.AT_FDCWD, p, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("entry %s: chmod: %w", rel, err)
		}
	}
	// After chown, which clears security.capability.
	for _, k := range slices.Sorted(maps.Keys(hdr.PAXRecords)) {
		if !strings.HasPrefix(k, xattrPrefix) {
			continue
		}
		err := unix.Lsetxattr(p, strings.TrimPrefix(k, xattrPrefix), []byte(hdr.PAXRecords[k]), 0)
		if err != nil && !errors.Is(err, unix.ENOTSUP) && (u.isRoot || !errors.Is(err, unix.EPERM)) {
			return fmt.Errorf("entry %s: set extended attribute %s: %w", rel, strings.TrimPrefix(k, xattrPrefix), err)
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		if err := setTimes(p, hdr); err != nil {
			return fmt.Errorf("entry %s: %w", rel, err)
		}
	}
	return nil
}

func setTimes(p string, hdr *tar.Header) error {
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	ts := []unix.Timespec{timespec(atime), timespec(hdr.ModTime)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimes", Path: p, Err: err}
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Sec: 0}
	}
	return unix.NsecToTimespec(t.UnixNano())
}

// finish gives directories their modes and times, once nothing more is
// written into them.
func (u *unpacker) finish() error {
	for _, p := range slices.Sorted(maps.Keys(u.dirs)) {
		hdr := u.dirs[p]
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			continue // removed or replaced by a later layer
		}
		if err := unix.Fchmodat(unix.AT_FDCWD, p, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("directory %s: chmod: %w", hdr.Name, err)
		}
		if err := setTimes(p, hdr); err != nil {
			return fmt.Errorf("directory %s: %w", hdr.Name, err)
		}
	}
	return nil
}

// resolve returns the host path of the directory rel inside the root,
// following symlinks on the way as if the root were "/", so that no symlink
// can lead outside it. With create, missing directories are made (mode 0755);
// without, a missing one gives an error wrapping fs.ErrNotExist.
func (u *unpacker) resolve(rel string, create bool) (string, error) {
	var done []string // components resolved to real directories
	todo := strings.Split(rel, "/")
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		p := filepath.Join(u.root, filepath.Join(done...), c)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := os.Mkdir(p, 0o755); err != nil {
				return "", err
			}
			if err := os.Chmod(p, 0o755); err != nil { // undo the umask
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > maxSymlinks {
				return "", &fs.PathError{Op: "resolve", Path: rel, Err: syscall.ELOOP}
			}
			target, err := os.Readlink(p)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				done = done[:0]
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		case !fi.IsDir():
			return "", &fs.PathError{Op: "resolve", Path: rel, Err: syscall.ENOTDIR}
		}
		done = append(done, c)
	}
	return filepath.Join(u.root, filepath.Join(done...)), nil
}
