package rootfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"space/internal/apt"
	"space/internal/errkind"
)

// DefaultPackages are installed into the default template's root file
// system on top of debootstrap's minbase: with DefaultUser, what E2B's
// base image offers to code (python3 and python, sudo, bash).
var DefaultPackages = []string{"python3", "python-is-python3", "ca-certificates", "curl", "git", "procps", "bash", "sudo"}

// BootstrapConfig says what [Debootstrap] installs where.
type BootstrapConfig struct {
	// Dir is the target directory; it must be empty or missing. Required.
	Dir string
	// Suite is the Debian suite or codename. Empty means the host's
	// codename ([apt.Codename]).
	Suite string
	// Mirror is the Debian archive URI. Empty means the host's ([apt.Mirror]).
	Mirror string
	// Packages are installed in addition to the variant's. Nil means none.
	Packages []string
	// Variant is debootstrap's variant. Empty means "minbase".
	Variant string
	// KeepLists keeps the package lists debootstrap fetched, so that apt
	// can look packages up in the new system (about 50 MB for Debian main).
	// False deletes them with the downloaded packages.
	KeepLists bool
	// Env is added to the environment of debootstrap and the package
	// scripts it runs (KEY=value), for example SOURCE_DATE_EPOCH. Nil adds
	// nothing.
	Env []string
}

// withDefaults fills in cfg's empty fields from the host.
func (cfg BootstrapConfig) withDefaults() (BootstrapConfig, error) {
	var err error
	if cfg.Suite == "" {
		if cfg.Suite, err = apt.Codename(); err != nil {
			return cfg, fmt.Errorf("default suite: %w", err)
		}
	}
	if cfg.Mirror == "" {
		if cfg.Mirror, err = apt.Mirror(); err != nil {
			return cfg, fmt.Errorf("default mirror: %w", err)
		}
	}
	if cfg.Variant == "" {
		cfg.Variant = "minbase"
	}
	return cfg, nil
}

// Debootstrap installs a Debian system into cfg.Dir with debootstrap, then
// deletes the downloaded packages and (unless cfg.KeepLists) apt's package
// lists, which only make the image bigger. It needs root; debootstrap runs in its own mount
// namespace, so the file systems it mounts inside cfg.Dir vanish with it even
// when it is killed.
//
// Errors wrap [errkind.FailedPrecondition] when debootstrap is missing (the
// message names the apt package) or the process is not root, and
// [errkind.InvalidArgument] for a bad cfg; a failed run's error ends with
// debootstrap's last output.
func Debootstrap(ctx context.Context, cfg BootstrapConfig) error {
	if cfg.Dir == "" {
		return fmt.Errorf("debootstrap: no target directory: %w", errkind.InvalidArgument)
	}
	for _, p := range cfg.Packages {
		if p == "" || strings.ContainsAny(p, ", \t\n") {
			return fmt.Errorf("debootstrap: bad package name %q: %w", p, errkind.InvalidArgument)
		}
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return fmt.Errorf("debootstrap: %w", err)
	}
	tool, err := lookTool("debootstrap", "debootstrap", sbinDirs...)
	if err != nil {
		return err
	}
	unshare, err := lookTool("unshare", "util-linux", "/usr/bin", "/bin")
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("debootstrap needs root: %w", errkind.FailedPrecondition)
	}
	args := []string{"--mount", "--propagation", "private", "--", tool,
		"--variant=" + cfg.Variant, "--components=main"}
	if len(cfg.Packages) > 0 {
		args = append(args, "--include="+strings.Join(cfg.Packages, ","))
	}
	args = append(args, cfg.Suite, cfg.Dir, cfg.Mirror)
	if _, err := runEnv(ctx, cfg.Env, unshare, args...); err != nil {
		return fmt.Errorf("debootstrap %s into %s: %w", cfg.Suite, cfg.Dir, err)
	}
	if err := shrink(cfg.Dir, cfg.KeepLists); err != nil {
		return fmt.Errorf("debootstrap %s into %s: %w", cfg.Suite, cfg.Dir, err)
	}
	return nil
}

// shrink removes downloaded packages and, unless keepLists, package lists
// from the system at root, which debootstrap just made.
func shrink(root string, keepLists bool) error {
	patterns := []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin"}
	if !keepLists {
		patterns = append(patterns, "var/lib/apt/lists/*")
	}
	for _, pattern := range patterns {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return nil
}
