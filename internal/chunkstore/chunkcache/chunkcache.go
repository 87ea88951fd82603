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
//
// The cache holds at most Config.MaxBytes of objects, evicting the least
// recently used. Its files are written through chunkstore/local (atomic,
// synced), so a crash leaves whole objects or none; the next New counts
// what is there, oldest first by modification time.
//
// Lock order: Backend.mu is a leaf; it is never held across I/O.
package chunkcache

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"space/internal/chunkstore"
	"space/internal/chunkstore/local"
	"space/internal/errkind"
)

var _ chunkstore.Backend = (*Backend)(nil)

// chunksPrefix starts the keys of chunk objects (see chunkstore.ChunkKey).
const chunksPrefix = "chunks/"

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
	disk   *local.Backend
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
	disk, err := local.New(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("chunk cache: %w", err)
	}
	b := &Backend{remote: cfg.Remote, disk: disk, max: cfg.MaxBytes, log: cfg.Log, lru: list.New(), byKey: map[string]*list.Element{}}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	var found []chunkstore.ObjectInfo
	if err := disk.List(ctx, chunksPrefix, func(o chunkstore.ObjectInfo) error {
		found = append(found, o)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("chunk cache %s: %w", cfg.Dir, err)
	}
	// Oldest first, each pushed in front: the oldest end up last, evicted first.
	slices.SortFunc(found, func(x, y chunkstore.ObjectInfo) int { return x.ModTime.Compare(y.ModTime) })
	b.mu.Lock()
	for _, o := range found {
		b.byKey[o.Key] = b.lru.PushFront(&entry{key: o.Key, size: o.Size})
		b.total += o.Size
	}
	evict := b.overflowLocked()
	b.mu.Unlock()
	if err := b.deleteFiles(ctx, evict); err != nil {
		return nil, fmt.Errorf("chunk cache %s: %w", cfg.Dir, err)
	}
	return b, nil
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
	if rc, err := b.disk.Get(ctx, key); err == nil {
		b.touch(key)
		return rc, nil
	} else if !errors.Is(err, errkind.NotFound) {
		return nil, err
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
	b.keep(ctx, key, data)
	return io.NopCloser(bytes.NewReader(data)), nil
}

// keep stores data as key's cached copy, evicting what no longer fits. A
// failure costs only the copy: it is logged, not returned.
func (b *Backend) keep(ctx context.Context, key string, data []byte) {
	size := int64(len(data))
	if size > b.max {
		return
	}
	if err := b.disk.Put(ctx, key, bytes.NewReader(data), size); err != nil {
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
	if err := b.deleteFiles(ctx, evict); err != nil {
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

func (b *Backend) deleteFiles(ctx context.Context, keys []string) error {
	var errs []error
	for _, k := range keys {
		if err := b.disk.Delete(ctx, k); err != nil {
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

// drop removes key's cached copy, if any.
func (b *Backend) drop(ctx context.Context, key string) error {
	if !strings.HasPrefix(key, chunksPrefix) {
		return nil
	}
	b.mu.Lock()
	if el, ok := b.byKey[key]; ok {
		b.total -= el.Value.(*entry).size
		b.lru.Remove(el)
		delete(b.byKey, key)
	}
	b.mu.Unlock()
	return b.disk.Delete(ctx, key)
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
	if err := b.drop(ctx, key); err != nil {
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
	return b.drop(ctx, key)
}
