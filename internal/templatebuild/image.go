// Package templatebuild builds templates: it turns a spec's base into a
// read-only root file system image that every worker can boot (Images), and
// runs the spec's steps in a build sandbox, caching each step's result as a
// snapshot, then captures the sandbox running its start command as the
// template's warm snapshot (Build).
package templatebuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"space/internal/cachedir"
	"space/internal/chunkstore"
	"space/internal/errkind"
	"space/internal/image/rootfs"
	"space/internal/templatespec"
)

// ImageKind is the cache kind of base images; an entry holds imageFile and
// configFile.
const ImageKind = "template-image"

const (
	imageFile  = "rootfs.ext4"
	configFile = "config.json"
	// imageLabel is the ext4 label of base images.
	imageLabel = "space-tpl"
)

// Image is a template's base: a read-only ext4 root file system.
type Image struct {
	// Name is what a worker boots it by (worker.Spec.Template).
	Name string
	// Path is the image file on this host.
	Path string
	// Config is the OCI image's run configuration; zero for the other
	// bases.
	Config rootfs.ImageConfig
}

var imageNameRE = regexp.MustCompile(`^img-[0-9a-f]{40}$`)

// ImageName is the name of the base image with cache key baseKey (a
// templatespec.Keys.Base).
func ImageName(baseKey string) string { return "img-" + baseKey[:40] }

// IsImageName reports whether name is one ImageName makes.
func IsImageName(name string) bool { return imageNameRE.MatchString(name) }

// Images makes and finds base images. They live in the host's cache and,
// when Chunks is set, in the chunk store too, so that a worker on another
// host fetches an image instead of building it again.
type Images struct {
	Cache  *cachedir.Dir     // required
	Chunks *chunkstore.Store // or nil: images stay on this host
	Log    *slog.Logger      // or nil
}

func (im *Images) log() *slog.Logger {
	if im.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return im.Log
}

// Prepare returns the image of base, whose cache key is baseKey, building
// it on first use: a Debian bootstrap of the suite with the packages (on
// the host, with apt; needs root), an OCI image (a layout or tarball in
// the build context, or a registry reference) unpacked, or a directory of
// the build context contextDir, each written as ext4. Concurrent callers
// wait for one build.
//
// A base from the build context (base.LocalPath) is team's own: its
// image is named and stored for team alone, so another team's build of
// the same bytes neither finds it nor is sped up by it, which would tell
// that team what this one uploaded. Bases from a registry or the Debian
// archive, which anyone may fetch, are shared by every team. team is
// required for a local base.
func (im *Images) Prepare(ctx context.Context, base templatespec.Base, contextDir, baseKey, team string) (Image, error) {
	if len(baseKey) < 40 {
		return Image{}, fmt.Errorf("base key %q: %w", baseKey, errkind.InvalidArgument)
	}
	domain := imageDomain
	if base.LocalPath() != "" {
		if team == "" {
			return Image{}, fmt.Errorf("base %s from the build context: no team: %w", base.LocalPath(), errkind.InvalidArgument)
		}
		baseKey, domain = teamImageKey(baseKey, team), chunkstore.TeamDomain(team)
	}
	img := Image{Name: ImageName(baseKey)}
	dir, err := im.Cache.Ensure(ctx, ImageKind, img.Name, func(ctx context.Context, tmp string) error {
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		return im.build(ctx, base, contextDir, tmp)
	})
	if err != nil {
		return Image{}, fmt.Errorf("base image: %w", err)
	}
	if img, err = readImage(dir, img.Name); err != nil {
		return Image{}, err
	}
	if err := im.store(ctx, dir, img.Name, domain); err != nil {
		return Image{}, fmt.Errorf("base image %s: chunk store: %w", img.Name, err)
	}
	return img, nil
}

// build writes the image and its configuration into dir.
func (im *Images) build(ctx context.Context, base templatespec.Base, contextDir, dir string) error {
	log := im.log().With("dir", dir)
	tree := filepath.Join(dir, "tree")
	var cfg rootfs.ImageConfig
	src := tree
	t0 := time.Now()
	switch {
	case base.Debian != nil:
		log.InfoContext(ctx, "bootstrapping a Debian base", "suite", base.Debian.Suite, "packages", base.Debian.Packages)
		if err := rootfs.Debootstrap(ctx, rootfs.BootstrapConfig{Dir: tree, Suite: base.Debian.Suite, Packages: base.Debian.Packages}); err != nil {
			return err
		}
	case base.Dir != "":
		src = filepath.Join(contextDir, base.Dir)
		if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
			return fmt.Errorf("base.dir %s is not a directory in the build context: %w", base.Dir, errkind.InvalidArgument)
		}
	case templatespec.LocalOCI(base.OCI):
		c, err := rootfs.UnpackOCI(ctx, filepath.Join(contextDir, base.OCI), tree)
		if err != nil {
			return err
		}
		cfg = *c
	default:
		c, err := pull(ctx, base.OCI, tree)
		if err != nil {
			return err
		}
		cfg = *c
	}
	log.InfoContext(ctx, "base tree ready", "took", time.Since(t0).Round(time.Millisecond))
	if err := rootfs.MakeExt4(ctx, src, filepath.Join(dir, imageFile), rootfs.Ext4Options{Label: imageLabel}); err != nil {
		return err
	}
	if err := os.RemoveAll(tree); err != nil {
		return err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, configFile), b, 0o644)
}

