package chunkstoretest

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/chunkstore"
	"space/internal/errkind"
)

// hooked wraps a backend and calls hooks before and after its operations,
// so a test can run GC (or a writer) at an exact step of the other.
type hooked struct {
	chunkstore.Backend
	beforePut    func(key string) error     // or nil
	beforeDelete func(key string) error     // or nil
	beforeList   func(prefix string)        // or nil
	afterList    func(prefix string, n int) // or nil; n objects were listed
}

func (h *hooked) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if h.beforePut != nil {
		if err := h.beforePut(key); err != nil {
			return err
		}
	}
	return h.Backend.Put(ctx, key, r, size)
}

func (h *hooked) Delete(ctx context.Context, key string) error {
	if h.beforeDelete != nil {
		if err := h.beforeDelete(key); err != nil {
			return err
		}
	}
	return h.Backend.Delete(ctx, key)
}

func (h *hooked) List(ctx context.Context, prefix string, fn func(chunkstore.ObjectInfo) error) error {
	if h.beforeList != nil {
		h.beforeList(prefix)
	}
	n := 0
	err := h.Backend.List(ctx, prefix, func(o chunkstore.ObjectInfo) error {
		n++
		return fn(o)
	})
	if h.afterList != nil {
		h.afterList(prefix, n)
	}
	return err
}

// twoSnapshots stores s1 = [x, shared] and s2 = [shared, y], each chunk
// 1 MiB, and returns their manifests and contents.
func twoSnapshots(t *testing.T, s *chunkstore.Store, b chunkstore.Backend) (m1, m2 chunkstore.Manifest, d1, d2 []byte) {
	t.Helper()
	dir := t.TempDir()
	shared := random(50, mib)
	d1 = append(random(51, mib), shared...)
	d2 = append(shared, random(52, mib)...)
	p1, p2 := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	writeFile(t, p1, 2*mib, seg{0, d1})
	writeFile(t, p2, 2*mib, seg{0, d2})
	m1, _ = mustPut(t, s, b, "s1", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "f", Path: p1})
	m2, _ = mustPut(t, s, b, "s2", chunkstore.PutOptions{Domain: "test"}, chunkstore.File{Name: "f", Path: p2})
	return m1, m2, d1, d2
}

func runGC(t *testing.T, s *chunkstore.Store) chunkstore.GCStats {
	t.Helper()
	st, err := s.GC(t.Context())
	if err != nil {
		t.Fatalf("GC = %v", err)
	}
	return st
}

func testGC(t *testing.T, b chunkstore.Backend) {
	s := newStore(t, b, &Clock{})
	m1, m2, d1, d2 := twoSnapshots(t, s, b)
	junk := random(53, 1000)
	Put(t, b, chunkstore.ChunkKey(chunkstore.Sum(junk)), junk)
	Put(t, b, "chunks/zz/not-a-chunk", []byte("foreign")) // not ours: left alone

	st := runGC(t, s)
	want := chunkstore.GCStats{Manifests: 2, ChunksScanned: 4, BytesScanned: 3*mib + 1000, ChunksDeleted: 1, BytesDeleted: 1000}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("GC stats (-want +got):\n%s", diff)
	}
	if _, err := b.Stat(t.Context(), chunkstore.ChunkKey(chunkstore.Sum(junk))); !errors.Is(err, errkind.NotFound) {
		t.Errorf("unreferenced chunk after GC: Stat = %v, want NotFound", err)
	}
	if got := list(t, b, "chunks/zz/"); !cmp.Equal(got, []string{"chunks/zz/not-a-chunk"}) {
		t.Errorf("foreign objects after GC = %q, want kept", got)
	}
	if got := append(list(t, b, "gc/"), list(t, b, "leases/")...); len(got) != 0 {
		t.Errorf("GC left %q behind", got)
	}
	checkRestore(t, s, m1, "f", d1)
	checkRestore(t, s, m2, "f", d2)
}

func testGCGrace(t *testing.T, b chunkstore.Backend) {
	clock := &Clock{}
	s, err := chunkstore.New(chunkstore.Config{Backend: b, GCGrace: time.Hour, Now: clock.Now})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	junk := random(54, 1000)
	Put(t, b, chunkstore.ChunkKey(chunkstore.Sum(junk)), junk)
	if st := runGC(t, s); st.ChunksDeleted != 0 {
		t.Errorf("GC within the grace period deleted %d chunks, want 0", st.ChunksDeleted)
	}
	clock.Advance(2 * time.Hour)
	if st := runGC(t, s); st.ChunksDeleted != 1 {
		t.Errorf("GC after the grace period deleted %d chunks, want 1", st.ChunksDeleted)
	}
}

