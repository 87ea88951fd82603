// Package local is a chunkstore.Backend in a local directory.
//
// Each key is a file at the same relative path. Put writes a temporary
// file in the directory's .tmp subdirectory, fsyncs it, renames it into
// place and fsyncs the parent directory, so a crash leaves either the old
// object or the complete new one under a key, never part of one.
// Temporary files a crash leaves in .tmp are never listed; New removes
// those older than a day.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"space/internal/chunkstore"
	"space/internal/errkind"
)

const tmpDir = ".tmp" // CheckKey never allows a leading '.'

var _ chunkstore.Backend = (*Backend)(nil)

// Backend stores objects as files under a directory. Files are 0600 and
// directories 0700: snapshots hold guest memory.
type Backend struct {
	root string
}

// staleTemp is the age after which New removes a temporary file: older
// than any Put, so left by a crash.
const staleTemp = 24 * time.Hour

// New returns a Backend in dir, creating it if needed. Several Backends,
// in several processes, may share dir.
func New(dir string) (*Backend, error) {
	if dir == "" {
		return nil, fmt.Errorf("local chunk backend: directory not set: %w", errkind.InvalidArgument)
	}
	if err := os.MkdirAll(filepath.Join(dir, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("local chunk backend: %w", err)
	}
	left, err := os.ReadDir(filepath.Join(dir, tmpDir))
	if err != nil {
		return nil, fmt.Errorf("local chunk backend: %w", err)
	}
	for _, e := range left {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
			os.Remove(filepath.Join(dir, tmpDir, e.Name())) // best effort
		}
	}
	return &Backend{root: dir}, nil
}

func (b *Backend) path(key string) (string, error) {
	if err := chunkstore.CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(b.root, filepath.FromSlash(key)), nil
}

// Put implements chunkstore.ObjectWriter.
func (b *Backend) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("put %s: negative size: %w", key, errkind.InvalidArgument)
	}
	f, err := os.CreateTemp(filepath.Join(b.root, tmpDir), "put-")
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	n, err := io.Copy(f, io.LimitReader(ctxReader{ctx, r}, size+1))
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if n != size {
		return fmt.Errorf("put %s: reader gave %d bytes or more, want %d: %w", key, n, size, errkind.InvalidArgument)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	dir := filepath.Dir(p)
	// A concurrent Delete may remove an emptied parent directory between
	// MkdirAll and Rename; try again then.
	for range 5 {
		if err = os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		if err = os.Rename(f.Name(), p); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// Get implements chunkstore.ObjectReader.
func (b *Backend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("get %s: %w", key, errkind.NotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return f, nil
}

// Stat implements chunkstore.ObjectReader.
func (b *Backend) Stat(ctx context.Context, key string) (chunkstore.ObjectInfo, error) {
	p, err := b.path(key)
	if err != nil {
		return chunkstore.ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return chunkstore.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, errkind.NotFound)
	}
	if err != nil {
		return chunkstore.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		return chunkstore.ObjectInfo{}, fmt.Errorf("stat %s: a directory: %w", key, errkind.NotFound)
	}
	return chunkstore.ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// Delete implements chunkstore.ObjectWriter. It also removes the key's
// parent directories that it leaves empty, below the first level.
func (b *Backend) Delete(ctx context.Context, key string) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	for dir := path.Dir(key); strings.Contains(dir, "/"); dir = path.Dir(dir) {
		if os.Remove(filepath.Join(b.root, filepath.FromSlash(dir))) != nil {
			break // not empty (or gone): fine
		}
	}
	return nil
}

// List implements chunkstore.ObjectLister.
func (b *Backend) List(ctx context.Context, prefix string, fn func(chunkstore.ObjectInfo) error) error {
	// Walk the deepest directory prefix names, if it exists.
	start := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = prefix[:i]
		if err := chunkstore.CheckKey(start); err != nil {
			return err
		}
	}
	top := filepath.Join(b.root, filepath.FromSlash(start))
	err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(b.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if d.IsDir() {
			if key == tmpDir {
				return filepath.SkipDir
			}
			// Skip directories that cannot hold a key with the prefix.
			if key != "." && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(key, prefix) || chunkstore.CheckKey(key) != nil {
			return nil
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return fn(chunkstore.ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %q: %w", prefix, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ctxReader stops a copy once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
