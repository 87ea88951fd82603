// Package chunkstoretest is the conformance suite every
// chunkstore.Backend passes: the object contract itself, and a Store on
// the backend round-tripping sparse files, deduplicating (within a dedup
// domain only), compressing,
// detecting corruption and collecting garbage while writers run.
package chunkstoretest

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/chunkstore"
	"space/internal/errkind"
)

// NewBackend returns a fresh, empty backend for one test. Objects must not
// be shared with other tests' backends.
type NewBackend func(t *testing.T) chunkstore.Backend

const (
	// mib is the chunk size of the suite's stores: its files are laid out
	// in 1 MiB chunks (the size was fixed at that once).
	mib      = 1 << 20
	leaseTTL = time.Minute
	skew     = 5 * time.Second
)

// Run runs the suite against the backends newBackend makes.
func Run(t *testing.T, newBackend NewBackend) {
	t.Run("Objects", func(t *testing.T) { testObjects(t, newBackend(t)) })
	t.Run("RoundTripSparse", func(t *testing.T) { testRoundTrip(t, newBackend(t)) })
	t.Run("Dedup", func(t *testing.T) { testDedup(t, newBackend(t)) })
	t.Run("DedupDomains", func(t *testing.T) { testDomains(t, newBackend(t)) })
	t.Run("LegacyManifest", func(t *testing.T) { testLegacyManifest(t, newBackend(t)) })
	t.Run("DirtyRanges", func(t *testing.T) { testDirty(t, newBackend(t)) })
	t.Run("Compression", func(t *testing.T) { testCompression(t, newBackend(t)) })
	t.Run("CorruptChunk", func(t *testing.T) { testCorrupt(t, newBackend(t)) })
	t.Run("MissingChunk", func(t *testing.T) { testMissing(t, newBackend(t)) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, newBackend(t)) })
	t.Run("GC", func(t *testing.T) { testGC(t, newBackend(t)) })
	t.Run("GCGrace", func(t *testing.T) { testGCGrace(t, newBackend(t)) })
	t.Run("DeleteThenGC", func(t *testing.T) { testDeleteThenGC(t, newBackend(t)) })
	t.Run("GCKeepsChunkLeasedByWriter", func(t *testing.T) { testGCKeepsLeased(t, newBackend(t)) })
	t.Run("WriterWaitsForGC", func(t *testing.T) { testWriterWaitsForGC(t, newBackend(t)) })
	t.Run("ExpiredLeaseCollected", func(t *testing.T) { testExpiredLease(t, newBackend(t)) })
	t.Run("PutFailsWhenLeaseExpires", func(t *testing.T) { testPutLeaseExpires(t, newBackend(t)) })
	t.Run("StalledGCDeletesNothing", func(t *testing.T) { testStalledGC(t, newBackend(t)) })
}

