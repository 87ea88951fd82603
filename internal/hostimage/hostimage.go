// Package hostimage builds the OCI images that run SPACE's control plane
// and workers in containers, reproducibly and without a container engine.
//
// An image is two layers: a base (for the control plane a distroless root
// of Debian data files, for the worker a debootstrapped Debian with QEMU)
// that is built once per content key and kept in the artifact cache, and
// the SPACE binaries on top. Every layer entry has a fixed order, owner and
// modification time, the config records SOURCE_DATE_EPOCH, and the archive
// is written in a fixed order too, so the same inputs give a byte-identical
// archive. The tag is derived from the manifest digest.
package hostimage

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"space/internal/apt"
	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/image/kernel"
)

// The images Build makes, by the name Config.Images uses.
const (
	ControlPlane = "controlplane"
	Worker       = "worker"
)

// DefaultRepository is the image name prefix when Config.Repository is
// empty: a name containerd and the kubelet use as is, not expanded into a
// registry's.
const DefaultRepository = "localhost/"

// IndexFile is the name of the file in Config.OutDir that lists the built
// images (a JSON array of [Image]).
const IndexFile = "images.json"

// Config says what Build puts into the images and where it writes them.
type Config struct {
	// Cache keeps the base layers. Required.
	Cache *cachedir.Dir
	// Space is the space binary to ship: static (CGO_ENABLED=0), x86-64.
	// Its build information gives the images' version and revision.
	// Required.
	Space string
	// Agent is the static space-agent binary the worker puts into guests.
	// Required when the worker image is built.
	Agent string
	// OutDir receives the archives and IndexFile; it is created if
	// missing. Required.
	OutDir string
	// Images are the images to build, ControlPlane and/or Worker. Nil
	// means both.
	Images []string
	// Repository is prefixed to the image names (space-controlplane,
	// space-worker) in the archives' references. Empty means
	// DefaultRepository.
	Repository string
	// Version and Revision label the images (org.opencontainers.image.version
	// and .revision). Empty means what Space's build information says
	// (`space version`'s version, vcs.revision).
	Version, Revision string
	// Source is the URL of the source code, for the
	// org.opencontainers.image.source label. Empty leaves it out.
	Source string
	// Epoch is the images' creation time (SOURCE_DATE_EPOCH). Zero means
	// the commit time in Space's build information, or the Unix epoch
	// when it has none.
	Epoch time.Time
	// Suite is the Debian release of the worker's base. Empty means
	// DefaultSuite.
	Suite string
	// Mirror is the Debian archive the worker's base comes from. Empty
	// means the host's ([apt.Mirror]).
	Mirror string
	// Log gets progress; nil logs nothing.
	Log *slog.Logger
}

// Image describes a built image archive.
type Image struct {
	Name      string `json:"name"`      // "space-controlplane" or "space-worker"
	Tag       string `json:"tag"`       // "sha-" and the digest's first 12 hex digits
	Reference string `json:"reference"` // Config.Repository + Name + ":" + Tag
	Digest    string `json:"digest"`    // of the image manifest, "sha256:..."
	Archive   string `json:"archive"`   // file name of the archive in Config.OutDir
	Size      int64  `json:"size"`      // of the archive, in bytes
	Version   string `json:"version"`   // of space, as `space version` prints it
	Revision  string `json:"revision,omitempty"`
}

// Build writes the archives of the images cfg.Images names into
// cfg.OutDir, as <name>-<tag>.tar, replacing older archives of the same
// images, and updates IndexFile there. It builds missing base layers into
// the cache: the control plane's from the host's apt index (downloads of a
// few hundred kilobytes), the worker's with debootstrap, which needs root
// and takes minutes. With a warm cache, Build takes seconds.
//
// Errors wrap [errkind.InvalidArgument] for a bad cfg and
// [errkind.FailedPrecondition] for a binary that is not static, a missing
// host tool or privilege; the apt layer's kinds come through as they are.
func Build(ctx context.Context, cfg Config) ([]Image, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	info, err := readBinary(cfg.Space)
	if err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	if cfg.Version != "" {
		info.version = cfg.Version
	}
	if cfg.Revision != "" {
		info.revision = cfg.Revision
	}
	if cfg.Epoch.IsZero() {
		cfg.Epoch = info.time
	}
	if cfg.Epoch.IsZero() {
		cfg.Epoch = time.Unix(0, 0)
	}
	cfg.Epoch = cfg.Epoch.UTC()
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	work, err := os.MkdirTemp(cfg.OutDir, ".work-")
	if err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	defer os.RemoveAll(work)

	var built []Image
	for _, kind := range cfg.Images {
		start := time.Now()
		spec, err := cfg.spec(ctx, kind, info, work)
		if err != nil {
			return nil, fmt.Errorf("build %s image: %w", kind, err)
		}
		img, err := write(ctx, spec, cfg, info, work)
		if err != nil {
			return nil, fmt.Errorf("build %s image: %w", kind, err)
		}
		cfg.Log.InfoContext(ctx, "image written", "name", img.Name, "tag", img.Tag, "digest", img.Digest,
			"archive", img.Archive, "size", img.Size, "duration", time.Since(start).Round(time.Millisecond))
		built = append(built, img)
	}
	if err := updateIndex(cfg.OutDir, built); err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	return built, nil
}

