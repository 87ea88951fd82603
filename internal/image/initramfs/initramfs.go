// Package initramfs builds the guest's initramfs: the space-agent as /init,
// the kernel modules it loads at boot, and the few nodes early boot needs.
//
// The archive holds:
//
//	/dev /proc /sys /run /tmp /mnt        empty directories (mount points)
//	/dev/console                          char device 5,1 (else early output is lost)
//	/init                                 the agent binary
//	/lib/modules/<version>/<name>.ko      each module, uncompressed
//	/lib/modules/<version>/load.order     module file names in load order, one a line
//
// The agent loads the modules listed in load.order with finit_module, in
// that order: dependencies come before the modules that need them.
package initramfs

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/image/initramfs/cpio"
	"space/internal/image/kernel"
)

// cacheKind is the cachedir kind of initramfs entries (single files).
const cacheKind = "initramfs"

// format is mixed into cache keys; change it when the archive layout changes.
const format = "space-initramfs-v1"

// LoadOrderFile is the name of the module list in /lib/modules/<version>.
const LoadOrderFile = "load.order"

// Spec describes an initramfs.
type Spec struct {
	Agent   string         // path of the static space-agent binary; becomes /init
	Kernel  *kernel.Kernel // kernel whose modules to include; required
	Modules []string       // modules to load at boot, dependencies added; nil means DefaultModules
}

func (s Spec) modules() []string {
	if s.Modules == nil {
		return DefaultModules
	}
	return s.Modules
}

// Write writes the initramfs of spec to w as a newc cpio archive
// (uncompressed). The same inputs give the same bytes. Unknown modules yield
// [errkind.NotFound].
func Write(ctx context.Context, spec Spec, w io.Writer) error {
	agent, err := os.ReadFile(spec.Agent)
	if err != nil {
		return fmt.Errorf("write initramfs: agent: %w", err)
	}
	return write(ctx, spec, agent, w)
}

// Build writes the initramfs of spec into cache, once per content (agent
// bytes, kernel package digest and module list), and returns its path. The
// file is shared and must not be modified.
func Build(ctx context.Context, cache *cachedir.Dir, spec Spec) (string, error) {
	if spec.Kernel == nil {
		return "", fmt.Errorf("build initramfs: no kernel: %w", errkind.InvalidArgument)
	}
	agent, err := os.ReadFile(spec.Agent)
	if err != nil {
		return "", fmt.Errorf("build initramfs: agent: %w", err)
	}
	agentSum := sha256.Sum256(agent)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%x\x00%s\x00%s", format, agentSum, spec.Kernel.SHA256, strings.Join(spec.modules(), ","))
	key := hex.EncodeToString(h.Sum(nil))
	p, err := cache.Ensure(ctx, cacheKind, key, func(ctx context.Context, tmp string) error {
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		bw := bufio.NewWriterSize(f, 1<<20)
		err = write(ctx, spec, agent, bw)
		if err == nil {
			err = bw.Flush()
		}
		return errors.Join(err, f.Close())
	})
	if err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	return p, nil
}

func write(ctx context.Context, spec Spec, agent []byte, w io.Writer) error {
	if spec.Kernel == nil || spec.Kernel.Version == "" {
		return fmt.Errorf("write initramfs: no kernel: %w", errkind.InvalidArgument)
	}
	mods, err := LoadOrder(spec.Kernel.ModulesDir, spec.modules())
	if err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	modDir := path.Join("lib/modules", spec.Kernel.Version)
	dir := func(name string, perm fs.FileMode) cpio.Entry {
		return cpio.Entry{Name: name, Mode: fs.ModeDir | perm}
	}
	entries := []cpio.Entry{
		dir("dev", 0o755), dir("proc", 0o555), dir("sys", 0o555), dir("run", 0o755),
		dir("tmp", fs.ModeSticky|0o777), dir("mnt", 0o755),
		dir("lib", 0o755), dir("lib/modules", 0o755), dir(modDir, 0o755),
		{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, Major: 5, Minor: 1},
		{Name: "init", Mode: 0o755, Data: agent},
	}
	var order strings.Builder
	for _, m := range mods {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		obj, err := readModule(m.Path)
		if err != nil {
			return fmt.Errorf("write initramfs: module %s: %w", m.Name, err)
		}
		entries = append(entries, cpio.Entry{Name: path.Join(modDir, m.Name+".ko"), Mode: 0o644, Data: obj})
		order.WriteString(m.Name + ".ko\n")
	}
	entries = append(entries, cpio.Entry{Name: path.Join(modDir, LoadOrderFile), Mode: 0o644, Data: []byte(order.String())})

	// Sorted names put every directory before its contents.
	slices.SortFunc(entries, func(a, b cpio.Entry) int { return strings.Compare(a.Name, b.Name) })
	cw := cpio.NewWriter(w)
	for _, e := range entries {
		if err := cw.Add(e); err != nil {
			return fmt.Errorf("write initramfs: %w", err)
		}
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	return nil
}
