package apt

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/ulikunitz/xz"

	"space/internal/errkind"
)

// Extract copies the entries of the data archive of the .deb file deb whose
// paths start with one of prefixes (all entries if none are given) into dir,
// which must exist. Paths are matched without their leading "./", so
// "lib/modules/" selects the kernel modules; parent directories of selected
// entries are created as needed.
//
// Extraction never writes outside dir: entries with absolute or ".." paths,
// and symlinks or hard links that point outside the archive root, are
// rejected with [errkind.InvalidArgument]. Directories, regular files,
// symlinks and hard links are extracted; device nodes and FIFOs are skipped.
// A data member compressed with an unsupported method (zstd) yields
// [errkind.InvalidArgument]; a full disk [errkind.ResourceExhausted].
func Extract(ctx context.Context, deb, dir string, prefixes ...string) error {
	f, err := os.Open(deb)
	if err != nil {
		return fmt.Errorf("extract deb: %w", err)
	}
	defer f.Close()
	data, err := openData(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return fmt.Errorf("extract %s: %w", filepath.Base(deb), err)
	}
	defer data.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("extract %s: %w", filepath.Base(deb), err)
	}
	defer root.Close()
	if err := untar(ctx, tar.NewReader(data), root, prefixes); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("extract %s: no space left in %s: %w", filepath.Base(deb), dir, errkind.ResourceExhausted)
		}
		return fmt.Errorf("extract %s: %w", filepath.Base(deb), err)
	}
	return nil
}

// ReadData calls fn with each entry of the data archive of the .deb file
// deb, in archive order; r reads the entry's content. Names come as the
// archive has them (usually "./usr/..."), and nothing is checked or
// written: the caller decides what an entry means. An error from fn stops
// the walk and is returned as is. A data member compressed with an
// unsupported method (zstd) yields [errkind.InvalidArgument].
func ReadData(ctx context.Context, deb string, fn func(hdr *tar.Header, r io.Reader) error) error {
	f, err := os.Open(deb)
	if err != nil {
		return fmt.Errorf("read deb: %w", err)
	}
	defer f.Close()
	data, err := openData(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return fmt.Errorf("read %s: %w", filepath.Base(deb), err)
	}
	defer data.Close()
	tr := tar.NewReader(data)
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: data.tar: %w", filepath.Base(deb), err)
		}
		if err := fn(hdr, tr); err != nil {
			return err
		}
	}
}

// openData walks the ar archive r and returns its decompressed data.tar
// member.
func openData(r io.Reader) (io.ReadCloser, error) {
	ar := newArReader(r)
	for {
		name, _, err := ar.next()
		if err == io.EOF {
			return nil, fmt.Errorf("no data.tar member: %w", errkind.InvalidArgument)
		}
		if err != nil {
			return nil, err
		}
		if !strings.HasPrefix(name, "data.tar") {
			continue
		}
		body := io.Reader(ar)
		switch ext := strings.TrimPrefix(name, "data.tar"); ext {
		case "":
			return io.NopCloser(body), nil
		case ".gz":
			zr, err := gzip.NewReader(body)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			return zr, nil
		case ".xz":
			zr, err := xz.NewReader(body)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			return io.NopCloser(zr), nil
		default:
			return nil, fmt.Errorf("%s: unsupported compression %q: %w", name, ext, errkind.InvalidArgument)
		}
	}
}

// arReader reads the members of a Unix ar archive (the .deb container) in
// order. After next, reading from the arReader yields the member's content.
type arReader struct {
	r       io.Reader
	started bool
	left    int64 // unread bytes of the current member
	pad     int64 // padding after the current member
}

func newArReader(r io.Reader) *arReader { return &arReader{r: r} }

// next skips the rest of the current member and returns the name and size of
// the following one, or io.EOF at the end of the archive.
func (a *arReader) next() (name string, size int64, err error) {
	if !a.started {
		magic := make([]byte, 8)
		if _, err := io.ReadFull(a.r, magic); err != nil || string(magic) != "!<arch>\n" {
			return "", 0, fmt.Errorf("not an ar archive: %w", errkind.InvalidArgument)
		}
		a.started = true
	}
	if _, err := io.CopyN(io.Discard, a.r, a.left+a.pad); err != nil {
		return "", 0, fmt.Errorf("ar: truncated member: %w", errkind.InvalidArgument)
	}
	a.left, a.pad = 0, 0
	var hdr [60]byte
	if _, err := io.ReadFull(a.r, hdr[:]); err == io.EOF {
		return "", 0, io.EOF
	} else if err != nil {
		return "", 0, fmt.Errorf("ar: truncated header: %w", errkind.InvalidArgument)
	}
	if string(hdr[58:60]) != "`\n" {
		return "", 0, fmt.Errorf("ar: bad header magic: %w", errkind.InvalidArgument)
	}
	size, err = strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
	if err != nil || size < 0 {
		return "", 0, fmt.Errorf("ar: bad member size %q: %w", hdr[48:58], errkind.InvalidArgument)
	}
	a.left, a.pad = size, size%2 // members start at even offsets
	// GNU ar ends names with "/"; BSD-style long names do not occur in .debs.
	name = strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
	return name, size, nil
}

// Read reads the content of the current member.
func (a *arReader) Read(p []byte) (int, error) {
	if a.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > a.left {
		p = p[:a.left]
	}
	n, err := a.r.Read(p)
	a.left -= int64(n)
	if err == io.EOF && a.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// untar writes the selected entries of tr below root.
func untar(ctx context.Context, tr *tar.Reader, root *os.Root, prefixes []string) error {
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read data.tar: %w", err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
		if name == "" || name == "." {
			continue // the archive root
		}
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q: path escapes the archive root: %w", hdr.Name, errkind.InvalidArgument)
		}
		name = path.Clean(name)
		if !selected(name, hdr.Typeflag == tar.TypeDir, prefixes) {
			continue
		}
		if err := writeEntry(tr, hdr, root, name); err != nil {
			return fmt.Errorf("entry %s: %w", name, err)
		}
	}
}

// selected reports whether name (or, for a directory, its subtree) matches
// one of prefixes.
func selected(name string, isDir bool, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) || (isDir && name+"/" == p) {
			return true
		}
	}
	return false
}

func writeEntry(tr *tar.Reader, hdr *tar.Header, root *os.Root, name string) error {
	perm := fs.FileMode(hdr.Mode).Perm()
	if parent := path.Dir(name); parent != "." {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, perm|0o700); err != nil {
			return err
		}
		return root.Chmod(name, perm|0o700) // MkdirAll leaves existing dirs alone
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		return errors.Join(err, f.Close())
	case tar.TypeSymlink:
		if path.IsAbs(hdr.Linkname) || !filepath.IsLocal(path.Join(path.Dir(name), hdr.Linkname)) {
			return fmt.Errorf("symlink to %q escapes the archive root: %w", hdr.Linkname, errkind.InvalidArgument)
		}
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return root.Symlink(hdr.Linkname, name)
	case tar.TypeLink:
		target := strings.TrimPrefix(hdr.Linkname, "./")
		if !filepath.IsLocal(target) {
			return fmt.Errorf("hard link to %q escapes the archive root: %w", hdr.Linkname, errkind.InvalidArgument)
		}
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return root.Link(path.Clean(target), name)
	default:
		return nil // device nodes, FIFOs: not needed from a package
	}
}