// withDefaults checks cfg and fills in its empty fields.
func (cfg Config) withDefaults() (Config, error) {
	switch {
	case cfg.Cache == nil:
		return cfg, fmt.Errorf("no cache: %w", errkind.InvalidArgument)
	case cfg.Space == "":
		return cfg, fmt.Errorf("no space binary: %w", errkind.InvalidArgument)
	case cfg.OutDir == "":
		return cfg, fmt.Errorf("no output directory: %w", errkind.InvalidArgument)
	}
	if cfg.Images == nil {
		cfg.Images = []string{ControlPlane, Worker}
	}
	for _, kind := range cfg.Images {
		if kind != ControlPlane && kind != Worker {
			return cfg, fmt.Errorf("unknown image %q (want %s or %s): %w", kind, ControlPlane, Worker, errkind.InvalidArgument)
		}
	}
	cfg.Images = slices.Compact(slices.Sorted(slices.Values(cfg.Images)))
	binaries := []string{cfg.Space}
	if slices.Contains(cfg.Images, Worker) {
		if cfg.Agent == "" {
			return cfg, fmt.Errorf("no space-agent binary for the worker image: %w", errkind.InvalidArgument)
		}
		binaries = append(binaries, cfg.Agent)
	}
	for _, b := range binaries {
		if err := checkStatic(b); err != nil {
			return cfg, err
		}
	}
	if cfg.Repository == "" {
		cfg.Repository = DefaultRepository
	}
	if cfg.Suite == "" {
		cfg.Suite = DefaultSuite
	}
	if cfg.Mirror == "" && slices.Contains(cfg.Images, Worker) {
		m, err := apt.Mirror()
		if err != nil {
			return cfg, fmt.Errorf("worker base mirror: %w", err)
		}
		cfg.Mirror = m
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// Paths inside the images.
const (
	binDir = "/usr/local/bin"
	// KernelDir is where the worker image keeps the guests' kernel, for
	// `space worker --guest-kernel`.
	KernelDir = "/usr/lib/space/kernel"
	dataDir   = "/var/lib/space"
	cacheDir  = "/var/cache/space"
)

// spec returns the image of kind: its base from the cache and a layer of
// the binaries written into work.
func (cfg Config) spec(ctx context.Context, kind string, info binaryInfo, work string) (imageSpec, error) {
	labels := map[string]string{
		"org.opencontainers.image.created": cfg.Epoch.Format(time.RFC3339),
		"org.opencontainers.image.version": info.version,
		"org.opencontainers.image.vendor":  "SPACE",
	}
	if info.revision != "" {
		labels["org.opencontainers.image.revision"] = info.revision
	}
	if cfg.Source != "" {
		labels["org.opencontainers.image.source"] = cfg.Source
	}
	files := []file{{src: cfg.Space, dst: "usr/local/bin/space", mode: 0o755}}
	var spec imageSpec
	var base *fileLayer
	var err error
	switch kind {
	case ControlPlane:
		labels["org.opencontainers.image.title"] = "space-controlplane"
		labels["org.opencontainers.image.description"] = "SPACE control plane: space server --no-worker"
		spec = imageSpec{name: "space-controlplane", config: v1.Config{
			Entrypoint:   []string{binDir + "/space", "server"},
			Cmd:          []string{"--no-worker", "--listen", ":7070"},
			Env:          []string{"PATH=" + binDir + ":/usr/bin:/bin", "HOME=/home/nonroot", "SPACE_DATA_DIR=" + dataDir, "SPACE_CACHE_DIR=" + cacheDir},
			User:         fmt.Sprintf("%d:%d", nonroot, nonroot),
			WorkingDir:   "/home/nonroot",
			ExposedPorts: map[string]struct{}{"7070/tcp": {}},
		}}
		base, err = controlPlaneBase(ctx, cfg.Cache, cfg.Log)
		spec.layers = append(spec.layers, layerSpec{base, "distroless base: files of Debian's " + packageNames(controlPlanePackages) + "; users root and nonroot"})
	case Worker:
		labels["org.opencontainers.image.title"] = "space-worker"
		labels["org.opencontainers.image.description"] = "SPACE worker: space worker, with QEMU"
		spec = imageSpec{name: "space-worker", config: v1.Config{
			Entrypoint:   []string{binDir + "/space", "worker"},
			Cmd:          []string{"--listen", ":7071"},
			Env:          []string{"PATH=/usr/local/sbin:" + binDir + ":/usr/sbin:/usr/bin:/sbin:/bin", "SPACE_DATA_DIR=" + dataDir, "SPACE_CACHE_DIR=" + cacheDir},
			User:         "0:0",
			WorkingDir:   "/",
			ExposedPorts: map[string]struct{}{"7071/tcp": {}},
		}}
		files = append(files, file{src: cfg.Agent, dst: "usr/local/bin/space-agent", mode: 0o755})
		base, err = workerBase(ctx, cfg.Cache, cfg.Suite, cfg.Mirror, cfg.Log)
		spec.layers = append(spec.layers, layerSpec{base, fmt.Sprintf("debootstrap --variant=minbase --include=%s %s %s",
			strings.Join(WorkerPackages, ","), cfg.Suite, cfg.Mirror)})
		if err == nil {
			var kl layerSpec
			kl, err = kernelLayer(ctx, cfg, work)
			spec.layers = append(spec.layers, kl)
		}
	}
	if err != nil {
		return imageSpec{}, err
	}
	spec.config.Labels = labels
	app, err := writeLayer(filepath.Join(work, spec.name+"-app.tar.gz"), func(tw *tar.Writer) error {
		return addFiles(tw, files, cfg.Epoch)
	})
	if err != nil {
		return imageSpec{}, fmt.Errorf("binaries layer: %w", err)
	}
	var names []string
	for _, f := range files {
		names = append(names, "/"+f.dst)
	}
	spec.layers = append(spec.layers, layerSpec{app, "space " + info.version + ": " + strings.Join(names, ", ")})
	return spec, nil
}

// kernelLayer is the guests' kernel, the apt index's current cloud kernel
// as the kernel package caches it, under KernelDir: a worker started with
// --guest-kernel boots the kernel its image was built with, needing
// neither its own apt index (which would be as old as the cached base
// layer) nor the network.
func kernelLayer(ctx context.Context, cfg Config, work string) (layerSpec, error) {
	k, err := kernel.Fetch(ctx, kernel.Config{Cache: cfg.Cache, Log: cfg.Log})
	if err != nil {
		return layerSpec{}, fmt.Errorf("guest kernel: %w", err)
	}
	entry := filepath.Dir(k.Vmlinux)
	var files []file
	err = filepath.WalkDir(entry, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(entry, p)
		if err != nil {
			return err
		}
		files = append(files, file{src: p, dst: path.Join(strings.TrimPrefix(KernelDir, "/"), k.SHA256, filepath.ToSlash(rel)), mode: 0o644})
		return nil
	})
	if err != nil {
		return layerSpec{}, fmt.Errorf("guest kernel: %w", err)
	}
	l, err := writeLayer(filepath.Join(work, "space-worker-kernel.tar.gz"), func(tw *tar.Writer) error {
		return addFiles(tw, files, cfg.Epoch)
	})
	if err != nil {
		return layerSpec{}, fmt.Errorf("guest kernel layer: %w", err)
	}
	return layerSpec{l, fmt.Sprintf("guest kernel %s (%s %s) in %s", k.Version, k.Package, k.PackageVersion, KernelDir)}, nil
}

func packageNames(ds []debFiles) string {
	var names []string
	for _, d := range ds {
		names = append(names, d.name)
	}
	return strings.Join(names, ", ")
}

// write assembles spec and writes its archive into cfg.OutDir, removing
// the archives of older builds of the same image.
func write(ctx context.Context, spec imageSpec, cfg Config, info binaryInfo, work string) (Image, error) {
	img, err := assemble(spec, cfg.Epoch)
	if err != nil {
		return Image{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return Image{}, err
	}
	tag := tagOf(digest)
	ref := cfg.Repository + spec.name + ":" + tag
	if _, err := name.NewTag(ref, name.StrictValidation); err != nil {
		return Image{}, fmt.Errorf("image reference %q: %v: %w", ref, err, errkind.InvalidArgument)
	}
	archive := spec.name + "-" + tag + ".tar"
	tmp := filepath.Join(work, archive)
	if err := writeArchive(ctx, img, ref, tag, tmp, cfg.Epoch); err != nil {
		return Image{}, err
	}
	fi, err := os.Stat(tmp)
	if err != nil {
		return Image{}, err
	}
	dst := filepath.Join(cfg.OutDir, archive)
	if err := os.Rename(tmp, dst); err != nil {
		return Image{}, err
	}
	old, err := filepath.Glob(filepath.Join(cfg.OutDir, spec.name+"-sha-*.tar"))
	if err != nil {
		return Image{}, err
	}
	for _, o := range old {
		if o != dst {
			if err := os.Remove(o); err != nil {
				return Image{}, err
			}
		}
	}
	return Image{
		Name: spec.name, Tag: tag, Reference: ref, Digest: digest.String(),
		Archive: archive, Size: fi.Size(), Version: info.version, Revision: info.revision,
	}, nil
}

// updateIndex writes IndexFile in dir: the images just built, and those an
// earlier run listed whose archives are still there.
func updateIndex(dir string, built []Image) error {
	p := filepath.Join(dir, IndexFile)
	var all []Image
	b, err := os.ReadFile(p)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &all); err != nil {
			all = nil // not ours to keep: rewritten below
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	all = slices.DeleteFunc(all, func(old Image) bool {
		if slices.ContainsFunc(built, func(i Image) bool { return i.Name == old.Name }) {
			return true
		}
		_, err := os.Stat(filepath.Join(dir, old.Archive))
		return err != nil
	})
	all = append(all, built...)
	slices.SortFunc(all, func(a, b Image) int { return strings.Compare(a.Name, b.Name) })
	out, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(p, append(out, '\n'))
}
