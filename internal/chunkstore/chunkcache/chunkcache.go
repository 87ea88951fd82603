// Package chunkcache keeps a bounded local copy of the chunks a remote
// chunkstore.Backend served, so a host that restores a snapshot
// downloads only the chunks it has not fetched before.
//
// A Backend wraps a remote one. Get of a chunk object ("chunks/..." keys:
// content-addressed, so never changed once written) is served from the
// cache directory when it holds the object, and otherwise fetched from
// the remote and kept. Everything else (manifests, leases, GC markers,
// Stat, List) goes to the remote unchanged: a cached chunk never makes a
// Put think the remote has a chunk it lost, and a chunk GC deleted from
// the remote is still the right content here (Restore checks every
// chunk's digest). Put and Delete of a chunk key drop the cached copy.
// Chunk keys are named in a dedup domain (see chunkstore), so a chunk one
// team's restore fetched never makes another team's restore faster
// (the unkeyed chunks of snapshots from before domains aside).
//
// The cache holds at most Config.MaxBytes of objects, evicting the least
// recently used. A cached object is a file at the key's path holding the
// object and its BLAKE3 digest, written to a temporary file and renamed
// into place but not synced: a copy is only a copy, and one a crash left
// torn fails its digest on the next Get, which then drops it and fetches
// the object again (syncing each file made a cold restore 2.4 times
// slower). The next New counts what is there, oldest first by
// modification time.
//
// Lock order: Backend.mu is a leaf; it is never held across I/O.
package chunkcache

import (
	"bytes"
	"container/list"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"space/internal/chunkstore"
	"space/internal/errkind"
)

var _ chunkstore.Backend = (*Backend)(nil)

// chunksPrefix starts the keys of chunk objects (see chunkstore.ChunkKey).
const chunksPrefix = "chunks/"

// tmpDir holds files being written; CheckKey never allows a leading '.'.
const tmpDir = ".tmp"

// staleTemp is the age after which New removes a temporary file: older
// than any write, so left by a crash.
const staleTemp = time.Hour

// sumLen is the length of the digest that ends each cached file.
const sumLen = 32

// maxObject is the largest object kept: a chunk of chunkstore.MaxChunkSize
// and some room for a zstd frame that did not shrink. Larger objects pass
// through uncached.
const maxObject = chunkstore.MaxChunkSize + 64<<10

// Config configures a Backend.
type Config struct {
	// Remote is the backend the cache fronts. Required.
	Remote chunkstore.Backend
	// Dir holds the cached objects; created if needed. Required. It is
	// this host's own: two processes must not share it (each keeps its
	// own count of what it holds).
	Dir string
	// MaxBytes bounds the cached objects' total size. Required (> 0).
	MaxBytes int64
	// Log receives cache write failures (the read still succeeds); nil =
	// discard.
	Log *slog.Logger
}

// Backend is a chunkstore.Backend that caches chunk reads of a remote
// one. It is safe for concurrent use.
type Backend struct {
	remote chunkstore.Backend
	dir    string
	max    int64
	log    *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	lru *list.List // of *entry, most recently used first
	// +checklocks:mu
	byKey map[string]*list.Element
	// +checklocks:mu
	total int64 // sum of the entries' sizes
}

type entry struct {
	key  string
	size int64
}