// Clock is a settable clock for Config.Now: real time plus an offset.
type Clock struct {
	mu sync.Mutex
	// +checklocks:mu
	off time.Duration
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

func newStore(t *testing.T, b chunkstore.Backend, clock *Clock) *chunkstore.Store {
	t.Helper()
	s, err := chunkstore.New(chunkstore.Config{
		Backend:   b,
		ChunkSize: mib,
		LeaseTTL:  leaseTTL,
		ClockSkew: skew,
		GCPoll:    5 * time.Millisecond,
		Now:       clock.Now,
	})
	if err != nil {
		t.Fatalf("setup: chunkstore.New: %v", err)
	}
	return s
}

func testObjects(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	for _, key := range []string{"a/b/c", "a/x", "b"} {
		if _, err := b.Stat(ctx, key); !errors.Is(err, errkind.NotFound) {
			t.Errorf("Stat(%q) on empty backend = %v, want NotFound", key, err)
		}
		if _, err := b.Get(ctx, key); !errors.Is(err, errkind.NotFound) {
			t.Errorf("Get(%q) on empty backend = %v, want NotFound", key, err)
		}
		if err := b.Delete(ctx, key); err != nil {
			t.Errorf("Delete(%q) of missing object = %v, want nil", key, err)
		}
	}
	Put(t, b, "a/b/c", []byte("hello"))
	Put(t, b, "a/x", nil)
	Put(t, b, "b", []byte("bee"))
	if got := Read(t, b, "a/b/c"); string(got) != "hello" {
		t.Errorf("Get(a/b/c) = %q, want %q", got, "hello")
	}
	o, err := b.Stat(ctx, "a/b/c")
	if err != nil || o.Size != 5 || o.Key != "a/b/c" || o.ModTime.IsZero() {
		t.Errorf("Stat(a/b/c) = %+v, %v, want key a/b/c, size 5, a mod time", o, err)
	}
	Put(t, b, "a/b/c", []byte("bye"))
	if got := Read(t, b, "a/b/c"); string(got) != "bye" {
		t.Errorf("Get(a/b/c) after replacing = %q, want %q", got, "bye")
	}

	// Wrong lengths store nothing; hide io.Seeker so both paths are used.
	for _, tc := range []struct {
		name string
		r    io.Reader
	}{
		{"short seeker", bytes.NewReader([]byte("abc"))},
		{"long seeker", bytes.NewReader([]byte("abcdefghijk"))},
		{"short stream", io.MultiReader(strings.NewReader("abc"))},
		{"long stream", io.MultiReader(strings.NewReader("abcdefghijk"))},
		{"failing stream", io.MultiReader(strings.NewReader("abc"), errReader{})},
	} {
		if err := b.Put(ctx, "a/b/c", tc.r, 10); err == nil {
			t.Errorf("Put(a/b/c, %s, size 10) = nil, want an error", tc.name)
		}
		if err := b.Put(ctx, "n", tc.r, 10); err == nil {
			t.Errorf("Put(n, %s, size 10) = nil, want an error", tc.name)
		}
	}
	if got := Read(t, b, "a/b/c"); string(got) != "bye" {
		t.Errorf("Get(a/b/c) after failed Puts = %q, want the old %q", got, "bye")
	}
	if _, err := b.Stat(ctx, "n"); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Stat(n) after failed Puts = %v, want NotFound", err)
	}

	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"a/b/c", "a/x", "b"}},
		{"a/", []string{"a/b/c", "a/x"}},
		{"a/b", []string{"a/b/c"}},
		{"a/b/c", []string{"a/b/c"}},
		{"b", []string{"b"}},
		{"zz/", nil},
		{"a/b/c/", nil},
	} {
		if got := list(t, b, tc.prefix); !cmp.Equal(got, tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	stop := errors.New("stop")
	n := 0
	err = b.List(ctx, "", func(chunkstore.ObjectInfo) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("List with fn failing = %v after %d calls, want stop after 1", err, n)
	}

	if err := b.Delete(ctx, "a/b/c"); err != nil {
		t.Fatalf("Delete(a/b/c) = %v", err)
	}
	if _, err := b.Stat(ctx, "a/b/c"); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Stat(a/b/c) after Delete = %v, want NotFound", err)
	}
	if got, want := list(t, b, ""), []string{"a/x", "b"}; !cmp.Equal(got, want) {
		t.Errorf("List after Delete = %q, want %q", got, want)
	}

	for _, key := range []string{"", "/a", "a/", "a//b", "../a", "a/../b", ".a", "a/.b", "a b", "a\x00"} {
		if err := b.Put(ctx, key, strings.NewReader("x"), 1); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Put(%q) = %v, want InvalidArgument", key, err)
		}
		if _, err := b.Get(ctx, key); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Get(%q) = %v, want InvalidArgument", key, err)
		}
		if _, err := b.Stat(ctx, key); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Stat(%q) = %v, want InvalidArgument", key, err)
		}
		if err := b.Delete(ctx, key); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Delete(%q) = %v, want InvalidArgument", key, err)
		}
	}
	if got, want := list(t, b, ""), []string{"a/x", "b"}; !cmp.Equal(got, want) {
		t.Errorf("List after bad keys = %q, want %q", got, want)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("read failed") }

// seg is data to write into a test file at an offset.
type seg struct {
	off  int64
	data []byte
}

// writeFile creates a sparse file of size with segs written.
func writeFile(t *testing.T, path string, size int64, segs ...seg) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, s := range segs {
		if _, err := f.WriteAt(s.data, s.off); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
}

// random returns n pseudo-random bytes determined by seed.
func random(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Put stores data under key in b, failing t on an error.
func Put(t *testing.T, b chunkstore.Backend, key string, data []byte) {
	t.Helper()
	if err := b.Put(t.Context(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("Put(%s) = %v", key, err)
	}
}

// Read returns the object key of b, failing t on an error.
func Read(t *testing.T, b chunkstore.Backend, key string) []byte {
	t.Helper()
	rc, err := b.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%s) = %v", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%s): read: %v", key, err)
	}
	return data
}