func testDeleteThenGC(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	s := newStore(t, b, &Clock{})
	_, m2, _, d2 := twoSnapshots(t, s, b)
	if err := s.Delete(ctx, "s1"); err != nil {
		t.Fatalf("Delete(s1) = %v", err)
	}
	if _, err := s.Get(ctx, "s1"); !errors.Is(err, chunkstore.ErrNotFound) {
		t.Errorf("Get(s1) after Delete = %v, want ErrNotFound", err)
	}
	before := storedBytes(t, b)
	var chunkBytes int64
	if err := b.List(ctx, "chunks/", func(o chunkstore.ObjectInfo) error { chunkBytes += o.Size; return nil }); err != nil {
		t.Fatalf("List(chunks/) = %v", err)
	}
	st := runGC(t, s)
	if st.ChunksDeleted != 1 || st.BytesDeleted != mib {
		t.Errorf("GC after Delete(s1) = %+v, want s1's one unshared chunk (1 MiB) deleted", st)
	}
	if st.BytesScanned != chunkBytes {
		t.Errorf("GC BytesScanned = %d, want the %d bytes of chunks stored", st.BytesScanned, chunkBytes)
	}
	if freed := before - storedBytes(t, b); freed != st.BytesDeleted {
		t.Errorf("GC freed %d bytes, stats.BytesDeleted = %d", freed, st.BytesDeleted)
	}
	checkRestore(t, s, m2, "f", d2)

	if err := s.Delete(ctx, "s2"); err != nil {
		t.Fatalf("Delete(s2) = %v", err)
	}
	if st := runGC(t, s); st.ChunksDeleted != 2 {
		t.Errorf("GC after Delete(s2) = %+v, want 2 chunks deleted", st)
	}
	if keys := list(t, b, ""); len(keys) != 0 {
		t.Errorf("store after deleting every snapshot and GC holds %q, want nothing", keys)
	}
}

// testGCKeepsLeased runs GC between a writer finding its chunks already
// stored (unreferenced: their snapshot was deleted) and its manifest
// landing. The writer's lease must keep them.
func testGCKeepsLeased(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	clock := &Clock{}
	plain := newStore(t, b, clock)
	_, data, _ := onePut(t, plain, b, "old", 60, 3)
	if err := plain.Delete(ctx, "old"); err != nil {
		t.Fatalf("setup: %v", err)
	}

	var gcStats chunkstore.GCStats
	var gcErr error
	ran := false
	h := &hooked{Backend: b, beforePut: func(key string) error {
		if key == chunkstore.ManifestKey("new") {
			ran = true
			gcStats, gcErr = plain.GC(ctx)
		}
		return nil
	}}
	p := filepath.Join(t.TempDir(), "f")
	writeFile(t, p, int64(len(data)), seg{0, data})
	m, st, err := newStore(t, h, clock).Put(ctx, "new", []chunkstore.File{{Name: "f", Path: p}}, chunkstore.PutOptions{Domain: "test"})
	if err != nil {
		t.Fatalf("Put(new) = %v", err)
	}
	if !ran || gcErr != nil {
		t.Fatalf("GC during Put: ran %v, err %v", ran, gcErr)
	}
	if st.NewChunks != 0 || st.ReusedChunks != 3 {
		t.Errorf("Put(new) = %+v, want all 3 chunks reused", st)
	}
	if gcStats.ChunksDeleted != 0 || gcStats.LiveLeases != 1 {
		t.Errorf("GC during Put = %+v, want 1 live lease and nothing deleted", gcStats)
	}
	checkRestore(t, plain, m, "f", data)
	if st := runGC(t, plain); st.ChunksDeleted != 0 {
		t.Errorf("GC after Put = %+v, want nothing deleted", st)
	}
}

// testWriterWaitsForGC starts a writer after GC has read the leases but
// before it deletes: GC does not know the writer, so it deletes the
// (unreferenced) chunks the writer is about to reuse. The writer must see
// GC's marker, wait for the run to end, and then store the chunks again.
func testWriterWaitsForGC(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	clock := &Clock{}
	plain := newStore(t, b, clock)
	_, data, _ := onePut(t, plain, b, "old", 70, 3)
	if err := plain.Delete(ctx, "old"); err != nil {
		t.Fatalf("setup: %v", err)
	}
	p := filepath.Join(t.TempDir(), "f")
	writeFile(t, p, int64(len(data)), seg{0, data})

	sawGC := make(chan struct{})
	var once sync.Once
	writerB := &hooked{Backend: b, afterList: func(prefix string, n int) {
		if prefix == "gc/" && n > 0 {
			once.Do(func() { close(sawGC) })
		}
	}}
	writer := newStore(t, writerB, clock)
	type result struct {
		m   chunkstore.Manifest
		st  chunkstore.PutStats
		err error
	}
	done := make(chan result, 1)
	started := false
	gcB := &hooked{Backend: b, beforeList: func(prefix string) {
		if prefix != "manifests/" || started {
			return
		}
		started = true
		go func() {
			m, st, err := writer.Put(ctx, "new", []chunkstore.File{{Name: "f", Path: p}}, chunkstore.PutOptions{Domain: "test"})
			done <- result{m, st, err}
		}()
		select {
		case <-sawGC: // the writer is now waiting for this GC run
		case r := <-done:
			done <- r // finished without seeing the marker; checked below
		}
	}}
	gcStats := runGC(t, newStore(t, gcB, clock))
	r := <-done
	select {
	case <-sawGC:
	default:
		t.Errorf("writer never saw the running GC's marker")
	}
	if r.err != nil {
		t.Fatalf("Put(new) during GC = %v", r.err)
	}
	if gcStats.ChunksDeleted != 3 {
		t.Errorf("GC = %+v, want the 3 unreferenced chunks deleted", gcStats)
	}
	if r.st.NewChunks != 3 {
		t.Errorf("Put(new) during GC = %+v, want the 3 deleted chunks stored again", r.st)
	}
	checkRestore(t, plain, r.m, "f", data)
}

