package controlplane

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"space/internal/httpapi"
)

// maxContextBytes bounds the files of one build context.
const maxContextBytes = 16 << 30

// extractContext unpacks the tar stream r (a template's build context)
// into the empty directory dir. Entries are regular files, directories,
// symbolic links (written as links, never followed) and, as root, device
// nodes; names stay inside dir and no entry is written through a link.
func extractContext(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return badContext("not a tar stream: %v", err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") || strings.ContainsRune(name, 0) {
			return badContext("entry %.100q leaves the build context", hdr.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := noLinkOnTheWay(dir, filepath.Dir(p)); err != nil {
			return err
		}
		mode := os.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(p, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if total += hdr.Size; total > maxContextBytes {
				return fmt.Errorf("build context larger than %d GiB: %w", maxContextBytes>>30, httpapi.ErrTooLarge)
			}
			if err := writeEntry(p, tr, mode); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				return badContext("%.100q: %v", hdr.Name, err)
			}
		case tar.TypeChar, tar.TypeBlock:
			dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
			kind := uint32(unix.S_IFCHR)
			if hdr.Typeflag == tar.TypeBlock {
				kind = unix.S_IFBLK
			}
			if err := unix.Mknod(p, kind|uint32(mode), int(dev)); err != nil {
				return badContext("device %.100q: %v", hdr.Name, err)
			}
		default:
			return badContext("entry %.100q: only files, directories, symbolic links and devices", hdr.Name)
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
	}
}

func writeEntry(p string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, mode)
	if err != nil {
		return badContext("%s: %v", filepath.Base(p), err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return badContext("%s: %v", filepath.Base(p), err)
	}
	return f.Close()
}

// noLinkOnTheWay checks that no directory between root and dir (both
// included) is a symbolic link, so an entry cannot be written elsewhere.
func noLinkOnTheWay(root, dir string) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		return err
	}
	p := root
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		if c == "." {
			continue
		}
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			return os.MkdirAll(dir, 0o755) // the rest is made fresh
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return badContext("%s is a symbolic link: entries under it are refused", c)
		}
	}
	return nil
}

func badContext(format string, args ...any) error {
	return httpapi.Invalid("context", "build context: "+format, args...)
}
