// Package cachedir keeps build artifacts (kernels, initramfs images, root
// filesystems) in a versioned directory, built once per content key.
//
// Several processes (parallel test packages, a server and a CLI) may ask for
// the same artifact at once: a per-key file lock makes one of them build it
// while the others wait, and an artifact becomes visible only by an atomic
// rename once it is complete, so a crash mid-build leaves nothing that looks
// finished.
package cachedir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Layout is the version of the on-disk layout; bump it when the meaning of a
// key changes so old entries are simply ignored.
const Layout = "v1"

// Dir is a cache root. The zero value is not usable; use Open.
type Dir struct {
	root string // <base>/<Layout>
}

// Open returns the cache under base (created if missing), e.g.
// ~/.cache/space. Entries live under base/v1.
func Open(base string) (*Dir, error) {
	if base == "" {
		return nil, errors.New("cache directory not set")
	}
	root := filepath.Join(base, Layout)
	for _, sub := range []string{"locks", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
			return nil, fmt.Errorf("open cache: %w", err)
		}
	}
	return &Dir{root: root}, nil
}

// Root returns the versioned root directory.
func (d *Dir) Root() string { return d.root }

// Path returns where the entry kind/key lives, whether or not it exists.
func (d *Dir) Path(kind, key string) string { return filepath.Join(d.root, kind, key) }

// Ensure returns the path of entry kind/key, calling build to make it first if
// it does not exist. build receives a scratch path (in the same filesystem) to
// write a file or directory at; on success it is renamed into place. Concurrent
// callers for the same entry, in any process, wait for one build.
func (d *Dir) Ensure(ctx context.Context, kind, key string, build func(ctx context.Context, tmp string) error) (string, error) {
	if err := checkName(kind); err != nil {
		return "", err
	}
	if err := checkName(key); err != nil {
		return "", err
	}
	final := d.Path(kind, key)
	if _, err := os.Lstat(final); err == nil {
		return final, nil
	}
	unlock, err := d.lock(ctx, kind+"-"+key)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Lstat(final); err == nil {
		return final, nil // built by another process while we waited
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", fmt.Errorf("cache %s/%s: %w", kind, key, err)
	}
	scratch, err := os.MkdirTemp(filepath.Join(d.root, "tmp"), kind+"-")
	if err != nil {
		return "", fmt.Errorf("cache %s/%s: %w", kind, key, err)
	}
	defer os.RemoveAll(scratch)
	tmp := filepath.Join(scratch, "out")
	if err := build(ctx, tmp); err != nil {
		return "", fmt.Errorf("build %s %s: %w", kind, key, err)
	}
	if err := syncPath(tmp); err != nil {
		return "", fmt.Errorf("cache %s/%s: %w", kind, key, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("cache %s/%s: %w", kind, key, err)
	}
	return final, nil
}

// Lock takes the named lock of this cache, waiting until ctx ends. Tests use it
// to share scarce resources (such as VM slots) across processes.
func (d *Dir) lock(ctx context.Context, name string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(d.root, "locks", name), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TryLock takes the named lock if it is free and reports whether it did.
func (d *Dir) TryLock(name string) (unlock func(), ok bool, err error) {
	if err := checkName(name); err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(filepath.Join(d.root, "locks", name), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", name, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", name, err)
	}
	return func() { f.Close() }, true, nil
}

// Lock takes the named lock, waiting until it is free or ctx ends.
func (d *Dir) Lock(ctx context.Context, name string) (unlock func(), err error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	return d.lock(ctx, name)
}

func checkName(s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("invalid cache name %q", s)
	}
	return nil
}

// syncPath flushes a built file (or every file under a built directory) so a
// crash after the rename cannot leave a complete-looking but empty entry.
func syncPath(p string) error {
	return filepath.WalkDir(p, func(path string, de os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !de.Type().IsRegular() && !de.IsDir() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

// DefaultBase is the cache base the programs and tests share when none is
// given: SPACE_CACHE_DIR (read with getenv, or os.Getenv when nil), else
// the user's cache directory plus "space"; "" when neither is known.
func DefaultBase(getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	if d := getenv("SPACE_CACHE_DIR"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "space")
	}
	return ""
}
