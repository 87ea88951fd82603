package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"space/internal/cachedir"
)

// formatVersion changes whenever the way Default builds its image changes,
// so that images built the old way are no longer found.
const formatVersion = 2

// CacheKind is the [cachedir.Dir] kind of the images Default builds.
const CacheKind = "rootfs"

// DefaultLabel is the ext4 label of the default template's image.
const DefaultLabel = "space-root"

// Default returns the path of the default template's root file system image
// in cache, building it on first use: debootstrap's minbase of the host's
// suite from the host's mirror, plus [DefaultPackages], as ext4. An image is
// kept per suite, variant, package list and mirror; concurrent callers, in
// any process, wait for one build, which takes minutes and is logged to log
// (or nil). Errors are those of [Debootstrap] and [MakeExt4].
func Default(ctx context.Context, cache *cachedir.Dir, log *slog.Logger) (string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := BootstrapConfig{Packages: DefaultPackages}.withDefaults()
	if err != nil {
		return "", fmt.Errorf("default rootfs: %w", err)
	}
	key, err := defaultKey(cfg)
	if err != nil {
		return "", fmt.Errorf("default rootfs: %w", err)
	}
	dir, err := cache.Ensure(ctx, CacheKind, key, func(ctx context.Context, tmp string) error {
		return buildDefault(ctx, cfg, tmp, log.With("key", key))
	})
	if err != nil {
		return "", fmt.Errorf("default rootfs: %w", err)
	}
	return filepath.Join(dir, imageName), nil
}

// imageName is the image's name inside its cache entry, a directory that
// holds the bootstrap tree while it is built.
const imageName = "rootfs.ext4"

func defaultKey(cfg BootstrapConfig) (string, error) {
	pkgs := slices.Sorted(slices.Values(cfg.Packages))
	b, err := json.Marshal(struct {
		Format   int
		Suite    string
		Variant  string
		Mirror   string
		Packages []string
	}{formatVersion, cfg.Suite, cfg.Variant, cfg.Mirror, pkgs})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return cfg.Suite + "-" + cfg.Variant + "-" + hex.EncodeToString(sum[:8]), nil
}

func buildDefault(ctx context.Context, cfg BootstrapConfig, tmp string, log *slog.Logger) error {
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	cfg.Dir = filepath.Join(tmp, "tree")
	log.Info("debootstrap started", "suite", cfg.Suite, "mirror", cfg.Mirror, "packages", cfg.Packages)
	start := time.Now()
	if err := Debootstrap(ctx, cfg); err != nil {
		return err
	}
	log.Info("debootstrap done", "duration", time.Since(start).Round(time.Second))
	if err := addDefaultUser(ctx, cfg.Dir); err != nil {
		return err
	}
	start = time.Now()
	if err := MakeExt4(ctx, cfg.Dir, filepath.Join(tmp, imageName), Ext4Options{Label: DefaultLabel}); err != nil {
		return err
	}
	log.Info("ext4 image done", "duration", time.Since(start).Round(time.Millisecond))
	return os.RemoveAll(cfg.Dir)
}

// DefaultUser is the unprivileged user of the default template: uid 1000,
// home /home/user, bash, and sudo without a password (as in E2B's base
// image). Commands run as root unless they name a user.
const DefaultUser = "user"

// addDefaultUser adds DefaultUser to the tree at root.
func addDefaultUser(ctx context.Context, root string) error {
	if _, err := run(ctx, "chroot", root, "useradd", "--create-home", "--shell", "/bin/bash",
		"--uid", "1000", "--user-group", "--groups", "sudo", DefaultUser); err != nil {
		return fmt.Errorf("add the default user: %w", err)
	}
	rule := DefaultUser + " ALL=(ALL:ALL) NOPASSWD: ALL\n"
	if err := os.WriteFile(filepath.Join(root, "etc/sudoers.d", DefaultUser), []byte(rule), 0o440); err != nil {
		return fmt.Errorf("add the default user: %w", err)
	}
	return nil
}
