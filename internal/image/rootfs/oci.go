package rootfs

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"space/internal/errkind"
)

// ImageConfig is the part of an OCI image's configuration that says how to
// run it.
type ImageConfig struct {
	Env        []string // KEY=value, or nil
	Entrypoint []string // or nil
	Cmd        []string // or nil
	WorkingDir string   // or "" for /
	User       string   // user[:group], names or ids; "" for root
}

// UnpackOCI unpacks the image at src into the directory dst (created if
// missing) and returns its configuration. src is an OCI image layout
// directory (index.json and blobs/), a tarball of one, or a docker-archive
// tarball ("docker save" output); tarballs may be gzip-compressed. When src
// holds several images, UnpackOCI takes the one for linux on the host's
// architecture, or the only one.
//
// Layers are applied in order with their whiteouts and opaque directories.
// Entries never write outside dst: ".." paths are rejected and symlinks met
// on the way to an entry resolve as if dst were the root directory. Run as
// root for exact ownership and device nodes.
//
// Errors wrap [errkind.InvalidArgument] when src is not an image or a layer is
// malformed, and [errkind.NotFound] when no image fits the platform.
func UnpackOCI(ctx context.Context, src, dst string) (*ImageConfig, error) {
	img, cleanup, err := openImage(src, filepath.Dir(filepath.Clean(dst)))
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return UnpackImage(ctx, img, src, dst)
}

// UnpackImage unpacks img (for example one from a registry) into the
// directory dst as [UnpackOCI] does; src names it in errors.
func UnpackImage(ctx context.Context, img v1.Image, src, dst string) (*ImageConfig, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: read image config: %w", src, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%s: read layers: %w", src, err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", src, err)
	}
	u := newUnpacker(dst)
	for i, l := range layers {
		if err := u.apply(ctx, l); err != nil {
			return nil, fmt.Errorf("unpack %s: layer %d: %w", src, i, err)
		}
	}
	if err := u.finish(); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", src, err)
	}
	c := cf.Config
	return &ImageConfig{Env: c.Env, Entrypoint: c.Entrypoint, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User}, nil
}

// openImage opens the image src names, unpacking a layout tarball into a
// temporary directory under tmpBase. cleanup removes any temporary files.
func openImage(src, tmpBase string) (_ v1.Image, cleanup func(), err error) {
	cleanup = func() {}
	notImage := fmt.Errorf("%s: not an OCI image layout or docker-archive tarball: %w", src, errkind.InvalidArgument)
	fi, err := os.Stat(src)
	if err != nil {
		return nil, cleanup, fmt.Errorf("open image: %w", err)
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(src, "index.json")); err != nil {
			return nil, cleanup, notImage
		}
		img, err := fromLayout(src)
		return img, cleanup, err
	}
	if !fi.Mode().IsRegular() {
		return nil, cleanup, notImage
	}
	names, err := tarNames(src)
	if err != nil || len(names) == 0 {
		return nil, cleanup, notImage
	}
	switch {
	case slices.Contains(names, "manifest.json"):
		img, err := fromDockerArchive(src)
		return img, cleanup, err
	case slices.Contains(names, "index.json"):
		dir, err := extractLayout(src, tmpBase)
		if err != nil {
			return nil, cleanup, err
		}
		cleanup = func() { os.RemoveAll(dir) }
		img, err := fromLayout(dir)
		if err != nil {
			cleanup()
			return nil, func() {}, fmt.Errorf("%s: %w", src, err)
		}
		return img, cleanup, nil
	default:
		return nil, cleanup, notImage
	}
}

