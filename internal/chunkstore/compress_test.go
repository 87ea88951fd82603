package chunkstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"space/internal/chunkstore"
	"space/internal/errkind"
)

// compressStore returns a Store on b with the default chunk size and
// compression (Config.Compression).
func compressStore(t *testing.T, b chunkstore.Backend, compression string) *chunkstore.Store {
	t.Helper()
	s, err := chunkstore.New(chunkstore.Config{Backend: b, Compression: compression})
	if err != nil {
		t.Fatalf("setup: New(compression %q) = %v", compression, err)
	}
	return s
}

// memoryLike returns n chunks of cs bytes laid out like guest memory a
// snapshot stores: each chunk holds a page of page-table entries, one
// dirtied (random) page, and zeros.
func memoryLike(seed byte, n int, cs int64) []byte {
	const page = 4 * kib
	b := make([]byte, int64(n)*cs)
	for i := range n {
		c := b[int64(i)*cs : int64(i+1)*cs]
		for j := range page / 8 {
			pte := uint64(0x8000_0000_0000_0067) | uint64(i*4096+j)<<12
			binary.LittleEndian.PutUint64(c[8*j:], pte)
		}
		dirty := int64(1+i%int(cs/page-1)) * page
		copy(c[dirty:dirty+page], randomBytes(seed+byte(i), page))
	}
	return b
}

// writeData writes data as a file in a new directory and returns its path.
func writeData(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return p
}

// storedBytes is the total size of b's objects.
func storedBytes(t *testing.T, b chunkstore.Backend) int64 {
	t.Helper()
	var n int64
	if err := b.List(t.Context(), "", func(o chunkstore.ObjectInfo) error { n += o.Size; return nil }); err != nil {
		t.Fatalf("List = %v", err)
	}
	return n
}

// put stores the file at p as snapshot id and checks that NewBytes is what
// the backend grew by.
func put(t *testing.T, s *chunkstore.Store, b chunkstore.Backend, id, p string) (chunkstore.Manifest, chunkstore.PutStats) {
	t.Helper()
	before := storedBytes(t, b)
	m, st, err := s.Put(t.Context(), id, []chunkstore.File{{Name: "f", Path: p}}, chunkstore.PutOptions{Domain: "test"})
	if err != nil {
		t.Fatalf("Put(%s) = %v", id, err)
	}
	if grown := storedBytes(t, b) - before; grown != st.NewBytes {
		t.Errorf("Put(%s): backend grew by %d bytes, NewBytes = %d", id, grown, st.NewBytes)
	}
	return m, st
}

// encodings counts m's chunk refs by encoding.
func encodings(m chunkstore.Manifest) map[string]int {
	n := map[string]int{}
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			n[c.Encoding]++
		}
	}
	return n
}

// zstKeys returns the keys of b's compressed chunks.
func zstKeys(t *testing.T, b chunkstore.Backend) []string {
	t.Helper()
	var out []string
	for _, k := range keys(t, b, "chunks/") {
		if strings.HasSuffix(k, ".zst") {
			out = append(out, k)
		}
	}
	return out
}

func TestNewCompression(t *testing.T) {
	b := localBackend(t)
	for _, c := range []string{"", "zstd", "none"} {
		if _, err := chunkstore.New(chunkstore.Config{Backend: b, Compression: c}); err != nil {
			t.Errorf("New(compression %q) = %v", c, err)
		}
	}
	for _, c := range []string{"lz4", "ZSTD", "raw", " "} {
		if _, err := chunkstore.New(chunkstore.Config{Backend: b, Compression: c}); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(compression %q) = %v, want InvalidArgument", c, err)
		}
	}
}

