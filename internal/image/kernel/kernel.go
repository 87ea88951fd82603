// Package kernel fetches the Debian cloud kernel that guests boot and
// prepares it for direct (PVH) boot: the vmlinuz, the uncompressed ELF
// vmlinux and the modules, kept in the artifact cache.
package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"space/internal/apt"
	"space/internal/cachedir"
	"space/internal/errkind"
)

// DefaultPackage is the kernel metapackage Fetch uses when Config.Package is
// empty.
const DefaultPackage = "linux-image-cloud-amd64"

// cacheKind is the cachedir kind of kernel entries. An entry, keyed by the
// .deb's SHA256, holds:
//
//	kernel.json              metadata (see meta)
//	vmlinuz                  the bzImage from the package
//	vmlinux                  the ELF kernel extracted from it
//	lib/modules/<version>/   the package's modules tree
const cacheKind = "kernel"

const metaFile = "kernel.json"

// Config says which kernel to fetch and where to keep it.
type Config struct {
	Cache   *cachedir.Dir // required
	Package string        // Debian package or metapackage; "" means DefaultPackage
	Log     *slog.Logger  // or nil to log nothing
}

// Kernel is a fetched kernel. Its files live in the cache and must not be
// modified.
type Kernel struct {
	Version        string // kernel release (uname -r), e.g. "6.1.0-57-cloud-amd64"
	Package        string // versioned package, e.g. "linux-image-6.1.0-57-cloud-amd64"
	PackageVersion string // Debian version of Package, e.g. "6.1.192-3"
	SHA256         string // hex digest of the package's .deb

	Vmlinuz    string // path of the compressed bzImage
	Vmlinux    string // path of the uncompressed ELF, bootable via its PVH entry
	ModulesDir string // path of lib/modules/<Version>
}

// meta is what an entry's kernel.json records.
type meta struct {
	Version        string `json:"version"`
	Package        string `json:"package"`
	PackageVersion string `json:"package_version"`
	SHA256         string `json:"sha256"`
}

// Fetch returns the current candidate of cfg.Package from the local apt
// index, downloading and unpacking it into the cache the first time. With
// the entry already cached it only consults the index (apt-cache), so it
// works without network. Errors from the apt layer keep their kinds
// ([errkind.NotFound] for an unknown package and so on).
func Fetch(ctx context.Context, cfg Config) (*Kernel, error) {
	if cfg.Cache == nil {
		return nil, fmt.Errorf("fetch kernel: no cache: %w", errkind.InvalidArgument)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pkg := cfg.Package
	if pkg == "" {
		pkg = DefaultPackage
	}
	name, err := apt.Resolve(ctx, pkg)
	if err != nil {
		return nil, fmt.Errorf("fetch kernel: %w", err)
	}
	want, err := apt.Lookup(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("fetch kernel: %w", err)
	}
	dir, err := cfg.Cache.Ensure(ctx, cacheKind, want.SHA256, func(ctx context.Context, tmp string) error {
		log.InfoContext(ctx, "fetching kernel", "package", want.Name, "version", want.Version)
		return build(ctx, want, tmp)
	})
	if err != nil {
		return nil, fmt.Errorf("fetch kernel: %w", err)
	}
	k, err := load(dir)
	if err != nil {
		return nil, fmt.Errorf("fetch kernel: %w", err)
	}
	log.DebugContext(ctx, "kernel ready", "version", k.Version, "path", dir)
	return k, nil
}

// build downloads and unpacks want into the new entry directory tmp.
func build(ctx context.Context, want apt.Package, tmp string) error {
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	p, err := apt.Download(ctx, want.Name, tmp)
	if err != nil {
		return err
	}
	if p.SHA256 != want.SHA256 {
		return fmt.Errorf("apt index changed during the fetch (%s=%s now), try again: %w", p.Name, p.Version, errkind.Conflict)
	}
	if err := apt.Extract(ctx, p.Path, tmp, "boot/vmlinuz-", "lib/modules/"); err != nil {
		return err
	}
	if err := os.Remove(p.Path); err != nil {
		return err
	}
	version, err := onlyDir(filepath.Join(tmp, "lib", "modules"))
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	vmlinuz := filepath.Join(tmp, "vmlinuz")
	if err := os.Rename(filepath.Join(tmp, "boot", "vmlinuz-"+version), vmlinuz); err != nil {
		return fmt.Errorf("%s: no vmlinuz for %s: %w", p.Name, version, err)
	}
	if err := os.RemoveAll(filepath.Join(tmp, "boot")); err != nil {
		return err
	}
	bz, err := os.ReadFile(vmlinuz)
	if err != nil {
		return err
	}
	elf, err := ExtractVmlinux(bz)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "vmlinux"), elf, 0o644); err != nil {
		return err
	}
	m, err := json.MarshalIndent(meta{Version: version, Package: p.Name, PackageVersion: p.Version, SHA256: p.SHA256}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(tmp, metaFile), append(m, '\n'), 0o644)
}

// onlyDir returns the name of the single directory in dir.
func onlyDir(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	if len(ents) != 1 || !ents[0].IsDir() {
		return "", fmt.Errorf("want exactly one kernel version in lib/modules, found %d entries: %w", len(ents), errkind.InvalidArgument)
	}
	return ents[0].Name(), nil
}

// load reads the cache entry at dir.
// FromDir returns the kernel kept in dir, which holds one kernel as this
// package caches it (a directory named by its .deb's SHA256, with
// kernel.json, vmlinuz, vmlinux and lib/modules): a kernel shipped in the
// worker's image, so that a worker needs neither the apt index nor the
// network to have the kernel its guests were built for.
func FromDir(dir string) (*Kernel, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("kernel directory: %w", err)
	}
	var found []string
	for _, e := range entries {
		if e.IsDir() {
			found = append(found, e.Name())
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("kernel directory %s: want one kernel, found %d: %w", dir, len(found), errkind.InvalidArgument)
	}
	k, err := load(filepath.Join(dir, found[0]))
	if err != nil {
		return nil, fmt.Errorf("kernel directory %s: %w", dir, err)
	}
	for _, f := range []string{k.Vmlinuz, k.Vmlinux, k.ModulesDir} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("kernel directory %s: %w", dir, err)
		}
	}
	return k, nil
}

func load(dir string) (*Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, metaFile), err)
	}
	if m.Version == "" || m.SHA256 != filepath.Base(dir) {
		return nil, fmt.Errorf("%s: inconsistent metadata: %w", filepath.Join(dir, metaFile), errkind.Internal)
	}
	return &Kernel{
		Version:        m.Version,
		Package:        m.Package,
		PackageVersion: m.PackageVersion,
		SHA256:         m.SHA256,
		Vmlinuz:        filepath.Join(dir, "vmlinuz"),
		Vmlinux:        filepath.Join(dir, "vmlinux"),
		ModulesDir:     filepath.Join(dir, "lib", "modules", m.Version),
	}, nil
}