// opener returns a tarball.Opener for src that undoes gzip compression.
func opener(src string) tarball.Opener {
	return func() (io.ReadCloser, error) {
		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		br := bufio.NewReader(f)
		magic, _ := br.Peek(2)
		if len(magic) < 2 || magic[0] != 0x1f || magic[1] != 0x8b {
			return readCloser{br, f}, nil
		}
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		return readCloser{zr, f}, nil
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

// tarNames lists the cleaned entry names of the tarball src.
func tarNames(src string) ([]string, error) {
	rc, err := opener(src)()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		names = append(names, path.Clean(hdr.Name))
	}
}

// platformOK reports whether p is linux on the host's architecture.
func platformOK(p *v1.Platform) bool {
	return p != nil && p.OS == "linux" && p.Architecture == runtime.GOARCH
}

func fromDockerArchive(src string) (v1.Image, error) {
	op := opener(src)
	m, err := tarball.LoadManifest(op)
	if err != nil {
		return nil, fmt.Errorf("%s: read docker-archive manifest (%w): %w", src, err, errkind.InvalidArgument)
	}
	if len(m) == 1 {
		img, err := tarball.Image(op, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		return img, nil
	}
	// Several images: only tagged ones can be told apart.
	for _, d := range m {
		if len(d.RepoTags) == 0 {
			continue
		}
		tag, err := name.NewTag(d.RepoTags[0])
		if err != nil {
			continue
		}
		img, err := tarball.Image(op, &tag)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", src, tag, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", src, tag, err)
		}
		if platformOK(cf.Platform()) {
			return img, nil
		}
	}
	return nil, fmt.Errorf("%s: no linux/%s image among %d: %w", src, runtime.GOARCH, len(m), errkind.NotFound)
}

// fromLayout picks the image to unpack from the OCI layout in dir, looking
// into nested indexes.
func fromLayout(dir string) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: not an OCI image layout (%w): %w", dir, err, errkind.InvalidArgument)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("%s: read index: %w", dir, err)
	}
	var all []candidate
	if err := collect(idx, 0, &all); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	// Drop what is not runnable anywhere, such as build attestations.
	images := slices.DeleteFunc(all, func(c candidate) bool {
		return c.platform != nil && (c.platform.OS == "unknown" || c.platform.Architecture == "unknown")
	})
	switch len(images) {
	case 0:
		return nil, fmt.Errorf("%s: no image in the layout: %w", dir, errkind.NotFound)
	case 1:
		return images[0].img, nil
	}
	for _, c := range images {
		p := c.platform
		if p == nil {
			cf, err := c.img.ConfigFile()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", dir, err)
			}
			p = cf.Platform()
		}
		if platformOK(p) {
			return c.img, nil
		}
	}
	return nil, fmt.Errorf("%s: no linux/%s image among %d: %w", dir, runtime.GOARCH, len(images), errkind.NotFound)
}

type candidate struct {
	img      v1.Image
	platform *v1.Platform // from the index, or nil
}

func collect(idx v1.ImageIndex, depth int, out *[]candidate) error {
	if depth > 8 {
		return fmt.Errorf("image indexes nested too deep: %w", errkind.InvalidArgument)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range m.Manifests {
		switch {
		case d.MediaType.IsImage():
			img, err := idx.Image(d.Digest)
			if err != nil {
				return err
			}
			*out = append(*out, candidate{img: img, platform: d.Platform})
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return err
			}
			if err := collect(child, depth+1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// extractLayout unpacks the OCI layout tarball src into a new directory under
// tmpBase and returns it. Only the layout's own files are taken.
func extractLayout(src, tmpBase string) (_ string, err error) {
	rc, err := opener(src)()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	if err := os.MkdirAll(tmpBase, 0o755); err != nil {
		return "", fmt.Errorf("unpack %s: %w", src, err)
	}
	dir, err := os.MkdirTemp(tmpBase, ".space-oci-")
	if err != nil {
		return "", fmt.Errorf("unpack %s: %w", src, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir, nil
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", src, err)
		}
		n := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if hdr.Typeflag != tar.TypeReg || !layoutFile(n) {
			continue
		}
		if err := writeLayoutFile(filepath.Join(dir, n), tr); err != nil {
			return "", fmt.Errorf("unpack %s: %w", src, err)
		}
	}
}

// layoutFile reports whether n is index.json, oci-layout or blobs/<alg>/<hex>.
func layoutFile(n string) bool {
	if n == "index.json" || n == "oci-layout" {
		return true
	}
	parts := strings.Split(n, "/")
	if len(parts) != 3 || parts[0] != "blobs" {
		return false
	}
	for _, p := range parts[1:] {
		if p == "" || strings.ContainsFunc(p, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '+' || r == '-' || r == '_')
		}) {
			return false
		}
	}
	return true
}

func writeLayoutFile(p string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
