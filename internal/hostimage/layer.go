package hostimage

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
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
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// fileLayer is a gzip-compressed layer tarball in a file, with the digests
// taken while it was written. It implements [v1.Layer].
type fileLayer struct {
	path   string
	digest v1.Hash // of the compressed file
	diffID v1.Hash // of the tarball inside
	size   int64   // of the compressed file
}

var _ v1.Layer = (*fileLayer)(nil)

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }

func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("layer %s: %w", l.path, err)
	}
	return readCloser{zr, closers{zr, f}}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

type closers []io.Closer

func (cs closers) Close() error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// layerMeta is the JSON record of a cached layer's digests, kept next to it.
type layerMeta struct {
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
}

// Names of a cached layer's files in its cache entry.
const (
	layerFile     = "layer.tar.gz"
	layerMetaFile = "layer.json"
)

// saveMeta records l's digests in dir, the directory l's file is in.
func saveMeta(dir string, l *fileLayer) error {
	b, err := json.Marshal(layerMeta{Digest: l.digest.String(), DiffID: l.diffID.String(), Size: l.size})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, layerMetaFile), append(b, '\n'), 0o644)
}

// loadLayer returns the layer saveMeta recorded in dir.
func loadLayer(dir string) (*fileLayer, error) {
	b, err := os.ReadFile(filepath.Join(dir, layerMetaFile))
	if err != nil {
		return nil, err
	}
	var m layerMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, layerMetaFile), err)
	}
	l := &fileLayer{path: filepath.Join(dir, layerFile), size: m.Size}
	if l.digest, err = v1.NewHash(m.Digest); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, layerMetaFile), err)
	}
	if l.diffID, err = v1.NewHash(m.DiffID); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, layerMetaFile), err)
	}
	return l, nil
}

// writeLayer writes the tarball fill produces, gzip-compressed, to the new
// file dst and returns it as a layer. Compression is deterministic: the same
// tarball gives the same file.
func writeLayer(dst string, fill func(tw *tar.Writer) error) (_ *fileLayer, err error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(dst)
		}
	}()
	zsum, tsum := sha256.New(), sha256.New()
	zcount := &counter{}
	bw := bufio.NewWriterSize(io.MultiWriter(f, zsum, zcount), 1<<20)
	zw, err := gzip.NewWriterLevel(bw, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(io.MultiWriter(zw, tsum))
	if err := fill(tw); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return &fileLayer{path: dst, digest: sha256Hash(zsum), diffID: sha256Hash(tsum), size: zcount.n}, nil
}

func sha256Hash(h hash.Hash) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// treeRules say how a directory tree becomes layer entries.
type treeRules struct {
	// skip reports whether the entry rel (slash-separated, relative to the
	// tree's root) of type mode stays out of the layer; a skipped
	// directory's contents stay out too. Nil keeps everything.
	skip func(rel string, mode fs.FileMode) bool
	// mtime is every entry's modification time.
	mtime time.Time
}

// addTree writes the tree at root to tw in a fixed order (the lexical walk
// of filepath.WalkDir) with normalized headers: no user or group names, no
// access or change times, every modification time r.mtime. Files linked
// more than once become hard links to their first path; the only extended
// attribute kept is security.capability. Sockets, device nodes and FIFOs
// are left out: the container runtime makes /dev.
func addTree(ctx context.Context, tw *tar.Writer, root string, r treeRules) error {
	links := map[[2]uint64]string{} // (dev, inode) → first path
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if r.skip != nil && r.skip(rel, d.Type()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		hdr, err := treeHeader(p, rel, r, links)
		if err != nil || hdr == nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("layer entry %s: %w", rel, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		return copyFile(tw, p, hdr.Size)
	})
}

// treeHeader returns the layer header of the file at p, or nil for a file
// the layer leaves out.
func treeHeader(p, rel string, r treeRules, links map[[2]uint64]string) (*tar.Header, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("%s: no stat data", p)
	}
	hdr := &tar.Header{Name: rel, Mode: tarMode(fi.Mode()), Uid: int(st.Uid), Gid: int(st.Gid), ModTime: r.mtime}
	switch m := fi.Mode(); {
	case m.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
	case m&fs.ModeSymlink != 0:
		hdr.Typeflag = tar.TypeSymlink
		if hdr.Linkname, err = os.Readlink(p); err != nil {
			return nil, err
		}
	case m.IsRegular():
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := links[key]; ok && st.Nlink > 1 {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return hdr, nil
		}
		if st.Nlink > 1 {
			links[key] = rel
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		if err := addCapability(hdr, p); err != nil {
			return nil, err
		}
	default:
		return nil, nil
	}
	return hdr, nil
}

// tarMode turns m into a tar header's mode: permissions plus the setuid,
// setgid and sticky bits.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// addCapability records the file capabilities of p in hdr, as tar's
// SCHILY.xattr PAX records do.
func addCapability(hdr *tar.Header, p string) error {
	const attr = "security.capability"
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, attr, buf)
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP):
		return nil
	case err != nil:
		return &fs.PathError{Op: "getxattr", Path: p, Err: err}
	}
	hdr.PAXRecords = map[string]string{"SCHILY.xattr." + attr: string(buf[:n])}
	hdr.Format = tar.FormatPAX
	return nil
}

// copyFile copies the regular file p, of size bytes, into tw.
func copyFile(tw *tar.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(tw, f)
	if err != nil {
		return fmt.Errorf("layer entry %s: %w", p, err)
	}
	if n != size {
		return fmt.Errorf("layer entry %s: changed size while read", p)
	}
	return nil
}

// file is a host file to put into a layer.
type file struct {
	src  string // path on the host
	dst  string // path in the image, relative to its root: "usr/local/bin/space"
	mode int64  // permission bits
}

// addFiles writes files to tw, owned by root, each after the directories
// above it (mode 0755), in path order, with modification time mtime.
func addFiles(tw *tar.Writer, files []file, mtime time.Time) error {
	files = slices.SortedFunc(slices.Values(files), func(a, b file) int { return strings.Compare(a.dst, b.dst) })
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.dst); d != "." && d != "/" && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
			dirs[d] = true
		}
		slices.Reverse(parents)
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		fi, err := os.Stat(f.src)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file", f.src)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.dst, Mode: f.mode, Size: fi.Size(), ModTime: mtime}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if err := copyFile(tw, f.src, fi.Size()); err != nil {
			return err
		}
	}
	return nil
}

// memTree is a small file tree assembled in memory, keyed by clean
// relative path ("etc/passwd"). Entries carry their final header fields
// except Name and ModTime, which write sets.
type memTree map[string]*memEntry

type memEntry struct {
	hdr  tar.Header // Typeflag, Mode, Uid, Gid, Linkname
	data []byte     // of a regular file
}

// add puts an entry at rel, replacing what was there, and makes the
// directories above it (mode 0755, root's) where missing.
func (t memTree) add(rel string, hdr tar.Header, data []byte) {
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		if _, ok := t[d]; !ok {
			t[d] = &memEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}}
		}
	}
	hdr.Size = int64(len(data))
	t[rel] = &memEntry{hdr: hdr, data: data}
}

// write writes the tree to tw in path order (which puts every directory
// before what is in it), every entry with modification time mtime.
func (t memTree) write(tw *tar.Writer, mtime time.Time) error {
	for _, rel := range slices.Sorted(maps.Keys(t)) {
		e := t[rel]
		hdr := e.hdr
		hdr.Name, hdr.ModTime = rel, mtime
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			return fmt.Errorf("layer entry %s: %w", rel, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("layer entry %s: %w", rel, err)
		}
	}
	return nil
}
