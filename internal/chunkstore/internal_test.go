package chunkstore

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

func TestDataRanges(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer f.Close()
	const blk = 64 << 10 // larger than any file system block
	f.Truncate(10 * blk)
	f.WriteAt(make([]byte, blk), 2*blk) // written zeros are data, not a hole
	f.WriteAt([]byte("x"), 7*blk)
	got, err := dataRanges(f, 10*blk)
	if err != nil {
		t.Fatalf("dataRanges = %v", err)
	}
	// File systems report data at block granularity, so check coverage.
	// (Every Linux file system we run on has SEEK_DATA; where one lacks it,
	// the whole file is data and this fails, as holes would be read.)
	covered := func(off int64) bool {
		for _, r := range got {
			if r.Off <= off && off < r.Off+r.Len {
				return true
			}
		}
		return false
	}
	for _, off := range []int64{2 * blk, 3*blk - 1, 7 * blk} {
		if !covered(off) {
			t.Errorf("dataRanges = %v: offset %d (written) not covered", got, off)
		}
	}
	for _, off := range []int64{0, blk, 5 * blk, 9 * blk} {
		if covered(off) {
			t.Errorf("dataRanges = %v: offset %d (hole) covered", got, off)
		}
	}
	if got, err := dataRanges(f, 0); err != nil || len(got) != 0 {
		t.Errorf("dataRanges(size 0) = %v, %v, want none", got, err)
	}
}

func TestIntersect(t *testing.T) {
	data := []Range{{0, 10}, {20, 10}, {100, 50}}
	for _, tc := range []struct {
		off, n int64
		want   []Range
	}{
		{0, 5, []Range{{0, 5}}},
		{5, 20, []Range{{5, 5}, {20, 5}}},
		{10, 10, nil},
		{30, 70, nil},
		{0, 200, data},
		{120, 100, []Range{{120, 30}}},
		{150, 10, nil},
	} {
		if got := intersect(data, tc.off, tc.n); !cmp.Equal(got, tc.want) {
			t.Errorf("intersect(%v, %d, %d) = %v, want %v", data, tc.off, tc.n, got, tc.want)
		}
	}
}

func TestCheckIDAndKey(t *testing.T) {
	for _, id := range []string{"a", "snap-1", "A.b_c-9", strings.Repeat("x", 128)} {
		if err := CheckID(id); err != nil {
			t.Errorf("CheckID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "a/b", "../a", ".a", "-a", "_a", "a b", "ä", strings.Repeat("x", 129)} {
		if err := CheckID(id); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("CheckID(%q) = %v, want InvalidArgument", id, err)
		}
	}
	for _, key := range []string{"a", "a/b", "chunks/ab/" + strings.Repeat("0", 64), "leases/s.1/0.123"} {
		if err := CheckKey(key); err != nil {
			t.Errorf("CheckKey(%q) = %v, want nil", key, err)
		}
	}
	for _, key := range []string{"", "/", "/a", "a/", "a//b", "a/../b", "a/./b", ".tmp/x"} {
		if err := CheckKey(key); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("CheckKey(%q) = %v, want InvalidArgument", key, err)
		}
	}
}

func TestDigestText(t *testing.T) {
	d := Sum([]byte("hello"))
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatalf("Marshal = %v", err)
	}
	var back Digest
	if err := json.Unmarshal(b, &back); err != nil || back != d {
		t.Errorf("Unmarshal(%s) = %v, %v, want %v", b, back, err, d)
	}
	for _, enc := range []string{EncodingRaw, EncodingZstd} {
		if got, ok := parseChunkKey(chunkObjectKey(d, enc)); !ok || got != d {
			t.Errorf("parseChunkKey(%s) = %v, %v, want %v", chunkObjectKey(d, enc), got, ok, d)
		}
	}
	if k := chunkObjectKey(d, EncodingZstd); k != ChunkKey(d)+".zst" || CheckKey(k) != nil {
		t.Errorf("chunkObjectKey(d, zstd) = %q (CheckKey: %v), want ChunkKey(d) + .zst", k, CheckKey(k))
	}
	h := d.String()
	for _, key := range []string{
		"chunks/" + h[:2] + "/" + h + ".zst.zst",
		"chunks/" + h[:2] + "/" + h + ".gz",
		"chunks/" + h[:2] + "/" + h + ".",
		"chunks/" + h[:2] + "/" + h + "zst",
		"chunks/" + h[:2] + "/" + strings.ToUpper(h) + ".zst",
		"chunks/zz/" + h + ".zst",
		"chunks/" + h[:2] + "/x/" + h + ".zst",
		"other/" + h[:2] + "/" + h,
		"chunks/" + h[:2] + "/.zst",
	} {
		if got, ok := parseChunkKey(key); ok {
			t.Errorf("parseChunkKey(%q) = %v, ok; want not a chunk key", key, got)
		}
	}
	for _, s := range []string{"", "abc", strings.Repeat("g", 64), strings.ToUpper(d.String())} {
		if _, err := ParseDigest(s); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("ParseDigest(%q) = %v, want InvalidArgument", s, err)
		}
	}
}

