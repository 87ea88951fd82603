package chunkstore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"

	"space/internal/errkind"
)

// Chunk sizes. A store cuts files into chunks of its Config.ChunkSize,
// every chunk but a file's last one that long, aligned to file offsets:
// chunk i covers [i*size, (i+1)*size). Each manifest records the size its
// files were cut at, and readers go by that, so stores with different
// sizes share a backend.
//
// A snapshot stores whole chunks, so a guest's scattered 4 KiB page writes
// cost a chunk each: with 1 MiB chunks one dirtied page stores 1 MiB.
// Smaller chunks make what a snapshot stores follow what the guest
// dirtied, at the price of more objects, requests and manifest entries
// per byte.
const (
	// DefaultChunkSize is the chunk size of a Config that sets none.
	DefaultChunkSize = 64 << 10
	// MinChunkSize is a page: guests dirty whole pages, so smaller chunks
	// would store no less and only add per-object overhead.
	MinChunkSize = 4 << 10
	// MaxChunkSize bounds the memory a Put or Restore holds per chunk.
	MaxChunkSize = 4 << 20
)

// maxIDLen bounds snapshot IDs and file names.
const maxIDLen = 128

var (
	// ErrNotFound is returned by Get, Delete and Put (for a parent) when no
	// manifest has the ID.
	ErrNotFound = fmt.Errorf("snapshot not found: %w", errkind.NotFound)
	// ErrExists is returned by Put when a manifest with the ID exists.
	ErrExists = fmt.Errorf("snapshot already exists: %w", errkind.Conflict)
	// ErrCorrupt means stored data does not match what refers to it: a
	// chunk whose content does not hash to its digest or has the wrong
	// length, or a manifest that does not parse. It is errkind.Internal:
	// the store lost data, and retrying will not help.
	ErrCorrupt = fmt.Errorf("chunk store data corrupt: %w", errkind.Internal)
	// ErrChunkMissing means a manifest refers to a chunk the backend does
	// not have. It wraps ErrCorrupt (the store lost data), so errors.Is
	// matches both.
	ErrChunkMissing = fmt.Errorf("chunk missing: %w", ErrCorrupt)
	// ErrLeaseExpired is returned by Put when it could not renew its lease
	// in time (a stalled process, a backend slower than Config.LeaseTTL),
	// so a GC may have collected chunks it meant to reference. Nothing was
	// committed; retrying the Put is safe. It is errkind.Unavailable.
	ErrLeaseExpired = fmt.Errorf("snapshot write lease expired: %w", errkind.Unavailable)
)

// Config configures a Store.
type Config struct {
	// Backend holds the objects. Required.
	Backend Backend
	// ChunkSize is the size Put cuts files at (see DefaultChunkSize): a
	// power of two in [MinChunkSize, MaxChunkSize]. It applies to the
	// snapshots this Store writes; it reads snapshots of any chunk size.
	// Chunks of different sizes never deduplicate against each other.
	// 0 = DefaultChunkSize.
	ChunkSize int64
	// LeaseTTL is how long a writer's lease, and a GC run's marker, stay
	// valid without renewal. Writers and GC renew well before it ends; it
	// bounds how long a crashed writer's chunks stay protected and how long
	// a crashed GC run blocks writers. 0 = 10 minutes.
	LeaseTTL time.Duration
	// ClockSkew is the largest difference assumed between the clocks of
	// the processes sharing Backend (and the time one backend request may
	// take). Expiry times are honoured this much longer by the side that
	// does not own them. 0 = 1 minute.
	ClockSkew time.Duration
	// GCGrace keeps chunks put less than GCGrace ago (by the backend's
	// ModTime) from being collected, whether referenced or not: a margin
	// for writers that predate the lease protocol. 0 = no margin; leases
	// alone protect writers.
	GCGrace time.Duration
	// GCPoll is how often a writer that found a GC run in progress checks
	// whether it has ended. 0 = 1 second.
	GCPoll time.Duration
	// Concurrency is how many backend requests one Put, Restore or GC runs
	// at once. 0 = 16: small chunks make many small requests, whose
	// latency (an fsync each on a local disk, a round trip to object
	// storage) overlaps (60 MB in 64 KiB chunks to a local ext4 directory:
	// 0.96 s at 4, 0.62 s at 16).
	Concurrency int
	// Compression is how Put stores the chunks it uploads: "zstd" (or "",
	// the default) compresses each chunk on its own, and stores it raw
	// where that saves less than an eighth; "none" stores every chunk raw.
	// It applies to what this Store writes: it reads and reuses chunks of
	// either encoding (see the package doc).
	Compression string
	// Now is the clock for lease and marker expiry. nil = time.Now.
	Now func() time.Time
}

