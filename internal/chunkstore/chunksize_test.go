package chunkstore_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkstoretest"
	"space/internal/chunkstore/local"
	"space/internal/errkind"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// sizedStore returns a Store on b cutting files at chunkSize (0 = default).
func sizedStore(t *testing.T, b chunkstore.Backend, chunkSize int64) *chunkstore.Store {
	t.Helper()
	s, err := chunkstore.New(chunkstore.Config{Backend: b, ChunkSize: chunkSize})
	if err != nil {
		t.Fatalf("setup: New(chunk size %d) = %v", chunkSize, err)
	}
	return s
}

func localBackend(t *testing.T) *local.Backend {
	t.Helper()
	b, err := local.New(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return b
}

// randomBytes returns n pseudo-random bytes determined by seed.
func randomBytes(seed byte, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// sparseFile creates a file of size with data written at off.
func sparseFile(t *testing.T, path string, size, off int64, data []byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatalf("setup: %v", err)
	}
}

// restoresTo restores name of m with s and compares it with the file at
// want.
func restoresTo(t *testing.T, s *chunkstore.Store, m chunkstore.Manifest, name, want string) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	if err := s.Restore(t.Context(), m, name, dst); err != nil {
		t.Fatalf("Restore(%s, %s) with chunk size %d = %v", m.ID, name, s.ChunkSize(), err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatalf("read restored: %v", err)
	}
	if wantData, _ := os.ReadFile(want); !bytes.Equal(got, wantData) {
		t.Errorf("Restore(%s, %s) with chunk size %d: content differs from %s", m.ID, name, s.ChunkSize(), want)
	}
}

func TestNewChunkSize(t *testing.T) {
	b := localBackend(t)
	if got := sizedStore(t, b, 0).ChunkSize(); got != chunkstore.DefaultChunkSize {
		t.Errorf("ChunkSize() with none configured = %d, want DefaultChunkSize %d", got, chunkstore.DefaultChunkSize)
	}
	for _, cs := range []int64{chunkstore.MinChunkSize, 8 * kib, chunkstore.DefaultChunkSize, mib, chunkstore.MaxChunkSize} {
		if got := sizedStore(t, b, cs).ChunkSize(); got != cs {
			t.Errorf("ChunkSize() configured %d = %d", cs, got)
		}
	}
	for _, cs := range []int64{-mib, 1, 2 * kib, 3 * 4 * kib, 1000 * kib, 8 * mib} {
		if _, err := chunkstore.New(chunkstore.Config{Backend: b, ChunkSize: cs}); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(chunk size %d) = %v, want InvalidArgument", cs, err)
		}
	}
}

// TestDefaultChunksFollowDirtyPages: scattered page writes cost a default
// (small) chunk each, and files larger than a read batch round-trip.
func TestDefaultChunksFollowDirtyPages(t *testing.T) {
	b := localBackend(t)
	s := sizedStore(t, b, 0)
	cs := s.ChunkSize()
	// Data over more than one 16 MiB read batch, a short last chunk, and a
	// hole at the end.
	p := filepath.Join(t.TempDir(), "mem")
	const data = 17*mib + 5
	sparseFile(t, p, 18*mib+123, 0, randomBytes(1, data))
	files := []chunkstore.File{{Name: "mem", Path: p}}
	parent, st, err := s.Put(t.Context(), "p", files, chunkstore.PutOptions{Domain: "test"})
	if err != nil {
		t.Fatalf("Put(p) = %v", err)
	}
	if n := int((data + cs - 1) / cs); st.NewChunks != n || parent.ChunkSize != cs {
		t.Errorf("Put(p) = %+v, chunk size %d, want %d new chunks of %d", st, parent.ChunkSize, n, cs)
	}
	restoresTo(t, s, parent, "mem", p)

	dirty := []chunkstore.Range{{Off: cs + 8*kib, Len: 4 * kib}, {Off: 100*cs + 4*kib, Len: 4 * kib}, {Off: 17*mib + 2*cs, Len: 4 * kib}}
	for i, r := range dirty {
		chunkstoretest.Overwrite(t, p, r.Off, randomBytes(byte(10+i), int(r.Len)))
	}
	c, st, err := s.Put(t.Context(), "c", files, chunkstore.PutOptions{Domain: "test", Parent: &parent, Dirty: map[string][]chunkstore.Range{"mem": dirty}})
	if err != nil {
		t.Fatalf("Put(c) = %v", err)
	}
	// Two dirtied chunks are read whole; the last page lands in the hole
	// after the data, where only the page itself is data. The two random
	// chunks are stored raw; the third, one random page and zeros,
	// compresses to about that page.
	stored := st.NewBytes - st.ManifestBytes
	if st.NewChunks != 3 || st.ReadBytes != 2*cs+4*kib || st.RawNewBytes != 3*cs || stored < 2*cs+4*kib || stored > 2*cs+5*kib {
		t.Errorf("Put(c) with 3 dirty pages = %+v, want 3 new chunks of %d bytes, %d bytes read, 2 of them stored raw and one as about a page",
			st, cs, 2*cs+4*kib)
	}
	restoresTo(t, s, c, "mem", p)
}

