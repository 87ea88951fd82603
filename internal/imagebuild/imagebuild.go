// Package imagebuild builds the guest images a sandbox boots from: the
// kernel, the initramfs holding the agent, and the default root file system.
package imagebuild

import (
	"context"
	"debug/elf"
	"fmt"
	"log/slog"

	"golang.org/x/sync/errgroup"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/image/initramfs"
	"space/internal/image/kernel"
	"space/internal/image/rootfs"
)

// Config says where the images go and which agent they carry.
type Config struct {
	Cache     *cachedir.Dir // required
	AgentPath string        // the static space-agent binary; required
	// Kernel is the guests' kernel; nil = the current candidate of the
	// apt index, fetched into the cache (kernel.Fetch).
	Kernel *kernel.Kernel
	Log    *slog.Logger // or nil to log nothing
}

// Artifacts are the built images. They live in the cache and are shared:
// callers must not modify them.
type Artifacts struct {
	Kernel    *kernel.Kernel
	Initramfs string // path of the initramfs (newc cpio, agent as /init)
	Rootfs    string // path of the default template's read-only ext4 image
}

// Build returns the guest images, building what the cache lacks: it fetches
// the Debian cloud kernel, writes the initramfs with cfg.AgentPath as /init
// and bootstraps the default root file system. The kernel and initramfs are
// built while the root file system is; a cold cache takes minutes (mostly
// debootstrap, which needs root), a warm one well under a second, and the
// kernel check needs the local apt index (no network when cached).
//
// Errors keep the kinds of the image packages: [errkind.InvalidArgument] for
// a bad cfg, [errkind.FailedPrecondition] for a missing host tool or
// privilege, [errkind.NotFound] for an unknown kernel package.
func Build(ctx context.Context, cfg Config) (*Artifacts, error) {
	if cfg.Cache == nil {
		return nil, fmt.Errorf("build images: no cache: %w", errkind.InvalidArgument)
	}
	if cfg.AgentPath == "" {
		return nil, fmt.Errorf("build images: no agent binary: %w", errkind.InvalidArgument)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if why := notStatic(cfg.AgentPath); why != "" {
		log.WarnContext(ctx, "agent binary cannot run as the guest's init", "path", cfg.AgentPath, "reason", why)
	}

	var art Artifacts
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		k := cfg.Kernel
		if k == nil {
			var err error
			if k, err = kernel.Fetch(gctx, kernel.Config{Cache: cfg.Cache, Log: log}); err != nil {
				return err
			}
		}
		log.InfoContext(gctx, "kernel ready", "version", k.Version, "package_version", k.PackageVersion)
		p, err := initramfs.Build(gctx, cfg.Cache, initramfs.Spec{Agent: cfg.AgentPath, Kernel: k})
		if err != nil {
			return err
		}
		log.InfoContext(gctx, "initramfs ready", "path", p)
		art.Kernel, art.Initramfs = k, p
		return nil
	})
	g.Go(func() error {
		p, err := rootfs.Default(gctx, cfg.Cache, log)
		if err != nil {
			return err
		}
		log.InfoContext(gctx, "rootfs ready", "path", p)
		art.Rootfs = p
		return nil
	})
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	return &art, nil
}

// notStatic says why the file at path is not a static executable the guest
// kernel can run as init, or returns "" when it is one.
func notStatic(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Sprintf("not an ELF executable: %v", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Sprintf("built for %v, not x86-64", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "dynamically linked (build it with CGO_ENABLED=0)"
		}
	}
	return ""
}
