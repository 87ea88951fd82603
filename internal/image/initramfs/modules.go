package initramfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ulikunitz/xz"

	"space/internal/errkind"
)

// DefaultModules are the modules a guest needs: virtio transports (PCI and
// MMIO), block, console, network and entropy devices, vsock and overlayfs,
// and ext4. Modules the kernel has built in are skipped, and dependencies
// are added, so the list need not be complete or ordered. Callers must not
// modify it.
var DefaultModules = []string{
	"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
	"virtio_mmio", "virtio_blk", "virtio_console", "failover", "net_failover", "virtio_net",
	"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport",
	"overlay", "virtio_rng", "virtio_balloon", "ext4",
}

// Module is a loadable kernel module file.
type Module struct {
	Name string // module name, e.g. "virtio_rng" (file names use "-" or "_")
	Path string // file under the modules tree, possibly compressed (.ko.xz, .ko.gz)
}

// LoadOrder returns the modules named by names together with the modules
// they depend on (the depends= field of each module's .modinfo), in an order
// in which they can be loaded: dependencies first. dir is a
// lib/modules/<version> tree. Modules built into the kernel (listed in
// dir/modules.builtin) are left out. Names that are neither files in the
// tree nor built in yield one [errkind.NotFound] error that lists them all.
func LoadOrder(dir string, names []string) ([]Module, error) {
	t, err := scanTree(dir)
	if err != nil {
		return nil, fmt.Errorf("kernel modules: %w", err)
	}
	order, err := resolve(names, t.kind, t.depends)
	if err != nil {
		return nil, fmt.Errorf("kernel modules in %s: %w", dir, err)
	}
	mods := make([]Module, len(order))
	for i, name := range order {
		mods[i] = Module{Name: name, Path: t.files[name]}
	}
	return mods, nil
}

// moduleKind says what a module name refers to in a kernel.
type moduleKind int

const (
	unknown  moduleKind = iota
	loadable            // a .ko file in the tree
	builtin             // compiled into the kernel image
)

// resolve returns names and their dependencies, each once, in load order.
// Dependencies are visited depth-first in the order listed, so the result
// keeps the order of names where dependencies allow it.
func resolve(names []string, kind func(string) moduleKind, depends func(string) ([]string, error)) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var (
		order   []string
		missing []string
		visit   func(name string, path []string) error
	)
	visit = func(name string, path []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("dependency cycle %s: %w", strings.Join(append(path, name), " -> "), errkind.InvalidArgument)
		}
		switch kind(name) {
		case builtin:
			state[name] = done
			return nil
		case unknown:
			state[name] = done
			missing = append(missing, name)
			return nil
		}
		state[name] = visiting
		deps, err := depends(name)
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		path = append(path[:len(path):len(path)], name)
		for _, d := range deps {
			if err := visit(normalize(d), path); err != nil {
				return err
			}
		}
		state[name] = done
		order = append(order, name)
		return nil
	}
	for _, n := range names {
		if err := visit(normalize(n), nil); err != nil {
			return nil, err
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("unknown modules (neither built in nor in the tree): %s: %w", strings.Join(missing, ", "), errkind.NotFound)
	}
	return order, nil
}

// normalize returns the canonical module name: the kernel treats "-" and
// "_" in module names alike.
func normalize(name string) string { return strings.ReplaceAll(name, "-", "_") }

// moduleName returns the module name of a file name such as "virtio-rng.ko"
// or "ext4.ko.xz", or "" if it is not a module file.
func moduleName(file string) string {
	for _, ext := range []string{".ko", ".ko.xz", ".ko.gz", ".ko.zst"} {
		if base, ok := strings.CutSuffix(file, ext); ok {
			return normalize(base)
		}
	}
	return ""
}

// tree indexes a lib/modules/<version> directory.
type tree struct {
	files   map[string]string // module name -> file
	builtin map[string]bool
}

func scanTree(dir string) (*tree, error) {
	t := &tree{files: map[string]string{}, builtin: map[string]bool{}}
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name := moduleName(d.Name()); name != "" && d.Type().IsRegular() {
			if _, dup := t.files[name]; !dup { // WalkDir is lexical: first wins
				t.files[name] = p
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(dir, "modules.builtin"))
	if errors.Is(err, fs.ErrNotExist) {
		return t, nil // nothing built in, or an unusual tree
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name := moduleName(filepath.Base(strings.TrimSpace(sc.Text()))); name != "" {
			t.builtin[name] = true
		}
	}
	return t, sc.Err()
}

func (t *tree) kind(name string) moduleKind {
	switch {
	case t.files[name] != "":
		return loadable
	case t.builtin[name]:
		return builtin
	}
	return unknown
}

func (t *tree) depends(name string) ([]string, error) {
	b, err := readModule(t.files[name])
	if err != nil {
		return nil, err
	}
	return modinfoDepends(b)
}

// readModule returns the uncompressed ELF object of the module file p.
// zstd-compressed modules yield [errkind.InvalidArgument].
func readModule(p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var r io.Reader
	switch {
	case strings.HasSuffix(p, ".ko"):
		return b, nil
	case strings.HasSuffix(p, ".ko.gz"):
		r, err = gzip.NewReader(bytes.NewReader(b))
	case strings.HasSuffix(p, ".ko.xz"):
		r, err = xz.NewReader(bytes.NewReader(b))
	default:
		return nil, fmt.Errorf("%s: unsupported module compression (only .ko, .ko.gz, .ko.xz): %w", filepath.Base(p), errkind.InvalidArgument)
	}
	if err == nil {
		b, err = io.ReadAll(r)
	}
	if err != nil {
		return nil, fmt.Errorf("decompress %s: %w", filepath.Base(p), err)
	}
	return b, nil
}

// modinfoDepends returns the depends= list of the module object obj's
// .modinfo section. Soft dependencies (softdep=) are not followed: they
// often name aliases rather than modules.
func modinfoDepends(obj []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("module ELF: %v: %w", err, errkind.InvalidArgument)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module has no .modinfo section: %w", errkind.InvalidArgument)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo: %w", err)
	}
	for kv := range bytes.SplitSeq(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for d := range strings.SplitSeq(string(v), ",") {
				if d != "" {
					deps = append(deps, d)
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}
