package hostimage

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the archive's index.json entry: containerd names the
// image it imports by the first, OCI tools take the tag from the second.
const (
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

// layerSpec is one layer of an image and the history entry that says what
// made it.
type layerSpec struct {
	layer     v1.Layer
	createdBy string
}

// imageSpec is an image to assemble.
type imageSpec struct {
	name   string // "space-worker"
	layers []layerSpec
	config v1.Config
}

// assemble builds the OCI image spec describes, created at created (which
// its config and history record).
func assemble(spec imageSpec, created time.Time) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config:       spec.config,
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	var adds []mutate.Addendum
	for _, l := range spec.layers {
		adds = append(adds, mutate.Addendum{
			Layer:   l.layer,
			History: v1.History{Created: v1.Time{Time: created}, CreatedBy: l.createdBy, Comment: "space-images"},
		})
	}
	return mutate.Append(img, adds...)
}

// tagOf returns the tag of the image whose manifest digest is d: "sha-"
// and the digest's first 12 hex digits. The manifest names the config and
// every layer by digest, so the tag changes whenever the content does.
func tagOf(d v1.Hash) string { return "sha-" + d.Hex[:12] }

// blob is one file of an OCI layout: a name below blobs/ and its content.
type blob struct {
	digest v1.Hash
	size   int64
	open   func() (io.ReadCloser, error)
}

// writeArchive writes img to the new file dst as a tarball of an OCI image
// layout (oci-layout, index.json, blobs/sha256/...) whose index names it
// ref and tags it tag. It adds the manifest.json of a docker-archive
// pointing at the same blobs, so that tools that only read that format
// take it too. Entries are in a fixed order with modification time mtime:
// the same image gives the same file.
func writeArchive(ctx context.Context, img v1.Image, ref, tag, dst string, mtime time.Time) (err error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return err
	}
	blobs := []blob{bytesBlob(digest, manifest), bytesBlob(configName, config)}
	var layerPaths []string
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		blobs = append(blobs, blob{digest: d, size: size, open: l.Compressed})
		layerPaths = append(layerPaths, blobPath(d))
	}
	slices.SortFunc(blobs, func(a, b blob) int { return strings.Compare(a.digest.Hex, b.digest.Hex) })
	blobs = slices.CompactFunc(blobs, func(a, b blob) bool { return a.digest == b.digest })

	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Size:        int64(len(manifest)),
			Digest:      digest,
			Platform:    &v1.Platform{Architecture: "amd64", OS: "linux"},
			Annotations: map[string]string{annotationImageName: ref, annotationRefName: tag},
		}},
	})
	if err != nil {
		return err
	}
	docker, err := json.Marshal([]struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: blobPath(configName), RepoTags: []string{ref}, Layers: layerPaths}})
	if err != nil {
		return err
	}

	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(dst)
		}
	}()
	tw := tar.NewWriter(f)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: mtime})
	}
	small := func(name string, data []byte) error {
		return writeEntry(tw, name, int64(len(data)), mtime, func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		})
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	for _, b := range blobs {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		if err := writeEntry(tw, blobPath(b.digest), b.size, mtime, b.open); err != nil {
			return err
		}
	}
	if err := small("index.json", append(index, '\n')); err != nil {
		return err
	}
	if err := small("manifest.json", append(docker, '\n')); err != nil {
		return err
	}
	if err := small("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`+"\n")); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

func bytesBlob(d v1.Hash, data []byte) blob {
	return blob{digest: d, size: int64(len(data)), open: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}}
}

func blobPath(d v1.Hash) string { return "blobs/" + d.Algorithm + "/" + d.Hex }

// writeEntry writes the regular file name, of size bytes from open, to tw.
func writeEntry(tw *tar.Writer, name string, size int64, mtime time.Time, open func() (io.ReadCloser, error)) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: mtime}); err != nil {
		return err
	}
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	n, err := io.Copy(tw, rc)
	if err != nil {
		return fmt.Errorf("archive entry %s: %w", name, err)
	}
	if n != size {
		return fmt.Errorf("archive entry %s: %d bytes, want %d", name, n, size)
	}
	return nil
}

// writeFileAtomic writes data to name through a temporary file and a rename.
func writeFileAtomic(name string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