// list returns the keys under prefix.
func list(t *testing.T, b chunkstore.Backend, prefix string) []string {
	t.Helper()
	var keys []string
	err := b.List(t.Context(), prefix, func(o chunkstore.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	})
	if err != nil {
		t.Fatalf("List(%q) = %v", prefix, err)
	}
	return keys
}

// storedBytes is the total size of the backend's objects.
func storedBytes(t *testing.T, b chunkstore.Backend) int64 {
	t.Helper()
	var n int64
	err := b.List(t.Context(), "", func(o chunkstore.ObjectInfo) error {
		n += o.Size
		return nil
	})
	if err != nil {
		t.Fatalf("List = %v", err)
	}
	return n
}

// mustPut puts files and checks NewBytes against the backend's growth.
func mustPut(t *testing.T, s *chunkstore.Store, b chunkstore.Backend, id string, opts chunkstore.PutOptions, files ...chunkstore.File) (chunkstore.Manifest, chunkstore.PutStats) {
	t.Helper()
	before := storedBytes(t, b)
	m, st, err := s.Put(t.Context(), id, files, opts)
	if err != nil {
		t.Fatalf("Put(%s) = %v", id, err)
	}
	if grown := storedBytes(t, b) - before; grown != st.NewBytes {
		t.Errorf("Put(%s): backend grew by %d bytes, stats.NewBytes = %d", id, grown, st.NewBytes)
	}
	return m, st
}

// checkRestore restores name from m and compares it with want.
func checkRestore(t *testing.T, s *chunkstore.Store, m chunkstore.Manifest, name string, want []byte) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	if err := s.Restore(t.Context(), m, name, dst); err != nil {
		t.Fatalf("Restore(%s, %s) = %v", m.ID, name, err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatalf("read restored: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Restore(%s, %s): content differs from the original (%d bytes, want %d; first difference at %d)",
			m.ID, name, len(got), len(want), firstDiff(got, want))
	}
	return dst
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Blocks * 512
}

func fileData(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return b
}

type extent struct{ Off, Len int64 }

func extents(f chunkstore.FileEntry) []extent {
	var out []extent
	for _, c := range f.Chunks {
		out = append(out, extent{c.Offset, c.Length})
	}
	return out
}

