package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// ent is one tar entry of a test layer.
type ent struct {
	name     string
	typ      byte // tar.TypeReg when zero
	body     string
	link     string
	mode     int64 // 0644 for files, 0755 for directories when zero
	uid, gid int   // the test process's own when both zero
	major    int64
	minor    int64
	mtime    time.Time // layerTime when zero
	xattrs   map[string]string
}

var layerTime = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// newLayer builds a layer from entries, in order.
func newLayer(t *testing.T, entries ...ent) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, Devmajor: e.major, Devminor: e.minor,
			ModTime: e.mtime, Format: tar.FormatPAX,
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if hdr.Uid == 0 && hdr.Gid == 0 {
			hdr.Uid, hdr.Gid = os.Getuid(), os.Getgid()
		}
		if hdr.ModTime.IsZero() {
			hdr.ModTime = layerTime
		}
		if len(e.xattrs) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range e.xattrs {
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("setup: tar header %s: %v", e.name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("setup: tar body %s: %v", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatalf("setup: layer: %v", err)
	}
	return l
}

// newImage builds an image for arch (the host's when empty) from layers.
func newImage(t *testing.T, cfg v1.Config, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	if arch == "" {
		arch = runtime.GOARCH
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", arch, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return img
}

// writeLayout writes imgs as an OCI layout directory, each with its platform
// in the index.
func writeLayout(t *testing.T, imgs ...v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	idx := v1.ImageIndex(empty.Index)
	for _, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: cf.Platform()},
		})
	}
	if _, err := layout.Write(dir, idx); err != nil {
		t.Fatalf("setup: write layout: %v", err)
	}
	return dir
}

// writeDockerArchive writes imgs as "docker save" would, tagged test:0,
// test:1, ...
func writeDockerArchive(t *testing.T, imgs ...v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	m := map[name.Tag]v1.Image{}
	for i, img := range imgs {
		tag, err := name.NewTag(fmt.Sprintf("space-test:%d", i))
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		m[tag] = img
	}
	if err := tarball.MultiWriteToFile(p, m); err != nil {
		t.Fatalf("setup: write docker archive: %v", err)
	}
	return p
}

// tarDir packs dir into a tarball, gzip-compressed if gz.
func tarDir(t *testing.T, dir string, gz bool) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "packed.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer f.Close()
	var w io.Writer = f
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(f)
		w = zw
	}
	tw := tar.NewWriter(w)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatalf("setup: tar %s: %v", dir, err)
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return p
}

// gzipFile writes a gzip-compressed copy of p.
func gzipFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	out := p + ".gz"
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return out
}

// snapshot describes every entry under root but root itself: type, mode,
// owner, modification time and content or target.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		meta := fmt.Sprintf("%04o %d:%d %s", st.Mode&0o7777, st.Uid, st.Gid,
			time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC().Format(time.RFC3339))
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			m[rel] = "dir " + meta
		case syscall.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			m[rel] = fmt.Sprintf("file %s %q", meta, b)
		case syscall.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			m[rel] = fmt.Sprintf("symlink %d:%d -> %s", st.Uid, st.Gid, target)
		case syscall.S_IFCHR:
			m[rel] = fmt.Sprintf("char %d,%d %s", unix.Major(st.Rdev), unix.Minor(st.Rdev), meta)
		case syscall.S_IFBLK:
			m[rel] = fmt.Sprintf("block %d,%d %s", unix.Major(st.Rdev), unix.Minor(st.Rdev), meta)
		case syscall.S_IFIFO:
			m[rel] = "fifo " + meta
		default:
			m[rel] = "other"
		}
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return m
}