// pull unpacks the registry image ref into dst. Registries on loopback or
// private addresses are spoken to over plain HTTP, others over HTTPS.
func pull(ctx context.Context, ref, dst string) (*rootfs.ImageConfig, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("base.oci %q: %v: %w", ref, err, errkind.InvalidArgument)
	}
	img, err := remote.Image(r, remote.WithContext(ctx))
	if err != nil {
		var te interface{ Temporary() bool }
		kind := errkind.Unavailable
		if errors.As(err, &te) && !te.Temporary() {
			kind = errkind.NotFound
		}
		return nil, fmt.Errorf("pull %s: %v: %w", ref, err, kind)
	}
	return rootfs.UnpackImage(ctx, img, ref, dst)
}

func readImage(dir, name string) (Image, error) {
	img := Image{Name: name, Path: filepath.Join(dir, imageFile)}
	b, err := os.ReadFile(filepath.Join(dir, configFile))
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &img.Config); err != nil {
		return Image{}, fmt.Errorf("image %s: config: %v: %w", name, err, errkind.Internal)
	}
	if _, err := os.Stat(img.Path); err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	return img, nil
}

// imageDomain is the chunk store's dedup domain of the base images every
// team shares (from a registry or the Debian archive): a domain of their
// own, apart from every team's snapshots (see the chunkstore package
// doc).
const imageDomain = "platform/base-images"

// teamImageKey is the cache key of team's image of a local base whose
// key is baseKey.
func teamImageKey(baseKey, team string) string {
	h := sha256.New()
	io.WriteString(h, "space-team-base-image-1\x00")
	io.WriteString(h, team)
	io.WriteString(h, "\x00")
	io.WriteString(h, baseKey)
	return hex.EncodeToString(h.Sum(nil))
}

// store puts the image into the chunk store, in dedup domain domain,
// unless it is there already.
func (im *Images) store(ctx context.Context, dir, name, domain string) error {
	if im.Chunks == nil {
		return nil
	}
	if _, err := im.Chunks.Get(ctx, name); err == nil {
		return nil
	} else if !errors.Is(err, errkind.NotFound) {
		return err
	}
	t0 := time.Now()
	_, st, err := im.Chunks.Put(ctx, name, []chunkstore.File{
		{Name: imageFile, Path: filepath.Join(dir, imageFile)},
		{Name: configFile, Path: filepath.Join(dir, configFile)},
	}, chunkstore.PutOptions{Domain: domain})
	if err != nil {
		return err
	}
	im.log().InfoContext(ctx, "base image stored", "image", name, "logical_bytes", st.LogicalBytes, "new_bytes", st.NewBytes, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// Open returns the base image name on this host, reassembling it from the
// chunk store when the host has never seen it. An unknown name is
// errkind.NotFound.
func (im *Images) Open(ctx context.Context, name string) (Image, error) {
	if !IsImageName(name) {
		return Image{}, fmt.Errorf("image %q: %w", name, errkind.NotFound)
	}
	if _, err := os.Stat(im.Cache.Path(ImageKind, name)); err != nil && im.Chunks == nil {
		return Image{}, fmt.Errorf("image %s is not on this host and there is no chunk store: %w", name, errkind.NotFound)
	}
	dir, err := im.Cache.Ensure(ctx, ImageKind, name, func(ctx context.Context, tmp string) error {
		m, err := im.Chunks.Get(ctx, name)
		if err != nil {
			return err
		}
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		t0 := time.Now()
		for _, f := range []string{imageFile, configFile} {
			if err := im.Chunks.Restore(ctx, m, f, filepath.Join(tmp, f)); err != nil {
				return err
			}
		}
		im.log().InfoContext(ctx, "base image fetched from the chunk store", "image", name, "took", time.Since(t0).Round(time.Millisecond))
		return nil
	})
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	return readImage(dir, name)
}