// Store keeps snapshots in a Backend as manifests of content-addressed
// chunks. Its methods are safe for concurrent use, also with other Stores
// on the same Backend.
// Backend returns the backend s stores in (Config.Backend).
func (s *Store) Backend() Backend { return s.b }

type Store struct {
	b           Backend
	chunkSize   int64
	leaseTTL    time.Duration
	skew        time.Duration
	grace       time.Duration
	gcPoll      time.Duration
	concurrency int
	now         func() time.Time
	// zenc compresses chunks for Put; nil stores them raw. zdec
	// decompresses for Restore. Both are safe for concurrent use.
	zenc *zstd.Encoder
	zdec *zstd.Decoder
}

// New returns a Store on cfg.Backend. It does no I/O.
func New(cfg Config) (*Store, error) {
	if cfg.Backend == nil {
		return nil, fmt.Errorf("chunkstore: backend not set: %w", errkind.InvalidArgument)
	}
	if cfg.LeaseTTL < 0 || cfg.ClockSkew < 0 || cfg.GCGrace < 0 || cfg.GCPoll < 0 || cfg.Concurrency < 0 {
		return nil, fmt.Errorf("chunkstore: negative duration or concurrency in config: %w", errkind.InvalidArgument)
	}
	chunkSize := cmpOr(cfg.ChunkSize, DefaultChunkSize)
	if !validChunkSize(chunkSize) {
		return nil, fmt.Errorf("chunkstore: chunk size %d: want a power of two from %d to %d: %w",
			chunkSize, MinChunkSize, MaxChunkSize, errkind.InvalidArgument)
	}
	zenc, err := newEncoder(cfg.Compression, chunkSize)
	if err != nil {
		return nil, err
	}
	zdec, err := newDecoder()
	if err != nil {
		return nil, err
	}
	s := &Store{
		b:           cfg.Backend,
		chunkSize:   chunkSize,
		leaseTTL:    cmpOr(cfg.LeaseTTL, 10*time.Minute),
		skew:        cmpOr(cfg.ClockSkew, time.Minute),
		grace:       cfg.GCGrace,
		gcPoll:      cmpOr(cfg.GCPoll, time.Second),
		concurrency: cmpOr(cfg.Concurrency, 16),
		now:         cfg.Now,
		zenc:        zenc,
		zdec:        zdec,
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// ChunkSize returns the size this Store cuts files at (Config.ChunkSize,
// or DefaultChunkSize).
func (s *Store) ChunkSize() int64 { return s.chunkSize }

// validChunkSize reports whether n is a chunk size a manifest may record
// and a Store may be configured with.
func validChunkSize(n int64) bool {
	return MinChunkSize <= n && n <= MaxChunkSize && n&(n-1) == 0
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Digest names a chunk: the BLAKE3-256 hash of its content, keyed by its
// dedup domain (SumIn). Its text form (JSON too) is 64 lowercase hex
// digits.
type Digest [32]byte

// Sum returns the digest of b in the legacy domain "": its unkeyed
// BLAKE3-256, which names the chunks of manifests written before dedup
// domains existed.
func Sum(b []byte) Digest { return blake3.Sum256(b) }

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// MarshalText implements encoding.TextMarshaler.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Digest) UnmarshalText(b []byte) error {
	p, err := ParseDigest(string(b))
	if err != nil {
		return err
	}
	*d = p
	return nil
}

// ParseDigest parses the text form of a digest. The error wraps
// errkind.InvalidArgument.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	if len(s) != 2*len(d) {
		return d, fmt.Errorf("digest %q: want %d hex digits: %w", s, 2*len(d), errkind.InvalidArgument)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return d, fmt.Errorf("digest %q: not lowercase hex: %w", s, errkind.InvalidArgument)
		}
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, fmt.Errorf("digest %q: %w", s, errkind.InvalidArgument)
	}
	return d, nil
}

// Range is a byte range of a file: [Off, Off+Len).
type Range struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// File names one file of a snapshot to Put: Name is what the manifest
// calls it (same rules as a snapshot ID), Path where it is read from.
type File struct {
	Name string
	Path string
}

