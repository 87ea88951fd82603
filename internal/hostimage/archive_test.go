package hostimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// openArchive opens the image in the OCI layout tarball p with
// go-containerregistry's layout reader, checks that the archive's index
// names it ref with tag, the tag derived from its digest, and validates
// it (every digest and size).
func openArchive(t *testing.T, p, ref, tag string) v1.Image {
	t.Helper()
	img := openLayout(t, p, ref, tag)
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("%s: Digest() error = %v", p, err)
	}
	if tagOf(d) != tag {
		t.Errorf("%s: tag %s, want %s for digest %s", p, tag, tagOf(d), d)
	}
	return img
}

// openLayout is openArchive for any tag.
func openLayout(t *testing.T, p, ref, tag string) v1.Image {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(p)
	if err != nil {
		t.Fatalf("open archive: %v", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read archive %s: %v", p, err)
		}
		dst := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			var out *os.File
			if out, err = os.Create(dst); err == nil {
				_, err = io.Copy(out, tr)
				err = errors.Join(err, out.Close())
			}
		default:
			t.Fatalf("archive %s: entry %s of type %c, want files and directories only", p, hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			t.Fatalf("unpack archive %s: %v", p, err)
		}
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("layout.FromPath(%s) error = %v", p, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatalf("%s: ImageIndex() error = %v", p, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatalf("%s: IndexManifest() error = %v", p, err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%s: index lists %d manifests, want 1", p, len(im.Manifests))
	}
	d := im.Manifests[0]
	wantAnn := map[string]string{annotationImageName: ref, annotationRefName: tag}
	if diff := cmp.Diff(wantAnn, d.Annotations); diff != "" {
		t.Errorf("%s: index annotations mismatch (-want +got):\n%s", p, diff)
	}
	if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != "amd64" {
		t.Errorf("%s: index platform = %v, want linux/amd64", p, d.Platform)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatalf("%s: Image(%s) error = %v", p, d.Digest, err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("%s: validate.Image() = %v", p, err)
	}
	return img
}

// checkDockerArchive opens p as a docker-archive, as tools that know only
// that format do, and checks that it is img.
func checkDockerArchive(t *testing.T, p string, img v1.Image) {
	t.Helper()
	dimg, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		t.Fatalf("tarball.ImageFromPath(%s) error = %v", p, err)
	}
	if err := validate.Image(dimg, validate.Fast); err != nil {
		t.Errorf("%s as docker-archive: validate.Image() = %v", p, err)
	}
	got, err := dimg.ConfigName()
	if err != nil {
		t.Fatalf("%s as docker-archive: ConfigName() error = %v", p, err)
	}
	want, err := img.ConfigName()
	if err != nil {
		t.Fatalf("ConfigName() error = %v", err)
	}
	if got != want {
		t.Errorf("%s as docker-archive: config %s, want %s", p, got, want)
	}
}

// readImage returns the headers of the files of img's flattened root and
// the contents of the files named read.
func readImage(t *testing.T, img v1.Image, read ...string) (map[string]*tar.Header, map[string]string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files, data := map[string]*tar.Header{}, map[string]string{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, data
		}
		if err != nil {
			t.Fatalf("flatten image: %v", err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
		files[name] = hdr
		if slices.Contains(read, name) {
			var b bytes.Buffer
			if _, err := io.Copy(&b, tr); err != nil {
				t.Fatalf("flatten image: %s: %v", name, err)
			}
			data[name] = b.String()
		}
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// testSpec returns an image of a small in-memory base and a layer holding
// the file bin as /usr/local/bin/space.
func testSpec(t *testing.T, bin string) imageSpec {
	t.Helper()
	dir := t.TempDir()
	base := memTree{}
	base.add("etc/passwd", tar.Header{Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0::/root:/sbin/nologin\n"))
	base.add("tmp", tar.Header{Typeflag: tar.TypeDir, Mode: 0o1777}, nil)
	bl, err := writeLayer(filepath.Join(dir, "base.tar.gz"), func(tw *tar.Writer) error { return base.write(tw, baseTime) })
	if err != nil {
		t.Fatalf("setup: base layer: %v", err)
	}
	al, err := writeLayer(filepath.Join(dir, "app.tar.gz"), func(tw *tar.Writer) error {
		return addFiles(tw, []file{{src: bin, dst: "usr/local/bin/space", mode: 0o755}}, time.Unix(1800000000, 0))
	})
	if err != nil {
		t.Fatalf("setup: app layer: %v", err)
	}
	return imageSpec{
		name:   "space-test",
		layers: []layerSpec{{bl, "base"}, {al, "app"}},
		config: v1.Config{
			Entrypoint: []string{"/usr/local/bin/space", "server"},
			User:       "65532:65532",
			Labels:     map[string]string{"org.opencontainers.image.version": "v1"},
		},
	}
}

// writeTestArchive assembles spec and writes it into a new directory,
// returning the archive's path, reference and tag.
func writeTestArchive(t *testing.T, spec imageSpec) (p, ref, tag string) {
	t.Helper()
	created := time.Unix(1800000000, 0).UTC()
	img, err := assemble(spec, created)
	if err != nil {
		t.Fatalf("assemble() error = %v", err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("Digest() error = %v", err)
	}
	tag = tagOf(d)
	ref = "localhost/" + spec.name + ":" + tag
	p = filepath.Join(t.TempDir(), spec.name+"-"+tag+".tar")
	if err := writeArchive(t.Context(), img, ref, tag, p, created); err != nil {
		t.Fatalf("writeArchive() error = %v", err)
	}
	return p, ref, tag
}

func TestWriteArchive(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "space")
	if err := os.WriteFile(bin, []byte("binary one"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	p, ref, tag := writeTestArchive(t, testSpec(t, bin))
	img := openArchive(t, p, ref, tag)
	checkDockerArchive(t, p, img)

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("ConfigFile() error = %v", err)
	}
	if diff := cmp.Diff([]string{"/usr/local/bin/space", "server"}, cf.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint mismatch (-want +got):\n%s", diff)
	}
	if cf.Config.User != "65532:65532" || cf.Config.Labels["org.opencontainers.image.version"] != "v1" {
		t.Errorf("config user %q, labels %v; want 65532:65532 and version v1", cf.Config.User, cf.Config.Labels)
	}
	if got, want := cf.Created.Unix(), int64(1800000000); got != want || len(cf.History) != 2 || cf.History[1].Created.Unix() != want {
		t.Errorf("config created %d, history %v; want %d throughout", got, cf.History, want)
	}
	files, _ := readImage(t, img)
	if h, ok := files["usr/local/bin/space"]; !ok || h.Mode != 0o755 || h.Uid != 0 {
		t.Errorf("image file usr/local/bin/space = %+v, want mode 0755 owned by root", h)
	}
	if h, ok := files["tmp"]; !ok || h.Mode != 0o1777 {
		t.Errorf("image directory tmp = %+v, want mode 01777", h)
	}

	t.Run("same inputs, same archive", func(t *testing.T) {
		p2, _, tag2 := writeTestArchive(t, testSpec(t, bin))
		if tag2 != tag || fileSum(t, p2) != fileSum(t, p) {
			t.Errorf("second archive: tag %s sha256 %s, want %s %s", tag2, fileSum(t, p2), tag, fileSum(t, p))
		}
	})
	t.Run("tag follows content", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "space")
		if err := os.WriteFile(other, []byte("binary two"), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
		_, _, tag2 := writeTestArchive(t, testSpec(t, other))
		spec := testSpec(t, bin)
		spec.config.Labels = map[string]string{"org.opencontainers.image.version": "v2"}
		_, _, tag3 := writeTestArchive(t, spec)
		if tag2 == tag || tag3 == tag || tag2 == tag3 {
			t.Errorf("tags of images with another binary (%s) and another label (%s) = those of the first (%s), want all different", tag2, tag3, tag)
		}
	})
}

// TestArchiveLayout checks the archive's own entries: a fixed order,
// fixed time stamps and owners, nothing but the layout and manifest.json.
func TestArchiveLayout(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "space")
	if err := os.WriteFile(bin, []byte("binary"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	p, _, _ := writeTestArchive(t, testSpec(t, bin))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read archive: %v", err)
	}
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		if hdr.ModTime.Unix() != 1800000000 || hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" {
			t.Errorf("entry %s: mtime %v uid %d gid %d uname %q, want the epoch and root by number", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid, hdr.Uname)
		}
		if strings.HasPrefix(hdr.Name, "blobs/sha256/") && hdr.Typeflag == tar.TypeReg {
			names = append(names, "blobs/sha256/<digest>")
			continue
		}
		names = append(names, hdr.Name)
	}
	want := []string{"blobs/", "blobs/sha256/",
		"blobs/sha256/<digest>", "blobs/sha256/<digest>", "blobs/sha256/<digest>", "blobs/sha256/<digest>",
		"index.json", "manifest.json", "oci-layout"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("archive entries mismatch (-want +got):\n%s", diff)
	}
}
