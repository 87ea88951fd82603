package hostimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"space/internal/apt"
	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/image/rootfs"
)

// cacheKind is the [cachedir.Dir] kind of the base layers. An entry holds
// layer.tar.gz and layer.json (its digests).
const cacheKind = "hostimage"

// baseFormat changes whenever the way a base layer is made changes, so
// that layers made the old way are no longer found.
const baseFormat = 2

// baseTime is every base layer entry's modification time. It is a
// constant, not the commit time, so that a base layer's digest changes only
// with its content and registries and nodes keep sharing it across
// releases.
var baseTime = time.Unix(0, 0).UTC()

// nonroot is the user the control plane runs as, numbered as in distroless
// images.
const nonroot = 65532

// DefaultSuite is the Debian release of the worker's base.
const DefaultSuite = "bookworm"

// WorkerPackages are installed into the worker's base on top of
// debootstrap's minbase: QEMU with the firmware it loads, the tools the
// worker runs (mkfs.ext4, mkfs.xfs, ip), and debootstrap, with which a
// worker whose cache is empty builds the guests' default root file system.
var WorkerPackages = []string{
	"qemu-system-x86", "qemu-system-data", "seabios", "ipxe-qemu", "qemu-utils",
	"e2fsprogs", "xfsprogs", "iproute2", "ca-certificates", "debootstrap",
}

// debFiles names a Debian package and the paths of it the control plane's
// base takes: prefixes of paths in the package, without its "./".
type debFiles struct {
	name  string
	paths []string
}

// controlPlanePackages are what the control plane's base takes from
// Debian: CA certificates, time zones, and the network databases
// (/etc/services, /etc/protocols); each with its copyright file.
var controlPlanePackages = []debFiles{
	{"ca-certificates", []string{"usr/share/ca-certificates/mozilla/", "usr/share/doc/ca-certificates/copyright"}},
	{"netbase", []string{"etc/", "usr/share/doc/netbase/copyright"}},
	{"tzdata", []string{"usr/share/zoneinfo/", "usr/share/doc/tzdata/copyright"}},
}

// cachedLayer returns the layer cached under key, calling build to make it
// first when the cache lacks it. build writes the layer with writeLayer to
// the path it is given, inside the scratch directory work, which is
// deleted afterwards.
func cachedLayer(ctx context.Context, cache *cachedir.Dir, key string,
	build func(ctx context.Context, dst, work string) (*fileLayer, error)) (*fileLayer, error) {
	dir, err := cache.Ensure(ctx, cacheKind, key, func(ctx context.Context, tmp string) error {
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		work, err := os.MkdirTemp(filepath.Dir(tmp), "work-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(work)
		l, err := build(ctx, filepath.Join(tmp, layerFile), work)
		if err != nil {
			return err
		}
		return saveMeta(tmp, l)
	})
	if err != nil {
		return nil, err
	}
	return loadLayer(dir)
}

// contentKey returns prefix-<16 hex digits of the SHA-256 of v's JSON>.
func contentKey(prefix string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return prefix + "-" + hex.EncodeToString(sum[:8]), nil
}

// controlPlaneBase returns the control plane's base layer: a distroless
// root of files from [controlPlanePackages] in the host's apt index (CA
// bundle, zoneinfo, netbase) and the users root and nonroot. The layer is
// cached by the packages' SHA-256, so with a warm cache only the apt index
// is read.
func controlPlaneBase(ctx context.Context, cache *cachedir.Dir, log *slog.Logger) (*fileLayer, error) {
	type pkgKey struct{ Name, Version, SHA256 string }
	var pkgs []pkgKey
	for _, d := range controlPlanePackages {
		p, err := apt.Lookup(ctx, d.name)
		if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, pkgKey{p.Name, p.Version, p.SHA256})
	}
	key, err := contentKey("controlplane", struct {
		Format   int
		Packages []pkgKey
	}{baseFormat, pkgs})
	if err != nil {
		return nil, err
	}
	return cachedLayer(ctx, cache, key, func(ctx context.Context, dst, work string) (*fileLayer, error) {
		log.InfoContext(ctx, "building the control plane base", "key", key)
		tree, err := controlPlaneTree(ctx, work)
		if err != nil {
			return nil, err
		}
		return writeLayer(dst, func(tw *tar.Writer) error { return tree.write(tw, baseTime) })
	})
}