// TestParentOfOtherChunkSize: a parent cut at another size lends no
// chunks; Put reads every file in full rather than fail.
func TestParentOfOtherChunkSize(t *testing.T) {
	ctx := t.Context()
	b := localBackend(t)
	old, cur := sizedStore(t, b, mib), sizedStore(t, b, 0)
	p := filepath.Join(t.TempDir(), "mem")
	sparseFile(t, p, 3*mib, 0, randomBytes(2, 2*mib))
	files := []chunkstore.File{{Name: "mem", Path: p}}
	parent, _, err := old.Put(ctx, "p", files, chunkstore.PutOptions{Domain: "test"})
	if err != nil {
		t.Fatalf("Put(p) with 1 MiB chunks = %v", err)
	}
	// Nothing is reported dirty, yet this changed: only a full read sees
	// it. The parent need not even exist any more.
	chunkstoretest.Overwrite(t, p, mib+7, []byte("unreported"))
	if err := old.Delete(ctx, "p"); err != nil {
		t.Fatalf("Delete(p) = %v", err)
	}
	c, st, err := cur.Put(ctx, "c", files, chunkstore.PutOptions{Domain: "test", Parent: &parent, Dirty: map[string][]chunkstore.Range{"mem": nil}})
	if err != nil {
		t.Fatalf("Put(c) with a 1 MiB parent and %d-byte chunks = %v", cur.ChunkSize(), err)
	}
	if n := int(2 * mib / cur.ChunkSize()); st.ReadBytes != 2*mib || st.NewChunks != n || st.ReusedChunks != 0 {
		t.Errorf("Put(c) = %+v, want all 2 MiB of data read and stored as %d new chunks", st, n)
	}
	if c.Parent != "p" || c.ChunkSize != cur.ChunkSize() {
		t.Errorf("Put(c): Parent %q, ChunkSize %d, want p, %d", c.Parent, c.ChunkSize, cur.ChunkSize())
	}
	restoresTo(t, cur, c, "mem", p)
}

// TestMixedChunkSizes: snapshots cut at 1 MiB (as every manifest was once)
// and at the default size share a backend. Either store reads, restores
// and keeps the other's.
func TestMixedChunkSizes(t *testing.T) {
	ctx := t.Context()
	b := localBackend(t)
	old, cur := sizedStore(t, b, mib), sizedStore(t, b, 0)
	dir := t.TempDir()
	po, pc := filepath.Join(dir, "old"), filepath.Join(dir, "cur")
	sparseFile(t, po, 3*mib+777, 2*mib-100, randomBytes(3, mib+877)) // chunks 1, 2, 3 of 1 MiB
	sparseFile(t, pc, 2*mib, 4*kib, randomBytes(4, 300*kib))
	if _, _, err := old.Put(ctx, "old", []chunkstore.File{{Name: "f", Path: po}}, chunkstore.PutOptions{Domain: "test"}); err != nil {
		t.Fatalf("Put(old) with 1 MiB chunks = %v", err)
	}
	if _, _, err := cur.Put(ctx, "cur", []chunkstore.File{{Name: "f", Path: pc}}, chunkstore.PutOptions{Domain: "test"}); err != nil {
		t.Fatalf("Put(cur) with %d-byte chunks = %v", cur.ChunkSize(), err)
	}
	// check has both stores Get and Restore both snapshots.
	check := func(when string) {
		t.Helper()
		for _, s := range []*chunkstore.Store{old, cur} {
			for _, snap := range []struct {
				id, path  string
				chunkSize int64
			}{{"old", po, mib}, {"cur", pc, chunkstore.DefaultChunkSize}} {
				m, err := s.Get(ctx, snap.id)
				if err != nil {
					t.Fatalf("%s: Get(%s) with chunk size %d = %v", when, snap.id, s.ChunkSize(), err)
				}
				if m.ChunkSize != snap.chunkSize {
					t.Errorf("%s: Get(%s).ChunkSize = %d, want %d", when, snap.id, m.ChunkSize, snap.chunkSize)
				}
				restoresTo(t, s, m, "f", snap.path)
			}
		}
	}
	check("after Put")
	for _, s := range []*chunkstore.Store{cur, old} {
		st, err := s.GC(ctx)
		if err != nil || st.Manifests != 2 || st.ChunksDeleted != 0 {
			t.Errorf("GC with chunk size %d = %+v, %v, want 2 manifests read, nothing deleted", s.ChunkSize(), st, err)
		}
		check("after GC")
	}
}