// TestCompressedRoundTrip: memory-like chunks are stored compressed, cost
// a fraction of what a store that does not compress stores, and restore.
func TestCompressedRoundTrip(t *testing.T) {
	const n = 40
	data := memoryLike(1, n, chunkstore.DefaultChunkSize)
	p := writeData(t, data)

	zb, rb := localBackend(t), localBackend(t)
	zm, zst := put(t, compressStore(t, zb, ""), zb, "z", p)
	rm, rst := put(t, compressStore(t, rb, "none"), rb, "r", p)

	if got := encodings(zm); got[chunkstore.EncodingZstd] != n {
		t.Errorf("zstd store: refs by encoding %v, want all %d zstd", got, n)
	}
	if got := len(zstKeys(t, zb)); got != n {
		t.Errorf("zstd store holds %d .zst chunks, want %d", got, n)
	}
	if got := encodings(rm); got[chunkstore.EncodingRaw] != n || len(zstKeys(t, rb)) != 0 {
		t.Errorf("store without compression: refs by encoding %v, .zst keys %q, want all %d raw", got, zstKeys(t, rb), n)
	}
	raw := int64(len(data))
	if zst.NewChunks != n || zst.RawNewBytes != raw || rst.RawNewBytes != raw || rst.NewBytes != raw+rst.ManifestBytes {
		t.Errorf("Put = %+v (zstd), %+v (none): want %d new chunks, %d raw bytes each, stored raw without compression", zst, rst, n, raw)
	}
	// A chunk is one page of random data, a page of page-table entries and
	// zeros: it compresses to little more than the random page.
	if stored := zst.NewBytes - zst.ManifestBytes; stored > raw/8 {
		t.Errorf("zstd store stored %d bytes of %d memory-like bytes, want at most an eighth", stored, raw)
	}
	t.Logf("memory-like chunks: %d bytes stored compressed, %d raw (%.1f%%)",
		zst.NewBytes-zst.ManifestBytes, raw, 100*float64(zst.NewBytes-zst.ManifestBytes)/float64(raw))
	restoresTo(t, compressStore(t, zb, ""), zm, "f", p)
	restoresTo(t, compressStore(t, rb, "none"), rm, "f", p)
}

// TestIncompressibleStoredRaw: random chunks, and chunks too small to
// gain, are stored raw even by a compressing store.
func TestIncompressibleStoredRaw(t *testing.T) {
	b := localBackend(t)
	s := compressStore(t, b, "zstd")
	const size = 3*chunkstore.DefaultChunkSize + 10 // a 10-byte last chunk
	data := randomBytes(2, size)
	copy(data[size-10:], "aaaaaaaaaa")
	p := writeData(t, data)
	m, st := put(t, s, b, "s", p)
	if got := encodings(m); got[chunkstore.EncodingRaw] != 4 {
		t.Errorf("refs by encoding %v, want all 4 raw", got)
	}
	if k := zstKeys(t, b); len(k) != 0 {
		t.Errorf("random data stored compressed at %q", k)
	}
	if st.NewBytes != size+st.ManifestBytes || st.RawNewBytes != size {
		t.Errorf("Put = %+v, want %d raw bytes stored as they are", st, size)
	}
	restoresTo(t, s, m, "f", p)
}

// TestMixedCompression: a store that compresses and one that does not
// share a backend: each restores the other's snapshots, and GC by either
// keeps them all.
func TestMixedCompression(t *testing.T) {
	ctx := t.Context()
	b := localBackend(t)
	z, r := compressStore(t, b, ""), compressStore(t, b, "none")
	pz := writeData(t, memoryLike(3, 8, chunkstore.DefaultChunkSize))
	pr := writeData(t, memoryLike(4, 8, chunkstore.DefaultChunkSize))
	mz, _ := put(t, z, b, "z", pz)
	mr, _ := put(t, r, b, "r", pr)
	if encodings(mz)[chunkstore.EncodingZstd] != 8 || encodings(mr)[chunkstore.EncodingRaw] != 8 {
		t.Fatalf("setup: refs by encoding %v (zstd store), %v (none), want 8 each", encodings(mz), encodings(mr))
	}
	check := func(when string) {
		t.Helper()
		for _, s := range []*chunkstore.Store{z, r} {
			for _, snap := range []struct{ id, path string }{{"z", pz}, {"r", pr}} {
				m, err := s.Get(ctx, snap.id)
				if err != nil {
					t.Fatalf("%s: Get(%s) = %v", when, snap.id, err)
				}
				restoresTo(t, s, m, "f", snap.path)
			}
		}
	}
	check("after Put")
	for _, s := range []*chunkstore.Store{z, r} {
		if st, err := s.GC(ctx); err != nil || st.ChunksScanned != 16 || st.ChunksDeleted != 0 {
			t.Errorf("GC = %+v, %v, want 16 chunks scanned, none deleted", st, err)
		}
		check("after GC")
	}
}

