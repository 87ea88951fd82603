package chunkstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A lease is a writer's promise, visible to GC, of the chunks it will
// reference. It is a set of part objects under one directory:
//
//	leases/<snapshot id>.<nonce>/<seq>.<expiry unix ms>
//
// each holding a leasePart. Every part renews the whole lease: GC treats
// the lease as live until the newest part's expiry plus the clock skew
// margin, and protects every chunk any of its parts names. Putting the
// expiry in the key lets GC and writers judge liveness from a List alone.
type lease struct {
	s   *Store
	id  string // snapshot being written
	dir string // "leases/<id>.<nonce>/"

	// Owned by the one Put goroutine that uses the lease.
	seq     int
	expires time.Time // newest part's expiry; zero before the first part
	parts   []string  // keys written, for release
}

// leasePart is a lease part object's content.
type leasePart struct {
	Snapshot string   `json:"snapshot"`
	Chunks   []Digest `json:"chunks"`
}

func (s *Store) newLease(id string) *lease {
	return &lease{s: s, id: id, dir: leasesPrefix + id + "." + nonce() + "/"}
}

// add writes a part naming chunks, renewing the lease. It returns
// ErrLeaseExpired if the lease ran out before this renewal: GC may then
// have collected chunks the writer relies on.
func (l *lease) add(ctx context.Context, chunks []Digest) error {
	now := l.s.now()
	if !l.expires.IsZero() && !now.Before(l.expires) {
		return fmt.Errorf("lease %s: expired at %v: %w", l.dir, l.expires, ErrLeaseExpired)
	}
	exp := now.Add(l.s.leaseTTL)
	b, err := json.Marshal(leasePart{Snapshot: l.id, Chunks: chunks})
	if err != nil {
		return err
	}
	key := l.dir + expiringName(strconv.Itoa(l.seq), exp)
	if err := l.s.putBytes(ctx, key, b); err != nil {
		return fmt.Errorf("write lease: %w", err)
	}
	l.seq++
	l.expires = exp
	l.parts = append(l.parts, key)
	return nil
}

// keepAlive renews the lease once less than half its TTL remains.
func (l *lease) keepAlive(ctx context.Context) error {
	if !l.expires.IsZero() && l.s.now().Before(l.expires.Add(-l.s.leaseTTL/2)) {
		return nil
	}
	return l.add(ctx, nil)
}

// release deletes the lease's parts.
func (l *lease) release(ctx context.Context) error {
	var errs []error
	for _, k := range l.parts {
		if err := l.s.b.Delete(ctx, k); err != nil {
			errs = append(errs, fmt.Errorf("release lease: %w", err))
		}
	}
	return errors.Join(errs...)
}

// expiringName is "<name>.<expiry unix ms>".
func expiringName(name string, exp time.Time) string {
	return name + "." + strconv.FormatInt(exp.UnixMilli(), 10)
}

// parseExpiry returns the expiry encoded in the last segment of key by
// expiringName.
func parseExpiry(key string) (time.Time, bool) {
	i := strings.LastIndexByte(key, '.')
	if i < 0 || strings.LastIndexByte(key, '/') > i {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(key[i+1:], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// leaseDir returns the "leases/<lease>/" directory of a lease part key.
func leaseDir(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, leasesPrefix)
	if !ok {
		return "", false
	}
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return "", false
	}
	return key[:len(leasesPrefix)+i+1], true
}

// waitForGC returns once no GC run is in progress, renewing l meanwhile.
// A writer calls it after its lease names a chunk and before it decides
// whether that chunk is stored (see the package doc for why).
func (s *Store) waitForGC(ctx context.Context, l *lease) error {
	for {
		active, err := s.gcActive(ctx)
		if err != nil {
			return err
		}
		if !active {
			return nil
		}
		if err := l.keepAlive(ctx); err != nil {
			return err
		}
		t := time.NewTimer(s.gcPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// gcActive reports whether some GC run's marker has not expired (with the
// skew margin).
func (s *Store) gcActive(ctx context.Context) (bool, error) {
	now := s.now()
	active := false
	err := s.b.List(ctx, gcPrefix, func(o ObjectInfo) error {
		if exp, ok := parseExpiry(o.Key); ok && now.Before(exp.Add(s.skew)) {
			active = true
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("list gc markers: %w", err)
	}
	return active, nil
}