func testRoundTrip(t *testing.T, b chunkstore.Backend) {
	s := newStore(t, b, &Clock{})
	dir := t.TempDir()
	type file struct {
		name string
		size int64
		segs []seg
		mode os.FileMode
		want []extent // stored chunks
	}
	files := []file{
		{name: "middle", size: 5*mib + 123, segs: []seg{
			{0, random(1, 3*4096)},
			{3*mib + 8192, random(2, 100000)},
			{5 * mib, random(3, 123)},
		}, want: []extent{{0, mib}, {3 * mib, mib}, {5 * mib, 123}}},
		{name: "ends", size: 6 * mib, segs: []seg{{2*mib + 4096, random(4, 65536)}},
			want: []extent{{2 * mib, mib}}},
		{name: "allholes", size: 3*mib + 7},
		{name: "zeros", size: 2 * mib, segs: []seg{{0, make([]byte, 2*mib)}}},
		{name: "odd", size: 2*mib + 777, segs: []seg{{0, random(5, 2*mib+777)}}, mode: 0o640,
			want: []extent{{0, mib}, {mib, mib}, {2 * mib, 777}}},
		{name: "empty", size: 0},
		{name: "tiny", size: 10, segs: []seg{{0, []byte("0123456789")}}, want: []extent{{0, 10}}},
	}
	var in []chunkstore.File
	var logical int64
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		writeFile(t, p, f.size, f.segs...)
		if f.mode != 0 {
			os.Chmod(p, f.mode)
		}
		in = append(in, chunkstore.File{Name: f.name, Path: p})
		logical += f.size
	}
	m, st := mustPut(t, s, b, "snap1", chunkstore.PutOptions{Domain: "test"}, in...)
	if st.LogicalBytes != logical {
		t.Errorf("Put: LogicalBytes = %d, want %d", st.LogicalBytes, logical)
	}
	if st.ReadBytes >= logical-5*mib {
		t.Errorf("Put: ReadBytes = %d of %d logical bytes: holes were read", st.ReadBytes, logical)
	}
	if st.NewChunks != 8 || st.HoleChunks != 3+5+4+2 {
		t.Errorf("Put: NewChunks, HoleChunks = %d, %d, want 8, 14", st.NewChunks, st.HoleChunks)
	}
	got, err := s.Get(t.Context(), "snap1")
	if err != nil {
		t.Fatalf("Get(snap1) = %v", err)
	}
	if diff := cmp.Diff(m, got); diff != "" {
		t.Errorf("Get(snap1) differs from Put's manifest (-put +get):\n%s", diff)
	}
	for _, f := range files {
		fe, ok := m.File(f.name)
		if !ok {
			t.Errorf("manifest lacks %s", f.name)
			continue
		}
		wantMode := f.mode
		if wantMode == 0 {
			fi, _ := os.Stat(filepath.Join(dir, f.name))
			wantMode = fi.Mode().Perm()
		}
		if fe.Size != f.size || fe.Mode != wantMode {
			t.Errorf("manifest %s: size %d mode %v, want %d %v", f.name, fe.Size, fe.Mode, f.size, wantMode)
		}
		if diff := cmp.Diff(f.want, extents(fe)); diff != "" {
			t.Errorf("manifest %s: stored chunks (-want +got):\n%s", f.name, diff)
		}
		dst := checkRestore(t, s, m, f.name, fileData(t, filepath.Join(dir, f.name)))
		fi, err := os.Stat(dst)
		if err != nil || fi.Mode().Perm() != wantMode {
			t.Errorf("restored %s: mode %v (%v), want %v", f.name, fi.Mode().Perm(), err, wantMode)
		}
		// Holes stay holes: at most the stored chunks take space.
		var stored int64
		for _, e := range f.want {
			stored += (e.Len + 4095) / 4096 * 4096
		}
		if a := allocated(t, dst); a > stored {
			t.Errorf("restored %s allocates %d bytes, want at most the %d its chunks need", f.name, a, stored)
		}
	}

	// A file that is only a hole is never read.
	_, st = mustPut(t, s, b, "holes", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "h", Path: filepath.Join(dir, "allholes")})
	if st.ReadBytes != 0 || st.NewChunks != 0 {
		t.Errorf("Put(all-hole file): ReadBytes, NewChunks = %d, %d, want 0, 0", st.ReadBytes, st.NewChunks)
	}
	ids, err := s.List(t.Context())
	if want := []string{"holes", "snap1"}; err != nil || !cmp.Equal(ids, want) {
		t.Errorf("List = %q, %v, want %q", ids, err, want)
	}
}

func testDedup(t *testing.T, b chunkstore.Backend) {
	s := newStore(t, b, &Clock{})
	dir := t.TempDir()
	mem := filepath.Join(dir, "mem")
	writeFile(t, mem, 6*mib, seg{0, random(10, 4*mib)})
	orig := fileData(t, mem)
	m1, st1 := mustPut(t, s, b, "s1", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "mem", Path: mem})
	if st1.NewChunks != 4 || st1.NewBytes != 4*mib+st1.ManifestBytes || st1.ReusedChunks != 0 {
		t.Errorf("Put(s1) = %+v, want 4 new chunks, NewBytes 4 MiB + manifest, none reused", st1)
	}

	// Change one chunk: the next snapshot stores only that one.
	Overwrite(t, mem, 2*mib+100, random(11, 4096))
	m2, st2 := mustPut(t, s, b, "s2", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "mem", Path: mem})
	if st2.NewChunks != 1 || st2.ReusedChunks != 3 || st2.NewBytes != mib+st2.ManifestBytes {
		t.Errorf("Put(s2) = %+v, want 1 new chunk (1 MiB + manifest), 3 reused", st2)
	}
	checkRestore(t, s, m2, "mem", fileData(t, mem))
	checkRestore(t, s, m1, "mem", orig)

	// Repeats within a snapshot are stored once.
	dup := filepath.Join(dir, "dup")
	c := random(12, mib)
	writeFile(t, dup, 3*mib, seg{0, c}, seg{2 * mib, c})
	m3, st3 := mustPut(t, s, b, "s3", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "dup", Path: dup})
	if st3.NewChunks != 1 || st3.ReusedChunks != 1 {
		t.Errorf("Put(s3) = %+v, want 1 new chunk, 1 reused", st3)
	}
	checkRestore(t, s, m3, "dup", fileData(t, dup))
}