// PutOptions are Put's inputs besides the files. Domain is required; the
// others are optional (unset, Put reads every data region of every file).
type PutOptions struct {
	// Domain is the snapshot's dedup domain (CheckDomain), required: its
	// chunks are named by their digests keyed by it (SumIn), so they
	// deduplicate only against chunks of the same domain, and nothing
	// Put does or returns depends on what other domains store. One tenant
	// (a team) is one domain.
	Domain string
	// Parent is the snapshot this one was derived from, or nil. Required
	// when Dirty is set. A parent whose ChunkSize differs from the Store's
	// cut its files elsewhere, so it has no chunks to give: Put then
	// ignores Dirty and reads every file in full (recording Parent's ID
	// all the same). It does not fail, so a store whose chunk size was
	// changed keeps taking snapshots of VMs restored from older ones. A
	// parent of another Domain (a legacy one among them) lends no chunks
	// either: every chunk of a manifest is of its own domain.
	Parent *Manifest
	// Dirty, if non-nil, lists per file name the only byte ranges that may
	// differ from Parent's file of the same name (a VMM's dirty page log).
	// Chunks of a listed file that overlap no range, and whose extent is
	// the same as in Parent, are taken from Parent without reading the
	// file; an empty list means the file is unchanged. Files not listed are
	// read in full.
	Dirty map[string][]Range
}

// PutStats says what a Put did.
type PutStats struct {
	// LogicalBytes is the sum of the files' sizes.
	LogicalBytes int64
	// ReadBytes is how much was read from the files: the data regions
	// (holes are never read) of chunks not taken from a parent.
	ReadBytes int64
	// NewChunks is how many chunks this Put uploaded.
	NewChunks int
	// NewBytes is how much the backend's stored bytes grew: the new
	// chunks as stored (compressed where they were) plus the manifest
	// (ManifestBytes), assuming no other writer stores the same chunk at
	// the same moment.
	NewBytes int64
	// RawNewBytes is the content size of the new chunks, before
	// compression: NewBytes-ManifestBytes over RawNewBytes is what
	// compression left of them.
	RawNewBytes int64
	// ManifestBytes is the size of the stored manifest.
	ManifestBytes int64
	// ReusedChunks counts chunk references that needed no upload: chunks
	// already stored, repeated within this snapshot, or taken from Parent.
	ReusedChunks int
	// HoleChunks counts chunks recorded as holes: never written, or all
	// zeros.
	HoleChunks int
}

// GCStats says what a GC run did.
type GCStats struct {
	// Manifests is how many manifests were read.
	Manifests int
	// LiveLeases is how many unexpired writer leases protected chunks.
	LiveLeases int
	// ChunksScanned is how many stored chunk objects were considered (a
	// chunk stored both raw and compressed counts twice), and
	// BytesScanned their stored sizes: the chunks' bytes in the store
	// when the run began.
	ChunksScanned int
	BytesScanned  int64
	// ChunksDeleted and BytesDeleted are what was collected, in objects
	// and their stored sizes.
	ChunksDeleted int
	BytesDeleted  int64
	// ExpiredLeases is how many leases of crashed writers were removed.
	ExpiredLeases int
}

// Object key layout. Every segment passes CheckKey.
const (
	chunksPrefix    = "chunks/"
	manifestsPrefix = "manifests/"
	leasesPrefix    = "leases/"
	gcPrefix        = "gc/"
)

// Chunk encodings: how a chunk's object holds its content. A ChunkRef
// names the one its object has.
const (
	// EncodingRaw is the content itself, at ChunkKey.
	EncodingRaw = ""
	// EncodingZstd is one zstd frame of the content, at ChunkKey + ".zst".
	EncodingZstd = "zstd"
)

// zstdSuffix ends the key of a zstd-encoded chunk.
const zstdSuffix = ".zst"

// ChunkKey returns the object key of the raw chunk with digest d:
// "chunks/<first two hex digits>/<hex>". The zstd-encoded chunk is at
// ChunkKey(d) + ".zst".
func ChunkKey(d Digest) string {
	h := d.String()
	return chunksPrefix + h[:2] + "/" + h
}

// chunkObjectKey returns the object key of the chunk with digest d stored
// in encoding, which must be EncodingRaw or EncodingZstd.
func chunkObjectKey(d Digest, encoding string) string {
	if encoding == EncodingZstd {
		return ChunkKey(d) + zstdSuffix
	}
	return ChunkKey(d)
}

// ManifestKey returns the object key of snapshot id's manifest.
func ManifestKey(id string) string { return manifestsPrefix + id }

// CheckID reports whether id is a valid snapshot ID or file name: 1 to 128
// ASCII letters, digits, '.', '_' and '-', starting with a letter or digit
// (so no '/', no "..", nothing empty). The error wraps
// errkind.InvalidArgument.
func CheckID(id string) error {
	if len(id) > maxIDLen || !validSegment(id) {
		return fmt.Errorf("invalid snapshot id or file name %q: want 1-%d of [A-Za-z0-9._-] starting with a letter or digit: %w",
			id, maxIDLen, errkind.InvalidArgument)
	}
	return nil
}

func nonce() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// fileMode keeps only the permission bits a manifest records.
func fileMode(m fs.FileMode) fs.FileMode { return m.Perm() }
