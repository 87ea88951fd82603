package chunkstore

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"space/internal/errkind"
)

// Backend stores opaque objects by key. A Store keeps its chunks,
// manifests, leases and GC markers in one Backend; several Stores (in
// several processes) may share it. Implementations live in subpackages
// (chunkstore/local, chunkstore/s3) and pass chunkstoretest.Run.
//
// Keys are checked by [CheckKey]. A Backend must give read-after-write and
// list-after-write consistency: once Put or Delete returns, every later Get,
// Stat and List (from any process) sees it. The GC protocol relies on this
// (see the package doc).
type Backend interface {
	ObjectReader
	ObjectWriter
	ObjectLister
}

// ObjectReader reads objects.
type ObjectReader interface {
	// Get opens the object at key; the caller closes it. A missing object
	// is an error wrapping errkind.NotFound.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat describes the object at key. A missing object is an error
	// wrapping errkind.NotFound.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
}

// ObjectWriter writes and removes objects.
type ObjectWriter interface {
	// Put stores exactly size bytes read from r at key, replacing any
	// object there. It is atomic: readers see the old object, no object, or
	// the whole new one, never part of it, even if the process crashes. If
	// r yields fewer or more than size bytes, Put fails and stores nothing.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Delete removes the object at key. Deleting a missing object is not
	// an error.
	Delete(ctx context.Context, key string) error
}

// ObjectLister enumerates objects.
type ObjectLister interface {
	// List calls fn for every object whose key starts with prefix, in
	// lexical key order, and stops at fn's first error, which it returns.
	// Objects put or deleted while List runs may or may not be seen.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
}

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key  string
	Size int64
	// ModTime is when the object was last put, by the backend's clock.
	ModTime time.Time
}

// CheckKey reports whether key is a valid object key: one or more
// '/'-separated segments, each starting with an ASCII letter or digit and
// made of letters, digits, '.', '_' and '-'. So no key is empty, absolute,
// or contains "..", and a backend may map keys to file paths. The error
// wraps errkind.InvalidArgument.
func CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("object key is empty: %w", errkind.InvalidArgument)
	}
	for seg := range strings.SplitSeq(key, "/") {
		if !validSegment(seg) {
			return fmt.Errorf("object key %q: bad segment %q: %w", key, seg, errkind.InvalidArgument)
		}
	}
	return nil
}

func validSegment(s string) bool {
	if s == "" || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