func TestExpiryKeys(t *testing.T) {
	exp := time.UnixMilli(1_800_000_000_123)
	key := "leases/snap.abc/" + expiringName("3", exp)
	if got, ok := parseExpiry(key); !ok || !got.Equal(exp) {
		t.Errorf("parseExpiry(%q) = %v, %v, want %v", key, got, ok, exp)
	}
	if dir, ok := leaseDir(key); !ok || dir != "leases/snap.abc/" {
		t.Errorf("leaseDir(%q) = %q, %v", key, dir, ok)
	}
	for _, bad := range []string{"leases/x/3", "leases/a.1/x", "gc/n.notanumber"} {
		if _, ok := parseExpiry(bad); ok {
			t.Errorf("parseExpiry(%q) ok, want not", bad)
		}
	}
}

func TestManifestValidate(t *testing.T) {
	// ok is a manifest cut at cs: one whole chunk and a 5-byte tail.
	ok := func(cs int64) Manifest {
		return Manifest{Version: 1, ID: "s", ChunkSize: cs, Files: []FileEntry{{
			Name: "f", Size: cs + 5,
			Chunks: []ChunkRef{{Offset: 0, Length: cs, Encoding: EncodingZstd}, {Offset: cs, Length: 5}},
		}}}
	}
	// Every valid size, including the 1 MiB of manifests written before
	// the size was configurable.
	for _, cs := range []int64{MinChunkSize, 16 << 10, DefaultChunkSize, 1 << 20, MaxChunkSize} {
		if m := ok(cs); m.validate() != nil {
			t.Errorf("validate(good, chunk size %d) = %v", cs, m.validate())
		}
	}
	const cs = DefaultChunkSize
	for _, tc := range []struct {
		name string
		edit func(*Manifest)
	}{
		{"version", func(m *Manifest) { m.Version = 2 }},
		{"id", func(m *Manifest) { m.ID = "../s" }},
		{"no chunk size", func(m *Manifest) { m.ChunkSize = 0 }},
		{"negative chunk size", func(m *Manifest) { m.ChunkSize = -cs }},
		{"chunk size below min", func(m *Manifest) { m.ChunkSize = MinChunkSize / 2 }},
		{"chunk size above max", func(m *Manifest) { m.ChunkSize = MaxChunkSize * 2 }},
		{"chunk size not a power of two", func(m *Manifest) { m.ChunkSize = 3 * MinChunkSize }},
		// Valid sizes, but not the one the chunks were cut at.
		{"chunks longer than chunk size", func(m *Manifest) { m.ChunkSize = cs / 2 }},
		{"chunks shorter than chunk size", func(m *Manifest) { m.ChunkSize = cs * 2 }},
		{"duplicate file", func(m *Manifest) { m.Files = append(m.Files, m.Files[0]) }},
		{"misaligned", func(m *Manifest) { m.Files[0].Chunks[1].Offset = 7 }},
		{"short chunk", func(m *Manifest) { m.Files[0].Chunks[0].Length = 10 }},
		{"past the end", func(m *Manifest) { m.Files[0].Size = cs }},
		{"unknown encoding", func(m *Manifest) { m.Files[0].Chunks[1].Encoding = "gzip" }},
		{"encoding in capitals", func(m *Manifest) { m.Files[0].Chunks[0].Encoding = "ZSTD" }},
		{"unsorted", func(m *Manifest) {
			c := m.Files[0].Chunks
			c[0], c[1] = c[1], c[0]
		}},
	} {
		m := ok(cs)
		tc.edit(&m)
		if err := m.validate(); err == nil {
			t.Errorf("validate(%s) = nil, want an error", tc.name)
		}
	}
}

