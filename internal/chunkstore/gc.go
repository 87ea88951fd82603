package chunkstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"space/internal/errkind"
)

// gcBatch is how many chunks GC deletes between checks of its marker.
const gcBatch = 64

// GC deletes the chunks no manifest refers to and no live lease protects
// (every object of such a digest, raw or compressed), then the leases of
// writers that crashed and the markers of GC runs that did. It is safe to
// run while Puts (and other GC runs, in this process or others) are in
// progress: the package doc describes the protocol. A manifest that does
// not parse stops it with ErrCorrupt before it deletes anything, since its
// chunks cannot be told apart.
func (s *Store) GC(ctx context.Context) (stats GCStats, err error) {
	// Candidates first: a chunk stored after this listing is not one.
	var chunks []ObjectInfo
	err = s.b.List(ctx, chunksPrefix, func(o ObjectInfo) error {
		if _, ok := parseChunkKey(o.Key); ok {
			chunks = append(chunks, o)
		}
		return nil
	})
	if err != nil {
		return stats, fmt.Errorf("gc: list chunks: %w", err)
	}
	stats.ChunksScanned = len(chunks)
	for _, o := range chunks {
		stats.BytesScanned += o.Size
	}

	run := &gcRun{s: s, name: nonce()}
	if err := run.renew(ctx); err != nil {
		return stats, fmt.Errorf("gc: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := s.b.Delete(rctx, run.key); derr != nil {
			err = errors.Join(err, fmt.Errorf("gc: remove marker: %w", derr))
		}
	}()

	// Leases after the marker: a writer whose lease part this misses sees
	// the marker and waits for this run to end.
	live, expired, err := s.readLeases(ctx, &stats)
	if err != nil {
		return stats, fmt.Errorf("gc: %w", err)
	}
	// Manifests after leases: a writer removes its lease only after its
	// manifest landed.
	if err := s.readManifests(ctx, live, &stats); err != nil {
		return stats, fmt.Errorf("gc: %w", err)
	}

	var doomed []ObjectInfo
	cutoff := s.now().Add(-s.grace)
	for _, o := range chunks {
		d, _ := parseChunkKey(o.Key)
		if live[d] || (s.grace > 0 && o.ModTime.After(cutoff)) {
			continue
		}
		doomed = append(doomed, o)
	}
	for len(doomed) > 0 {
		n := min(gcBatch, len(doomed))
		batch := doomed[:n]
		doomed = doomed[n:]
		// Every delete must land while writers still honour the marker.
		if err := run.keepAlive(ctx); err != nil {
			return stats, fmt.Errorf("gc: %w", err)
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(s.concurrency)
		for _, o := range batch {
			g.Go(func() error { return s.b.Delete(gctx, o.Key) })
		}
		if err := g.Wait(); err != nil {
			return stats, fmt.Errorf("gc: delete chunk: %w", err)
		}
		for _, o := range batch {
			stats.ChunksDeleted++
			stats.BytesDeleted += o.Size
		}
	}

	// Leftovers of crashed writers and GC runs.
	now := s.now()
	err = s.b.List(ctx, gcPrefix, func(o ObjectInfo) error {
		if exp, ok := parseExpiry(o.Key); ok && o.Key != run.key && !now.Before(exp.Add(s.skew)) {
			expired = append(expired, o.Key)
		}
		return nil
	})
	if err != nil {
		return stats, fmt.Errorf("gc: list markers: %w", err)
	}
	for _, k := range expired {
		if err := s.b.Delete(ctx, k); err != nil {
			return stats, fmt.Errorf("gc: remove expired lease or marker: %w", err)
		}
	}
	return stats, nil
}

// readLeases returns the chunks live leases name and the part keys of
// expired leases.
func (s *Store) readLeases(ctx context.Context, stats *GCStats) (live map[Digest]bool, expired []string, err error) {
	type leaseParts struct {
		keys []string
		exp  time.Time // newest
	}
	leases := map[string]*leaseParts{}
	var dirs []string
	err = s.b.List(ctx, leasesPrefix, func(o ObjectInfo) error {
		dir, ok := leaseDir(o.Key)
		exp, ok2 := parseExpiry(o.Key)
		if !ok || !ok2 {
			return nil // not ours
		}
		lp := leases[dir]
		if lp == nil {
			lp = &leaseParts{}
			leases[dir] = lp
			dirs = append(dirs, dir)
		}
		lp.keys = append(lp.keys, o.Key)
		if exp.After(lp.exp) {
			lp.exp = exp
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list leases: %w", err)
	}
	now := s.now()
	live = map[Digest]bool{}
	for _, dir := range dirs {
		lp := leases[dir]
		if !now.Before(lp.exp.Add(s.skew)) {
			expired = append(expired, lp.keys...)
			stats.ExpiredLeases++
			continue
		}
		stats.LiveLeases++
		for _, k := range lp.keys {
			b, err := s.readSmall(ctx, k, maxManifestBytes)
			if errors.Is(err, errkind.NotFound) {
				continue // released: its manifest has landed
			}
			if err != nil {
				return nil, nil, fmt.Errorf("read lease: %w", err)
			}
			var part leasePart
			if err := json.Unmarshal(b, &part); err != nil {
				return nil, nil, fmt.Errorf("lease %s: %v: %w", k, err, ErrCorrupt)
			}
			for _, d := range part.Chunks {
				live[d] = true
			}
		}
	}
	return live, expired, nil
}

// readManifests adds every chunk a manifest refers to to live.
func (s *Store) readManifests(ctx context.Context, live map[Digest]bool, stats *GCStats) error {
	var ids []string
	err := s.b.List(ctx, manifestsPrefix, func(o ObjectInfo) error {
		id := strings.TrimPrefix(o.Key, manifestsPrefix)
		if CheckID(id) == nil {
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list manifests: %w", err)
	}
	for _, id := range ids {
		b, err := s.readSmall(ctx, ManifestKey(id), maxManifestBytes)
		if errors.Is(err, errkind.NotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return fmt.Errorf("read manifest %s: %w", id, err)
		}
		m, err := decodeManifest(id, b)
		if err != nil {
			return err
		}
		stats.Manifests++
		for _, f := range m.Files {
			for _, c := range f.Chunks {
				live[c.Digest] = true
			}
		}
	}
	return nil
}

// gcRun is one GC run's marker, "gc/<nonce>.<expiry unix ms>". Writers that
// see an unexpired marker wait before they rely on a chunk being stored.
type gcRun struct {
	s    *Store
	name string
	// Owned by the GC goroutine.
	key     string // current marker, or "" before the first
	expires time.Time
}

// renew writes a marker with a fresh expiry and removes the previous one.
// It fails if the previous one has expired: writers may have stopped
// waiting for this run.
func (r *gcRun) renew(ctx context.Context) error {
	now := r.s.now()
	if r.key != "" && !now.Before(r.expires) {
		return fmt.Errorf("gc marker expired at %v (run stalled): %w", r.expires, errkind.Unavailable)
	}
	exp := now.Add(r.s.leaseTTL)
	key := gcPrefix + expiringName(r.name, exp)
	if err := r.s.putBytes(ctx, key, nil); err != nil {
		return fmt.Errorf("write gc marker: %w", err)
	}
	old := r.key
	r.key, r.expires = key, exp
	if old != "" {
		if err := r.s.b.Delete(ctx, old); err != nil {
			return fmt.Errorf("remove old gc marker: %w", err)
		}
	}
	return nil
}

// keepAlive renews the marker once less than half its TTL remains.
func (r *gcRun) keepAlive(ctx context.Context) error {
	if r.s.now().Before(r.expires.Add(-r.s.leaseTTL / 2)) {
		return nil
	}
	return r.renew(ctx)
}

// parseChunkKey returns the digest named by a chunk key of either
// encoding: "chunks/<hh>/<hex>" or "chunks/<hh>/<hex>.zst". GC goes by
// digest: every object of a live digest is live.
func parseChunkKey(key string) (Digest, bool) {
	base, zst := strings.CutSuffix(path.Base(key), zstdSuffix)
	d, err := ParseDigest(base)
	if err != nil {
		return Digest{}, false
	}
	encoding := EncodingRaw
	if zst {
		encoding = EncodingZstd
	}
	if chunkObjectKey(d, encoding) != key {
		return Digest{}, false
	}
	return d, true
}