// controlPlaneTree assembles the control plane's base, downloading the
// packages into the directory work.
func controlPlaneTree(ctx context.Context, work string) (memTree, error) {
	tree := memTree{}
	certs := map[string][]byte{} // name → PEM
	for _, d := range controlPlanePackages {
		p, err := apt.Download(ctx, d.name, work)
		if err != nil {
			return nil, err
		}
		err = apt.ReadData(ctx, p.Path, func(hdr *tar.Header, r io.Reader) error {
			return addDebEntry(tree, certs, d.paths, hdr, r)
		})
		if err != nil {
			return nil, err
		}
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("ca-certificates: no certificates in the package: %w", errkind.NotFound)
	}
	var bundle []byte
	for _, name := range slices.Sorted(maps.Keys(certs)) { // as update-ca-certificates orders them
		bundle = append(bundle, certs[name]...)
		if !bytes.HasSuffix(bundle, []byte("\n")) {
			bundle = append(bundle, '\n')
		}
	}
	file := func(mode int64) tar.Header { return tar.Header{Typeflag: tar.TypeReg, Mode: mode} }
	dir := func(mode int64, owner int) tar.Header {
		return tar.Header{Typeflag: tar.TypeDir, Mode: mode, Uid: owner, Gid: owner}
	}
	tree.add("etc/ssl/certs/ca-certificates.crt", file(0o644), bundle)
	tree.add("etc/passwd", file(0o644), []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"))
	tree.add("etc/group", file(0o644), []byte("root:x:0:\nnonroot:x:65532:\n"))
	tree.add("etc/nsswitch.conf", file(0o644), []byte("passwd: files\ngroup: files\nhosts: files dns\n"))
	for _, mnt := range []string{"dev", "proc", "sys"} { // mount points, as runtimes expect
		tree.add(mnt, dir(0o755, 0), nil)
	}
	tree.add("root", dir(0o700, 0), nil)
	tree.add("home/nonroot", dir(0o700, nonroot), nil)
	tree.add("tmp", dir(0o1777, 0), nil)
	tree.add("var/lib/space", dir(0o700, nonroot), nil)
	tree.add("var/cache/space", dir(0o755, nonroot), nil)
	return tree, nil
}

// addDebEntry adds the package entry hdr to tree, owned by root, if its
// path starts with one of prefixes; CA certificates go to certs instead, to
// be bundled. Hard links become copies (the data is small).
func addDebEntry(tree memTree, certs map[string][]byte, prefixes []string, hdr *tar.Header, r io.Reader) error {
	rel := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
	if !filepath.IsLocal(rel) || !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(rel, p) }) {
		return nil
	}
	out := tar.Header{Typeflag: hdr.Typeflag, Mode: hdr.Mode & 0o7777}
	var data []byte
	switch hdr.Typeflag {
	case tar.TypeDir:
	case tar.TypeSymlink:
		out.Mode, out.Linkname = 0o777, hdr.Linkname
	case tar.TypeReg:
		b, err := io.ReadAll(r)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		data = b
	case tar.TypeLink:
		target, ok := tree[path.Clean(strings.TrimPrefix(hdr.Linkname, "./"))]
		if !ok || target.hdr.Typeflag != tar.TypeReg {
			return fmt.Errorf("%s: hard link to %s, not a file before it: %w", rel, hdr.Linkname, errkind.InvalidArgument)
		}
		out, data = target.hdr, target.data
	default:
		return nil
	}
	if path.Dir(rel) == "usr/share/ca-certificates/mozilla" {
		if out.Typeflag == tar.TypeReg && strings.HasSuffix(rel, ".crt") {
			certs[path.Base(rel)] = data
		}
		return nil
	}
	tree.add(rel, out, data)
	return nil
}

// workerBase returns the worker's base layer: debootstrap's minbase of
// suite from mirror plus [WorkerPackages], with apt's package lists (the
// worker looks the guest kernel up in them), trimmed by workerSkip. It is
// cached by suite, mirror and package list; a cold build takes minutes and
// needs root.
func workerBase(ctx context.Context, cache *cachedir.Dir, suite, mirror string, log *slog.Logger) (*fileLayer, error) {
	cfg := rootfs.BootstrapConfig{
		Suite: suite, Mirror: mirror, Variant: "minbase", Packages: WorkerPackages, KeepLists: true,
		// Package scripts that honour it write no dates (shadow's
		// last-change field) and compile Python to hash-based .pyc files.
		Env: []string{fmt.Sprintf("SOURCE_DATE_EPOCH=%d", baseTime.Unix())},
	}
	key, err := contentKey("worker-"+suite, struct {
		Format                 int
		Suite, Mirror, Variant string
		Packages               []string
	}{baseFormat, cfg.Suite, cfg.Mirror, cfg.Variant, slices.Sorted(slices.Values(cfg.Packages))})
	if err != nil {
		return nil, err
	}
	return cachedLayer(ctx, cache, key, func(ctx context.Context, dst, work string) (*fileLayer, error) {
		cfg.Dir = filepath.Join(work, "tree")
		log.InfoContext(ctx, "debootstrap of the worker base started", "key", key, "suite", suite, "mirror", mirror, "packages", cfg.Packages)
		start := time.Now()
		if err := rootfs.Debootstrap(ctx, cfg); err != nil {
			return nil, err
		}
		log.InfoContext(ctx, "debootstrap done", "duration", time.Since(start).Round(time.Second))
		return writeLayer(dst, func(tw *tar.Writer) error {
			return addTree(ctx, tw, cfg.Dir, treeRules{skip: workerSkip, mtime: baseTime})
		})
	})
}

// workerEmptied are directories of the worker's base kept empty: the
// container runtime mounts or fills the first ones, the logs record only
// the bootstrap, and nobody reads manuals and translations in a worker.
var workerEmptied = []string{
	"dev", "proc", "sys", "run", "tmp", "var/tmp", "var/log",
	"usr/share/man", "usr/share/info", "usr/share/locale",
}

// workerDropped are files of the bootstrapped system that describe the
// machine that built it, or only its build.
var workerDropped = []string{
	"etc/hostname", "etc/resolv.conf", "etc/machine-id", "var/lib/dbus/machine-id",
	"var/cache/ldconfig/aux-cache",
}

// workerSkip is the skip rule of the worker's base (see [treeRules]): it
// drops workerDropped, the contents of workerEmptied, the backups dpkg and
// debconf keep (*-old), and documentation except copyright files.
func workerSkip(rel string, mode fs.FileMode) bool {
	if slices.Contains(workerDropped, rel) {
		return true
	}
	dir := path.Dir(rel)
	for _, d := range workerEmptied {
		if dir == d || strings.HasPrefix(dir, d+"/") {
			return true
		}
	}
	if (dir == "var/lib/dpkg" || dir == "var/cache/debconf") && strings.HasSuffix(rel, "-old") {
		return true
	}
	if strings.HasPrefix(rel, "usr/share/doc/") {
		return mode.IsRegular() && path.Base(rel) != "copyright"
	}
	return false
}
