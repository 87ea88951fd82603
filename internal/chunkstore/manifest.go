package chunkstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"time"

	"space/internal/errkind"
)

// manifestVersion is the "version" of the manifests this package writes and
// reads.
const manifestVersion = 1

// maxManifestBytes bounds what Get reads. A chunk ref is about 140 bytes of
// JSON (160 with an encoding), so this holds over 1.5 million stored
// chunks: about 100 GiB of data at the default chunk size, 6 GiB at
// MinChunkSize (holes take no refs; our files are a few GiB, mostly
// sparse).
const maxManifestBytes = 256 << 20

// Manifest lists a snapshot's files and the chunks they are made of. It is
// stored as JSON at ManifestKey(ID).
type Manifest struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	// Parent is the ID of the snapshot given as PutOptions.Parent, or "".
	// It is informational: the manifest refers to its chunks directly.
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	// ChunkSize is the size the files were cut at, the writing Store's:
	// a power of two in [MinChunkSize, MaxChunkSize]. Restore and
	// validation go by it, so any Store reads the manifest.
	ChunkSize int64 `json:"chunk_size"`
	// Domain is the dedup domain every chunk ref's digest is keyed by
	// (PutOptions.Domain); "" (left out of the JSON, as in manifests
	// written before domains existed) is the legacy, unkeyed one.
	Domain string      `json:"domain,omitempty"`
	Files  []FileEntry `json:"files"`
}

// FileEntry is one file of a manifest. Chunks are in offset order; a chunk
// not listed is a hole (never written, or all zeros).
type FileEntry struct {
	Name   string      `json:"name"`
	Size   int64       `json:"size"`
	Mode   fs.FileMode `json:"mode"` // permission bits only
	Chunks []ChunkRef  `json:"chunks"`
}

// ChunkRef is one stored chunk of a file. Offset is a multiple of the
// manifest's ChunkSize; Length is ChunkSize except for the file's last
// chunk. Digest (SumIn of the manifest's Domain) and Length are the
// content's, whatever the encoding.
type ChunkRef struct {
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	Digest Digest `json:"digest"`
	// Encoding says which object of the chunk to read: EncodingRaw (left
	// out of the JSON, as in manifests written before compression) or
	// EncodingZstd.
	Encoding string `json:"encoding,omitempty"`
}

// File returns the entry named name.
func (m *Manifest) File(name string) (FileEntry, bool) {
	for _, f := range m.Files {
		if f.Name == name {
			return f, true
		}
	}
	return FileEntry{}, false
}

// validate checks the invariants Restore and Put rely on.
func (m *Manifest) validate() error {
	if m.Version != manifestVersion {
		return fmt.Errorf("manifest version %d, want %d", m.Version, manifestVersion)
	}
	if err := CheckID(m.ID); err != nil {
		return err
	}
	if m.Domain != "" {
		if err := CheckDomain(m.Domain); err != nil {
			return err
		}
	}
	cs := m.ChunkSize
	if !validChunkSize(cs) {
		return fmt.Errorf("manifest chunk size %d, want a power of two from %d to %d", cs, MinChunkSize, MaxChunkSize)
	}
	seen := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		if err := CheckID(f.Name); err != nil {
			return err
		}
		if seen[f.Name] {
			return fmt.Errorf("file %s listed twice", f.Name)
		}
		seen[f.Name] = true
		if f.Size < 0 {
			return fmt.Errorf("file %s: negative size", f.Name)
		}
		next := int64(0)
		for _, c := range f.Chunks {
			if c.Offset < next || c.Offset%cs != 0 || c.Offset >= f.Size || c.Length != min(cs, f.Size-c.Offset) {
				return fmt.Errorf("file %s: bad chunk at offset %d length %d", f.Name, c.Offset, c.Length)
			}
			if c.Encoding != EncodingRaw && c.Encoding != EncodingZstd {
				return fmt.Errorf("file %s: chunk at offset %d: unknown encoding %q", f.Name, c.Offset, c.Encoding)
			}
			next = c.Offset + c.Length
		}
	}
	return nil
}

func encodeManifest(m *Manifest) ([]byte, error) {
	return json.MarshalIndent(m, "", "\t")
}

func decodeManifest(id string, b []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("manifest %s: %v: %w", id, err, ErrCorrupt)
	}
	if err := m.validate(); err != nil {
		return Manifest{}, fmt.Errorf("manifest %s: %v: %w", id, err, ErrCorrupt)
	}
	if m.ID != id {
		return Manifest{}, fmt.Errorf("manifest %s: names snapshot %s: %w", id, m.ID, ErrCorrupt)
	}
	return m, nil
}

// Get returns snapshot id's manifest. It returns ErrNotFound if there is
// none and ErrCorrupt if it does not parse.
func (s *Store) Get(ctx context.Context, id string) (Manifest, error) {
	if err := CheckID(id); err != nil {
		return Manifest{}, fmt.Errorf("get snapshot: %w", err)
	}
	b, err := s.readSmall(ctx, ManifestKey(id), maxManifestBytes)
	if errors.Is(err, errkind.NotFound) {
		return Manifest{}, fmt.Errorf("get snapshot %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return decodeManifest(id, b)
}

// List returns the IDs of all snapshots, sorted.
func (s *Store) List(ctx context.Context) ([]string, error) {
	var ids []string
	err := s.b.List(ctx, manifestsPrefix, func(o ObjectInfo) error {
		id := strings.TrimPrefix(o.Key, manifestsPrefix)
		if CheckID(id) == nil {
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	slices.Sort(ids)
	return ids, nil
}

// Delete removes snapshot id's manifest (ErrNotFound if there is none).
// Its chunks stay until a GC finds no other manifest refers to them.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := CheckID(id); err != nil {
		return fmt.Errorf("delete snapshot: %w", err)
	}
	key := ManifestKey(id)
	if _, err := s.b.Stat(ctx, key); errors.Is(err, errkind.NotFound) {
		return fmt.Errorf("delete snapshot %s: %w", id, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if err := s.b.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return nil
}

// readSmall reads a whole object of at most limit bytes.
func (s *Store) readSmall(ctx context.Context, key string, limit int64) ([]byte, error) {
	rc, err := s.b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("read %s: larger than %d bytes: %w", key, limit, ErrCorrupt)
	}
	return b, nil
}

func (s *Store) putBytes(ctx context.Context, key string, b []byte) error {
	return s.b.Put(ctx, key, bytes.NewReader(b), int64(len(b)))
}