// Overwrite writes data into the existing file path at off (a test's
// stand-in for a guest dirtying its memory file).
func Overwrite(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("setup: %v", err)
	}
}

func testDirty(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	s := newStore(t, b, &Clock{})
	dir := t.TempDir()
	mem := filepath.Join(dir, "mem")
	state := filepath.Join(dir, "state")
	writeFile(t, mem, 4*mib, seg{0, random(20, 4*mib)})
	writeFile(t, state, 100, seg{0, random(21, 100)})
	files := []chunkstore.File{{Name: "mem", Path: mem}, {Name: "state", Path: state}}
	p1, _ := mustPut(t, s, b, "p1", chunkstore.PutOptions{Domain: "test"}, files...)

	// Chunk 1 and chunk 3 change, but only chunk 1 is reported dirty: the
	// snapshot takes chunk 3 from the parent, which proves it was not read.
	Overwrite(t, mem, mib+10, []byte("dirty"))
	want := fileData(t, mem)
	Overwrite(t, mem, 3*mib+5, []byte("unreported"))
	Overwrite(t, state, 0, []byte("new state"))
	opts := chunkstore.PutOptions{Domain: "test", Parent: &p1, Dirty: map[string][]chunkstore.Range{"mem": {{Off: mib + 10, Len: 5}}}}
	c1, st := mustPut(t, s, b, "c1", opts, files...)
	if st.ReadBytes != mib+100 || st.NewChunks != 2 || st.ReusedChunks != 3 {
		t.Errorf("Put(c1, dirty chunk 1) = %+v, want 1 MiB + 100 bytes read, 2 new chunks, 3 reused", st)
	}
	if c1.Parent != "p1" {
		t.Errorf("Put(c1).Parent = %q, want p1", c1.Parent)
	}
	checkRestore(t, s, c1, "mem", want)
	checkRestore(t, s, c1, "state", fileData(t, state))

	// A grown file: its new tail is read even if nothing is reported dirty.
	f, err := os.OpenFile(mem, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	f.Write([]byte("tail"))
	f.Close()
	c2, _ := mustPut(t, s, b, "c2", chunkstore.PutOptions{Domain: "test", Parent: &c1, Dirty: map[string][]chunkstore.Range{"mem": nil}}, files...)
	checkRestore(t, s, c2, "mem", append(want, "tail"...))

	// The parent must still exist once its chunks are leased.
	if err := s.Delete(ctx, "p1"); err != nil {
		t.Fatalf("Delete(p1) = %v", err)
	}
	_, _, err = s.Put(ctx, "c3", files, chunkstore.PutOptions{Domain: "test", Parent: &p1, Dirty: map[string][]chunkstore.Range{"mem": nil}})
	if !errors.Is(err, chunkstore.ErrNotFound) {
		t.Errorf("Put(c3) with deleted parent = %v, want ErrNotFound", err)
	}
	if _, err := s.Get(ctx, "c3"); !errors.Is(err, chunkstore.ErrNotFound) {
		t.Errorf("Get(c3) after failed Put = %v, want ErrNotFound", err)
	}
}

// onePut stores a file of n random chunks as id and returns its manifest
// and content.
func onePut(t *testing.T, s *chunkstore.Store, b chunkstore.Backend, id string, seed uint64, n int) (chunkstore.Manifest, []byte, chunkstore.PutStats) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	data := random(seed, n*mib)
	writeFile(t, p, int64(len(data)), seg{0, data})
	m, st := mustPut(t, s, b, id, chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "f", Path: p})
	return m, data, st
}

// checkRestoreFails restores f of m and checks the error and that nothing
// is left behind.
func checkRestoreFails(t *testing.T, s *chunkstore.Store, m chunkstore.Manifest, want ...error) {
	t.Helper()
	dir := t.TempDir()
	err := s.Restore(t.Context(), m, "f", filepath.Join(dir, "f"))
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Errorf("Restore = %v, want an error wrapping %v", err, w)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("failed Restore left %v behind", left)
	}
}