// TestDedupAcrossEncodings: a chunk stored in one encoding is reused, not
// stored again, by a store that would write the other.
func TestDedupAcrossEncodings(t *testing.T) {
	for _, tc := range []struct {
		first, second string // the stores' Config.Compression, in Put order
		want          string // the encoding both snapshots' refs name
	}{
		{"none", "zstd", chunkstore.EncodingRaw},
		{"zstd", "none", chunkstore.EncodingZstd},
	} {
		t.Run(tc.first+"-then-"+tc.second, func(t *testing.T) {
			b := localBackend(t)
			p := writeData(t, memoryLike(5, 6, chunkstore.DefaultChunkSize))
			m1, _ := put(t, compressStore(t, b, tc.first), b, "s1", p)
			before := keys(t, b, "chunks/")
			s2 := compressStore(t, b, tc.second)
			m2, st := put(t, s2, b, "s2", p)
			if st.NewChunks != 0 || st.ReusedChunks != 6 || st.NewBytes != st.ManifestBytes {
				t.Errorf("Put(same content) by a %s store = %+v, want all 6 chunks reused, only the manifest stored", tc.second, st)
			}
			if after := keys(t, b, "chunks/"); !slices.Equal(before, after) {
				t.Errorf("chunks before the second Put %q, after %q, want the same", before, after)
			}
			for _, m := range []chunkstore.Manifest{m1, m2} {
				if got := encodings(m); got[tc.want] != 6 {
					t.Errorf("snapshot %s: refs by encoding %v, want 6 %q", m.ID, got, tc.want)
				}
			}
			restoresTo(t, s2, m2, "f", p)
		})
	}
}

// TestGCBothEncodings: GC keeps every object of a live digest, raw and
// compressed, and deletes both of a dead one.
func TestGCBothEncodings(t *testing.T) {
	ctx := t.Context()
	b := localBackend(t)
	s := compressStore(t, b, "")
	data := memoryLike(6, 2, chunkstore.DefaultChunkSize)
	p := writeData(t, data)
	m, _ := put(t, s, b, "s", p)
	// Two writers of different compression stored chunk 0 at once: both
	// objects exist.
	live := m.Files[0].Chunks[0]
	if live.Encoding != chunkstore.EncodingZstd {
		t.Fatalf("setup: chunk 0 encoding %q, want zstd", live.Encoding)
	}
	putObject(t, b, chunkstore.ChunkKey(live.Digest), data[:live.Length])
	// A dead digest in both encodings, and objects that are not chunks.
	junk := memoryLike(7, 1, chunkstore.DefaultChunkSize)
	dead := chunkstore.ChunkKey(chunkstore.Sum(junk))
	putObject(t, b, dead, junk)
	putObject(t, b, dead+".zst", zstdFrame(t, junk))
	foreign := []string{dead + ".zst.zst", dead + ".gz", "chunks/zz/" + chunkstore.Sum(junk).String() + ".zst"}
	for _, k := range foreign {
		putObject(t, b, k, []byte("foreign"))
	}

	st, err := s.GC(ctx)
	if err != nil || st.ChunksScanned != 5 || st.ChunksDeleted != 2 {
		t.Errorf("GC = %+v, %v, want 5 chunks scanned (2 live digests, one in both encodings; 1 dead in both) and the dead one's 2 deleted", st, err)
	}
	want := []string{chunkstore.ChunkKey(live.Digest), chunkstore.ChunkKey(live.Digest) + ".zst"}
	for _, k := range append(want, foreign...) {
		if _, err := b.Stat(ctx, k); err != nil {
			t.Errorf("after GC: Stat(%s) = %v, want kept", k, err)
		}
	}
	for _, k := range []string{dead, dead + ".zst"} {
		if _, err := b.Stat(ctx, k); !errors.Is(err, errkind.NotFound) {
			t.Errorf("after GC: Stat(%s) = %v, want deleted", k, err)
		}
	}
	restoresTo(t, s, m, "f", p)

	if err := s.Delete(ctx, "s"); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	if st, err := s.GC(ctx); err != nil || st.ChunksDeleted != 3 {
		t.Errorf("GC after Delete = %+v, %v, want all 3 chunk objects deleted", st, err)
	}
	if got := keys(t, b, "chunks/"); !slices.Equal(got, slices.Sorted(slices.Values(foreign))) {
		t.Errorf("after deleting the snapshot and GC the chunks are %q, want only %q", got, foreign)
	}
}