// New returns a cache in cfg.Dir in front of cfg.Remote, counting (and
// trimming to cfg.MaxBytes) what an earlier process left in the
// directory.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Remote == nil || cfg.Dir == "" || cfg.MaxBytes <= 0 {
		return nil, fmt.Errorf("chunk cache: remote, directory and a positive size are required: %w", errkind.InvalidArgument)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	b := &Backend{remote: cfg.Remote, dir: cfg.Dir, max: cfg.MaxBytes, log: cfg.Log, lru: list.New(), byKey: map[string]*list.Element{}}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	if err := b.removeStaleTemps(); err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	type file struct {
		key     string
		size    int64
		modTime time.Time
	}
	var found []file
	root := filepath.Join(cfg.Dir, filepath.FromSlash(chunksPrefix))
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == root {
			return fs.SkipDir
		}
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(cfg.Dir, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if chunkstore.CheckKey(key) != nil || fi.Size() < sumLen {
			return os.Remove(p) // not a file this package writes
		}
		found = append(found, file{key, fi.Size() - sumLen, fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	// Oldest first, each pushed in front: the oldest end up last, evicted first.
	slices.SortFunc(found, func(x, y file) int { return x.modTime.Compare(y.modTime) })
	b.mu.Lock()
	for _, f := range found {
		b.byKey[f.key] = b.lru.PushFront(&entry{key: f.key, size: f.size})
		b.total += f.size
	}
	evict := b.overflowLocked()
	b.mu.Unlock()
	if err := b.deleteFiles(evict); err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	return b, nil
}

// removeStaleTemps removes temporary files a crash left.
func (b *Backend) removeStaleTemps() error {
	left, err := os.ReadDir(filepath.Join(b.dir, tmpDir))
	if err != nil {
		return err
	}
	for _, e := range left {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTemp {
			if err := os.Remove(filepath.Join(b.dir, tmpDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

func (b *Backend) path(key string) string {
	return filepath.Join(b.dir, filepath.FromSlash(key))
}

// read returns key's cached object, or ok false when there is none or it
// is torn (then it is dropped).
func (b *Backend) read(key string) (data []byte, ok bool) {
	f, err := os.ReadFile(b.path(key))
	if err != nil {
		return nil, false
	}
	if len(f) >= sumLen {
		data, sum := f[:len(f)-sumLen], blake3.Sum256(f[:len(f)-sumLen])
		if subtle.ConstantTimeCompare(sum[:], f[len(f)-sumLen:]) == 1 {
			return data, true
		}
	}
	b.log.Warn("chunk cache: dropping a damaged copy", "key", key)
	b.forget(key)
	os.Remove(b.path(key))
	return nil, false
}

// write stores data and its digest as key's cached file.
func (b *Backend) write(key string, data []byte) (err error) {
	tmp, err := os.CreateTemp(filepath.Join(b.dir, tmpDir), "put-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	sum := blake3.Sum256(data)
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if _, err := tmp.Write(sum[:]); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	p := b.path(key)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// Size returns the cached objects' total size.
func (b *Backend) Size() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// Get implements chunkstore.ObjectReader. A chunk object comes from the
// cache when it is there, else from the remote (and is then kept).
func (b *Backend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if !strings.HasPrefix(key, chunksPrefix) {
		return b.remote.Get(ctx, key)
	}
	if err := chunkstore.CheckKey(key); err != nil {
		return nil, err
	}
	if data, ok := b.read(key); ok {
		b.touch(key)
		return io.NopCloser(bytes.NewReader(data)), nil
	}
	rc, err := b.remote.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(rc, maxObject+1))
	if err != nil {
		rc.Close()
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if len(data) > maxObject {
		// Not a chunk this store writes: hand it over as it is.
		return struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(data), rc), rc}, nil
	}
	if err := rc.Close(); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	b.keep(key, data)
	return io.NopCloser(bytes.NewReader(data)), nil
}

// keep stores data as key's cached copy, evicting what no longer fits. A
// failure costs only the copy: it is logged, not returned.
func (b *Backend) keep(key string, data []byte) {
	size := int64(len(data))
	if size > b.max {
		return
	}
	if err := b.write(key, data); err != nil {
		b.log.Warn("chunk cache write", "key", key, "err", err)
		return
	}
	b.mu.Lock()
	if el, ok := b.byKey[key]; ok { // another Get kept it meanwhile
		b.total -= el.Value.(*entry).size
		b.lru.Remove(el)
	}
	b.byKey[key] = b.lru.PushFront(&entry{key: key, size: size})
	b.total += size
	evict := b.overflowLocked()
	b.mu.Unlock()
	if err := b.deleteFiles(evict); err != nil {
		b.log.Warn("chunk cache eviction", "err", err)
	}
}

// overflowLocked takes the least recently used entries out of the index
// until the rest fit in max, and returns their keys for deleteFiles.
//
// +checklocks:b.mu
func (b *Backend) overflowLocked() []string {
	var keys []string
	for b.total > b.max {
		el := b.lru.Back()
		e := el.Value.(*entry)
		b.lru.Remove(el)
		delete(b.byKey, e.key)
		b.total -= e.size
		keys = append(keys, e.key)
	}
	return keys
}

func (b *Backend) deleteFiles(keys []string) error {
	var errs []error
	for _, k := range keys {
		if err := os.Remove(b.path(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// touch marks key as just used.
func (b *Backend) touch(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el, ok := b.byKey[key]; ok {
		b.lru.MoveToFront(el)
	}
}

// forget takes key out of the index.
func (b *Backend) forget(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el, ok := b.byKey[key]; ok {
		b.total -= el.Value.(*entry).size
		b.lru.Remove(el)
		delete(b.byKey, key)
	}
}

// drop removes key's cached copy, if any.
func (b *Backend) drop(key string) error {
	if !strings.HasPrefix(key, chunksPrefix) || chunkstore.CheckKey(key) != nil {
		return nil // the remote reports a bad key
	}
	b.forget(key)
	return b.deleteFiles([]string{key})
}

// Stat implements chunkstore.ObjectReader; it asks the remote.
func (b *Backend) Stat(ctx context.Context, key string) (chunkstore.ObjectInfo, error) {
	return b.remote.Stat(ctx, key)
}

// List implements chunkstore.ObjectLister; it lists the remote.
func (b *Backend) List(ctx context.Context, prefix string, fn func(chunkstore.ObjectInfo) error) error {
	return b.remote.List(ctx, prefix, fn)
}

// Put implements chunkstore.ObjectWriter: it writes to the remote and
// drops a cached copy of key.
func (b *Backend) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := b.drop(key); err != nil {
		return fmt.Errorf("put %s: drop cached copy: %w", key, err)
	}
	return b.remote.Put(ctx, key, r, size)
}

// Delete implements chunkstore.ObjectWriter: it deletes from the remote
// and the cache.
func (b *Backend) Delete(ctx context.Context, key string) error {
	if err := b.remote.Delete(ctx, key); err != nil {
		return err
	}
	return b.drop(key)
}