func testCorrupt(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	s := newStore(t, b, &Clock{})
	m, data, _ := onePut(t, s, b, "s1", 30, 3)
	ref := m.Files[0].Chunks[1]
	key := chunkstore.ChunkKey(ref.Digest)

	bad := bytes.Clone(data[mib : 2*mib])
	bad[12345] ^= 1
	Put(t, b, key, bad)
	checkRestoreFails(t, s, m, chunkstore.ErrCorrupt, errkind.Internal)

	Put(t, b, key, data[mib:2*mib-1])
	checkRestoreFails(t, s, m, chunkstore.ErrCorrupt)

	Put(t, b, key, append(bytes.Clone(data[mib:2*mib]), 0))
	checkRestoreFails(t, s, m, chunkstore.ErrCorrupt)

	// A damaged manifest is reported, and stops GC from deleting anything.
	Put(t, b, chunkstore.ManifestKey("s1"), []byte(`{"version": 1, "id": "s1", "files": [`))
	if _, err := s.Get(ctx, "s1"); !errors.Is(err, chunkstore.ErrCorrupt) {
		t.Errorf("Get(damaged manifest) = %v, want ErrCorrupt", err)
	}
	before := list(t, b, "chunks/")
	if _, err := s.GC(ctx); !errors.Is(err, chunkstore.ErrCorrupt) {
		t.Errorf("GC with a damaged manifest = %v, want ErrCorrupt", err)
	}
	if after := list(t, b, "chunks/"); !cmp.Equal(before, after) {
		t.Errorf("GC with a damaged manifest changed chunks from %q to %q", before, after)
	}
}

// testCompression stores a compressible chunk, a random one and a page
// among zeros: the random one raw, the others compressed. A store that
// does not compress reuses them all; damage to a compressed one is
// ErrCorrupt.
func testCompression(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	s := newStore(t, b, &Clock{})
	text := bytes.Repeat([]byte("struct task_struct { pid 4242, state RUNNING } "), mib/40)[:mib]
	p := filepath.Join(t.TempDir(), "mem")
	writeFile(t, p, 3*mib, seg{0, text}, seg{mib, random(110, mib)}, seg{2*mib + 8192, random(111, 4096)})
	data := fileData(t, p)
	m, st := mustPut(t, s, b, "s1", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "f", Path: p})
	var encs []string
	for _, c := range m.Files[0].Chunks {
		encs = append(encs, c.Encoding)
	}
	if want := []string{chunkstore.EncodingZstd, chunkstore.EncodingRaw, chunkstore.EncodingZstd}; !cmp.Equal(encs, want) {
		t.Errorf("Put: chunk encodings %q, want %q", encs, want)
	}
	if stored := st.NewBytes - st.ManifestBytes; st.RawNewBytes != 3*mib || stored > mib+16<<10 {
		t.Errorf("Put = %+v, want 3 MiB of chunks stored in little more than the random 1 MiB", st)
	}
	checkRestore(t, s, m, "f", data)

	raw, err := chunkstore.New(chunkstore.Config{Backend: b, ChunkSize: mib, Compression: "none"})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	m2, st := mustPut(t, raw, b, "s2", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "f", Path: p})
	if st.NewChunks != 0 || st.ReusedChunks != 3 || !cmp.Equal(m2.Files[0].Chunks, m.Files[0].Chunks) {
		t.Errorf("Put(same content) without compression = %+v, refs %+v, want the 3 stored chunks reused as they are", st, m2.Files[0].Chunks)
	}
	checkRestore(t, raw, m2, "f", data)

	key := chunkstore.ChunkKey(m.Files[0].Chunks[2].Digest) + ".zst"
	good := Read(t, b, key)
	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 0xff
	Put(t, b, key, bad)
	checkRestoreFails(t, s, m, chunkstore.ErrCorrupt)
	Put(t, b, key, good[:len(good)-1])
	checkRestoreFails(t, s, m, chunkstore.ErrCorrupt)
	if err := b.Delete(ctx, key); err != nil {
		t.Fatalf("setup: %v", err)
	}
	checkRestoreFails(t, s, m, chunkstore.ErrChunkMissing)
}

func testMissing(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	s := newStore(t, b, &Clock{})
	m, data, _ := onePut(t, s, b, "s1", 40, 2)
	if err := b.Delete(ctx, chunkstore.ChunkKey(m.Files[0].Chunks[0].Digest)); err != nil {
		t.Fatalf("setup: %v", err)
	}
	checkRestoreFails(t, s, m, chunkstore.ErrChunkMissing, chunkstore.ErrCorrupt)

	// Storing the same content again puts the lost chunk back.
	if _, _, st := onePut(t, s, b, "s2", 40, 2); st.NewChunks != 1 || st.ReusedChunks != 1 {
		t.Errorf("Put(same content) = %+v, want the lost chunk stored again and the other reused", st)
	}
	checkRestore(t, s, m, "f", data)
}