// testExpiredLease leaves a crashed writer's lease behind: it protects the
// writer's chunks until it expires, then GC removes both.
func testExpiredLease(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	clock := &Clock{}
	crash := errors.New("simulated crash")
	h := &hooked{
		Backend: b,
		beforePut: func(key string) error {
			if strings.HasPrefix(key, "manifests/") {
				return crash
			}
			return nil
		},
		beforeDelete: func(key string) error {
			if strings.HasPrefix(key, "leases/") {
				return crash
			}
			return nil
		},
	}
	p := filepath.Join(t.TempDir(), "f")
	writeFile(t, p, 3*mib, seg{0, random(80, 3*mib)})
	if _, _, err := newStore(t, h, clock).Put(ctx, "s", []chunkstore.File{{Name: "f", Path: p}}, chunkstore.PutOptions{Domain: "test"}); !errors.Is(err, crash) {
		t.Fatalf("Put with crashing backend = %v, want the crash", err)
	}
	if len(list(t, b, "leases/")) == 0 {
		t.Fatalf("setup: crashed Put left no lease")
	}
	s := newStore(t, b, clock)
	if st := runGC(t, s); st.ChunksDeleted != 0 || st.LiveLeases != 1 {
		t.Errorf("GC with the lease live = %+v, want 1 live lease, nothing deleted", st)
	}
	clock.Advance(leaseTTL + skew + time.Second)
	if st := runGC(t, s); st.ChunksDeleted != 3 || st.ExpiredLeases != 1 {
		t.Errorf("GC after the lease expired = %+v, want 3 chunks deleted, 1 expired lease", st)
	}
	if keys := list(t, b, ""); len(keys) != 0 {
		t.Errorf("after GC the store holds %q, want nothing", keys)
	}
}

// testPutLeaseExpires stalls a writer past its lease: it must not commit.
func testPutLeaseExpires(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	clock := &Clock{}
	var stall sync.Once // chunk uploads run concurrently
	h := &hooked{Backend: b, beforePut: func(key string) error {
		if strings.HasPrefix(key, "chunks/") {
			stall.Do(func() { clock.Advance(leaseTTL + time.Second) })
		}
		return nil
	}}
	p := filepath.Join(t.TempDir(), "f")
	writeFile(t, p, 2*mib, seg{0, random(90, 2*mib)})
	s := newStore(t, h, clock)
	_, _, err := s.Put(ctx, "s", []chunkstore.File{{Name: "f", Path: p}}, chunkstore.PutOptions{Domain: "test"})
	if !errors.Is(err, chunkstore.ErrLeaseExpired) || !errors.Is(err, errkind.Unavailable) {
		t.Errorf("Put stalled past its lease = %v, want ErrLeaseExpired (Unavailable)", err)
	}
	if _, err := s.Get(ctx, "s"); !errors.Is(err, chunkstore.ErrNotFound) {
		t.Errorf("Get after the expired Put = %v, want ErrNotFound", err)
	}
	if got := list(t, b, "leases/"); len(got) != 0 {
		t.Errorf("expired Put left lease %q", got)
	}
}

// testStalledGC stalls a GC run past its marker: it must not delete, since
// writers may have stopped waiting for it.
func testStalledGC(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	clock := &Clock{}
	plain := newStore(t, b, clock)
	onePut(t, plain, b, "old", 100, 2)
	if err := plain.Delete(ctx, "old"); err != nil {
		t.Fatalf("setup: %v", err)
	}
	h := &hooked{Backend: b, beforeList: func(prefix string) {
		if prefix == "manifests/" {
			clock.Advance(leaseTTL + time.Second)
		}
	}}
	st, err := newStore(t, h, clock).GC(ctx)
	if !errors.Is(err, errkind.Unavailable) || st.ChunksDeleted != 0 {
		t.Errorf("stalled GC = %+v, %v, want nothing deleted and an Unavailable error", st, err)
	}
	if n := len(list(t, b, "chunks/")); n != 2 {
		t.Errorf("after the stalled GC %d chunks are left, want 2", n)
	}
	if got := list(t, b, "gc/"); len(got) != 0 {
		t.Errorf("stalled GC left marker %q", got)
	}
}