// TestManifestEncodingJSON: raw refs are written, and read, as before
// compression: without an encoding.
func TestManifestEncodingJSON(t *testing.T) {
	m := Manifest{Version: 1, ID: "s", ChunkSize: MinChunkSize, Files: []FileEntry{{
		Name: "f", Size: 2 * MinChunkSize,
		Chunks: []ChunkRef{{Offset: 0, Length: MinChunkSize}, {Offset: MinChunkSize, Length: MinChunkSize, Encoding: EncodingZstd}},
	}}}
	b, err := encodeManifest(&m)
	if err != nil {
		t.Fatalf("encodeManifest = %v", err)
	}
	if n := strings.Count(string(b), `"encoding"`); n != 1 {
		t.Errorf("encoded manifest names an encoding %d times, want once (raw refs name none):\n%s", n, b)
	}
	got, err := decodeManifest("s", b)
	if err != nil || !cmp.Equal(got, m) {
		t.Errorf("decodeManifest(encodeManifest(m)) = %+v, %v, want %+v", got, err, m)
	}
}

func TestPlanFile(t *testing.T) {
	const cs = MinChunkSize
	ref := func(off, n int64, b byte) ChunkRef { return ChunkRef{Offset: off, Length: n, Digest: Digest{b}} }
	// The parent: 4 chunks and a 100-byte tail, chunk 2 a hole.
	parent := FileEntry{Name: "f", Size: 4*cs + 100, Chunks: []ChunkRef{
		ref(0, cs, 0), ref(cs, cs, 1), ref(3*cs, cs, 3), ref(4*cs, 100, 4),
	}}
	// The file grew by one chunk; a byte of chunk 1 is dirty.
	p := planFile(5*cs+100, cs, parent, []Range{{Off: cs + 7, Len: 1}})
	// Chunk 4 changed extent (100 bytes in the parent, cs now); chunk 5 is
	// new.
	if want := []bool{true, false, true, true, false, false}; !cmp.Equal(p.clean, want) {
		t.Errorf("planFile: clean = %v, want %v", p.clean, want)
	}
	want := map[int64]ChunkRef{0: parent.Chunks[0], 3 * cs: parent.Chunks[2]}
	if !cmp.Equal(p.parentRefs, want) {
		t.Errorf("planFile: parentRefs = %v, want %v", p.parentRefs, want)
	}
}

func TestBatchChunks(t *testing.T) {
	for _, tc := range []struct {
		chunkSize int64
		want      int
	}{
		{MinChunkSize, 4096},
		{DefaultChunkSize, 256},
		{1 << 20, 16},
		{MaxChunkSize, 4},
	} {
		if got := batchChunks(tc.chunkSize); got != tc.want || int64(got)*tc.chunkSize != batchBytes {
			t.Errorf("batchChunks(%d) = %d, want %d (16 MiB)", tc.chunkSize, got, tc.want)
		}
	}
}

// TestSumIn pins the digest of a domain: changing how it is derived would
// rename every chunk stored, and every snapshot would fail to restore.
func TestSumIn(t *testing.T) {
	hello := []byte("hello")
	if got, want := SumIn("", hello), Sum(hello); got != want {
		t.Errorf("SumIn(legacy, hello) = %s, want Sum %s", got, want)
	}
	const want = "b28257b4f296913c3bd0f750ce9c9ea6a4a1e259dcb7418651cf7ffa0429a882"
	if got := SumIn("team/a", hello).String(); got != want {
		t.Errorf("SumIn(team/a, hello) = %s, want %s", got, want)
	}
	seen := map[Digest]string{}
	for _, domain := range []string{"", "team/a", "team/b", "team/A"} {
		d := SumIn(domain, hello)
		if other, ok := seen[d]; ok {
			t.Errorf("SumIn(%q, hello) = SumIn(%q, hello) = %s, want distinct", domain, other, d)
		}
		seen[d] = domain
	}
	// One digester reused gives what a fresh one does.
	var h digester
	h.init("team/a")
	h.sum([]byte("something else"))
	if got := h.sum(hello).String(); got != want {
		t.Errorf("a reused digester's sum = %s, want %s", got, want)
	}
}

func TestCheckDomain(t *testing.T) {
	for _, d := range []string{"team/a", "platform/base-images", "x", strings.Repeat("d", 256)} {
		if err := CheckDomain(d); err != nil {
			t.Errorf("CheckDomain(%q) = %v, want nil", d, err)
		}
	}
	for _, d := range []string{"", "team a", "team/\n", "tëam", strings.Repeat("d", 257)} {
		if err := CheckDomain(d); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("CheckDomain(%q) = %v, want InvalidArgument", d, err)
		}
	}
}