func testBadInput(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	s := newStore(t, b, &Clock{})
	p := filepath.Join(t.TempDir(), "f")
	writeFile(t, p, 10, seg{0, []byte("0123456789")})
	good := []chunkstore.File{{Name: "f", Path: p}}
	parent := chunkstore.Manifest{Version: 1, ID: "p", ChunkSize: mib, Files: []chunkstore.FileEntry{{Name: "f", Size: 10}}}

	badIDs := []string{"", "a/b", "..", ".", "../x", "x/..", "/abs", "-x", ".hidden", "a b", "x\x00", strings.Repeat("a", 129)}
	for _, id := range badIDs {
		if _, _, err := s.Put(ctx, id, good, chunkstore.PutOptions{Domain: "test"}); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Put(id %q) = %v, want InvalidArgument", id, err)
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Get(%q) = %v, want InvalidArgument", id, err)
		}
		if err := s.Delete(ctx, id); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Delete(%q) = %v, want InvalidArgument", id, err)
		}
		if _, _, err := s.Put(ctx, "ok", []chunkstore.File{{Name: id, Path: p}}, chunkstore.PutOptions{Domain: "test"}); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Put(file name %q) = %v, want InvalidArgument", id, err)
		}
	}
	for _, tc := range []struct {
		name  string
		files []chunkstore.File
		opts  chunkstore.PutOptions
	}{
		{"duplicate file name", []chunkstore.File{{Name: "f", Path: p}, {Name: "f", Path: p}}, chunkstore.PutOptions{Domain: "test"}},
		{"empty path", []chunkstore.File{{Name: "f"}}, chunkstore.PutOptions{Domain: "test"}},
		{"no dedup domain", good, chunkstore.PutOptions{}},
		{"dedup domain with a space", good, chunkstore.PutOptions{Domain: "team a"}},
		{"dirty without parent", good, chunkstore.PutOptions{Domain: "test", Dirty: map[string][]chunkstore.Range{"f": nil}}},
		{"dirty for unknown file", good, chunkstore.PutOptions{Domain: "test", Parent: &parent, Dirty: map[string][]chunkstore.Range{"g": nil}}},
		{"negative range", good, chunkstore.PutOptions{Domain: "test", Parent: &parent, Dirty: map[string][]chunkstore.Range{"f": {{Off: -1, Len: 2}}}}},
		{"empty range", good, chunkstore.PutOptions{Domain: "test", Parent: &parent, Dirty: map[string][]chunkstore.Range{"f": {{Off: 0, Len: 0}}}}},
		{"invalid parent", good, chunkstore.PutOptions{Domain: "test", Parent: &chunkstore.Manifest{ID: "../p"}}},
	} {
		if _, _, err := s.Put(ctx, "ok", tc.files, tc.opts); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Put(%s) = %v, want InvalidArgument", tc.name, err)
		}
	}
	if keys := list(t, b, ""); len(keys) != 0 {
		t.Errorf("bad input wrote %q, want nothing", keys)
	}

	m, _ := mustPut(t, s, b, "ok", chunkstore.PutOptions{Domain: "test"}, good...)
	if _, _, err := s.Put(ctx, "ok", good, chunkstore.PutOptions{Domain: "test"}); !errors.Is(err, chunkstore.ErrExists) || !errors.Is(err, errkind.Conflict) {
		t.Errorf("Put(existing id) = %v, want ErrExists (Conflict)", err)
	}
	if err := s.Restore(ctx, m, "nope", filepath.Join(t.TempDir(), "x")); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Restore(unknown file) = %v, want NotFound", err)
	}
	bad := m
	bad.Files = []chunkstore.FileEntry{{Name: "f", Size: 10, Chunks: []chunkstore.ChunkRef{{Offset: 3, Length: 7}}}}
	if err := s.Restore(ctx, bad, "f", filepath.Join(t.TempDir(), "x")); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Restore(misaligned chunk) = %v, want InvalidArgument", err)
	}
	if _, err := s.Get(ctx, "missing"); !errors.Is(err, chunkstore.ErrNotFound) || !errors.Is(err, errkind.NotFound) {
		t.Errorf("Get(missing) = %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "missing"); !errors.Is(err, chunkstore.ErrNotFound) {
		t.Errorf("Delete(missing) = %v, want ErrNotFound", err)
	}
}