// TestCorruptCompressedChunk damages a stored .zst object in many ways:
// Restore must fail with ErrCorrupt every time, and leave nothing behind.
func TestCorruptCompressedChunk(t *testing.T) {
	ctx := t.Context()
	b := localBackend(t)
	s := compressStore(t, b, "")
	data := memoryLike(8, 3, chunkstore.DefaultChunkSize)
	m, _ := put(t, s, b, "s", writeData(t, data))
	ref := m.Files[0].Chunks[1]
	key := chunkstore.ChunkKey(ref.Digest) + ".zst"
	good := readObject(t, b, key)
	content := data[ref.Offset : ref.Offset+ref.Length]

	flipped := func(at ...int) []byte {
		c := bytes.Clone(good)
		for _, i := range at {
			c[i] ^= 0x5a
		}
		return c
	}
	cases := map[string][]byte{
		"empty":            {},
		"truncated":        good[:len(good)/2],
		"one byte short":   good[:len(good)-1],
		"trailing garbage": append(bytes.Clone(good), 1, 2, 3),
		"magic":            flipped(0),
		"frame header":     flipped(4, 5),
		"last byte":        flipped(len(good) - 1),
		"not zstd":         content[:100],
		"shorter content":  zstdFrame(t, content[:len(content)-1]),
		"longer content":   zstdFrame(t, append(bytes.Clone(content), 0)),
		"other content":    zstdFrame(t, memoryLike(9, 1, chunkstore.DefaultChunkSize)),
		"twice":            append(zstdFrame(t, content), zstdFrame(t, content)...),
	}
	// Single bytes flipped: all of the frame and block headers and entropy
	// tables at the start, then spread over the rest.
	for i := 0; i < len(good); i++ {
		cases[fmt.Sprintf("with byte %d flipped", i)] = flipped(i)
		if i >= 64 {
			i += 60
		}
	}
	dir := t.TempDir()
	for name, bad := range cases {
		putObject(t, b, key, bad)
		err := s.Restore(ctx, m, "f", filepath.Join(dir, "f"))
		if !errors.Is(err, chunkstore.ErrCorrupt) {
			t.Errorf("Restore with the .zst object %s = %v, want ErrCorrupt", name, err)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("Restore with the .zst object %s left %v behind", name, left)
		}
	}

	if err := b.Delete(ctx, key); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := s.Restore(ctx, m, "f", filepath.Join(t.TempDir(), "f")); !errors.Is(err, chunkstore.ErrChunkMissing) {
		t.Errorf("Restore with the .zst object deleted = %v, want ErrChunkMissing", err)
	}
	// The raw object of the same digest does not stand in for it: the
	// manifest names the encoding.
	putObject(t, b, chunkstore.ChunkKey(ref.Digest), content)
	if err := s.Restore(ctx, m, "f", filepath.Join(t.TempDir(), "f")); !errors.Is(err, chunkstore.ErrChunkMissing) {
		t.Errorf("Restore with only the raw object = %v, want ErrChunkMissing", err)
	}
	putObject(t, b, key, good)
	restoresTo(t, s, m, "f", writeData(t, data))
}

// zstdFrame compresses data as one zstd frame.
func zstdFrame(t *testing.T, data []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer enc.Close()
	return enc.EncodeAll(data, nil)
}

func putObject(t *testing.T, b chunkstore.Backend, key string, data []byte) {
	t.Helper()
	if err := b.Put(t.Context(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("setup: Put(%s) = %v", key, err)
	}
}

func readObject(t *testing.T, b chunkstore.Backend, key string) []byte {
	t.Helper()
	rc, err := b.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("setup: Get(%s) = %v", key, err)
	}
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(rc); err != nil {
		t.Fatalf("setup: read %s: %v", key, err)
	}
	return buf.Bytes()
}
