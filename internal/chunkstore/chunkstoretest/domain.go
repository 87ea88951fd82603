package chunkstoretest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/chunkstore"
	"space/internal/errkind"
)

// recorder is a Backend that records the chunk requests made through it.
type recorder struct {
	chunkstore.Backend

	mu sync.Mutex
	// +checklocks:mu
	ops []chunkOp
}

// chunkOp is one request for a chunk object.
type chunkOp struct {
	Op    string // "stat", "get", "put" or "delete"
	Key   string
	Found bool  // stat and get: the object existed
	Size  int64 // put: bytes written
}

func (r *recorder) record(op chunkOp) {
	if !strings.HasPrefix(op.Key, "chunks/") {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
}

// take returns the requests recorded since the last take.
func (r *recorder) take() []chunkOp {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := r.ops
	r.ops = nil
	return ops
}

func (r *recorder) Stat(ctx context.Context, key string) (chunkstore.ObjectInfo, error) {
	o, err := r.Backend.Stat(ctx, key)
	r.record(chunkOp{Op: "stat", Key: key, Found: err == nil})
	return o, err
}

func (r *recorder) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := r.Backend.Get(ctx, key)
	r.record(chunkOp{Op: "get", Key: key, Found: err == nil})
	return rc, err
}

func (r *recorder) Put(ctx context.Context, key string, rd io.Reader, size int64) error {
	r.record(chunkOp{Op: "put", Key: key, Size: size})
	return r.Backend.Put(ctx, key, rd, size)
}

func (r *recorder) Delete(ctx context.Context, key string) error {
	r.record(chunkOp{Op: "delete", Key: key})
	return r.Backend.Delete(ctx, key)
}

// shape is what a tenant could time of a Put's chunk requests: their
// kinds, outcomes and sizes, sorted (uploads run concurrently), without
// the keys.
func shape(ops []chunkOp) []string {
	out := make([]string, len(ops))
	for i, o := range ops {
		out[i] = fmt.Sprintf("%s found=%v size=%d", o.Op, o.Found, o.Size)
	}
	slices.Sort(out)
	return out
}

// chunkKeys returns the keys of both encodings of every chunk m names.
func chunkKeys(m chunkstore.Manifest) map[string]bool {
	keys := map[string]bool{}
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			keys[chunkstore.ChunkKey(c.Digest)] = true
			keys[chunkstore.ChunkKey(c.Digest)+".zst"] = true
		}
	}
	return keys
}

// testDomains: a chunk deduplicates only within its dedup domain. Team B
// storing the bytes team A stored costs, and asks the backend, exactly
// what storing other bytes costs, and never touches a chunk of A's; within
// a domain identical chunks are still stored once; each domain's snapshot
// restores, and GC collects one domain's chunks without touching
// another's.
func testDomains(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	rec := &recorder{Backend: b}
	s := newStore(t, rec, &Clock{})
	dir := t.TempDir()
	// 4.5 chunks of random bytes (incompressible: stored raw, so sizes
	// compare exactly) after a hole.
	const size = 6*mib + mib/2
	secret, other := random(70, 4*mib+mib/2), random(71, 4*mib+mib/2)
	pSecret, pOther := filepath.Join(dir, "secret"), filepath.Join(dir, "other")
	writeFile(t, pSecret, size, seg{2 * mib, secret})
	writeFile(t, pOther, size, seg{2 * mib, other})
	put := func(id, domain, path string) (chunkstore.Manifest, chunkstore.PutStats, []chunkOp) {
		t.Helper()
		rec.take()
		m, st := mustPut(t, s, b, id, chunkstore.PutOptions{Domain: domain}, chunkstore.File{Name: "mem", Path: path})
		return m, st, rec.take()
	}

	a1, stA1, _ := put("a1", "team-a", pSecret)
	if stA1.NewChunks != 5 || stA1.ReusedChunks != 0 {
		t.Errorf("Put(a1) = %+v, want 5 new chunks, none reused", stA1)
	}
	// The attacker's probe: B stores A's bytes; C, with no one to match,
	// stores others. Both are the first snapshot of their domain.
	bSame, stSame, opsSame := put("b-same", "team-b", pSecret)
	cOther, stOther, opsOther := put("c-other", "team-c", pOther)
	chunksOnly := func(st chunkstore.PutStats) chunkstore.PutStats {
		st.NewBytes -= st.ManifestBytes // IDs and times differ in length
		st.ManifestBytes = 0
		return st
	}
	if diff := cmp.Diff(chunksOnly(stOther), chunksOnly(stSame)); diff != "" {
		t.Errorf("Put of team A's bytes in domain team-b stats differ from other bytes in team-c (-other +same):\n%s", diff)
	}
	if diff := cmp.Diff(shape(opsOther), shape(opsSame)); diff != "" {
		t.Errorf("Put of team A's bytes in domain team-b made other backend requests than other bytes in team-c (-other +same):\n%s", diff)
	}
	ofA := chunkKeys(a1)
	for _, op := range opsSame {
		if ofA[op.Key] {
			t.Errorf("Put in domain team-b requested %s %s, a chunk of team-a's", op.Op, op.Key)
		}
	}
	for _, f := range bSame.Files {
		for _, c := range f.Chunks {
			if ofA[chunkstore.ChunkKey(c.Digest)] {
				t.Errorf("b-same names chunk %s of a1", c.Digest)
			}
			if want := chunkstore.SumIn("team-b", secret[c.Offset-2*mib:c.Offset-2*mib+c.Length]); c.Digest != want {
				t.Errorf("b-same chunk at %d: digest %s, want SumIn(team-b) %s", c.Offset, c.Digest, want)
			}
		}
	}
	if bSame.Domain != "team-b" {
		t.Errorf("Put(b-same) manifest domain = %q, want team-b", bSame.Domain)
	}

	// Within a domain, identical content is stored once.
	_, stA2, _ := put("a2", "team-a", pSecret)
	if stA2.NewChunks != 0 || stA2.ReusedChunks != 5 {
		t.Errorf("Put(a2) of a1's bytes in team-a = %+v, want no new chunk, 5 reused", stA2)
	}
	_, stB2, _ := put("b2", "team-b", pSecret)
	if stB2.NewChunks != 0 || stB2.ReusedChunks != 5 {
		t.Errorf("Put(b2) of b-same's bytes in team-b = %+v, want no new chunk, 5 reused", stB2)
	}
	want := fileData(t, pSecret)
	checkRestore(t, s, a1, "mem", want)
	checkRestore(t, s, bSame, "mem", want)
	checkRestore(t, s, cOther, "mem", fileData(t, pOther))
	if got, err := s.Get(ctx, "b-same"); err != nil || got.Domain != "team-b" {
		t.Errorf("Get(b-same) = domain %q, %v; want team-b", got.Domain, err)
	}

	// A restore checks each chunk in the manifest's domain: B's manifest
	// relabelled as A's (or as legacy) does not pass.
	for _, domain := range []string{"team-a", ""} {
		forged := bSame
		forged.Domain = domain
		if err := s.Restore(ctx, forged, "mem", filepath.Join(t.TempDir(), "mem")); !errors.Is(err, chunkstore.ErrCorrupt) {
			t.Errorf("Restore(b-same relabelled domain %q) = %v, want ErrCorrupt", domain, err)
		}
	}

	// GC: team A's snapshots go; its chunks go with them, B's and C's stay.
	for _, id := range []string{"a1", "a2"} {
		if err := s.Delete(ctx, id); err != nil {
			t.Fatalf("Delete(%s) = %v", id, err)
		}
	}
	st := runGC(t, s)
	if st.ChunksDeleted != 5 || st.BytesDeleted != int64(len(secret)) {
		t.Errorf("GC after team-a's snapshots went = %+v, want its 5 chunks (%d bytes) deleted", st, len(secret))
	}
	for k := range ofA {
		if _, err := b.Stat(ctx, k); !errors.Is(err, errkind.NotFound) {
			t.Errorf("chunk %s of team-a after GC: Stat = %v, want NotFound", k, err)
		}
	}
	checkRestore(t, s, bSame, "mem", want)
	checkRestore(t, s, cOther, "mem", fileData(t, pOther))
}

// testLegacyManifest: a manifest written before dedup domains (no domain,
// unkeyed digests) still restores and keeps its chunks through GC, and a
// snapshot taken on top of it in a domain names its own chunks.
func testLegacyManifest(t *testing.T, b chunkstore.Backend) {
	ctx := t.Context()
	s := newStore(t, b, &Clock{})
	data := append(random(80, mib), random(81, mib/2)...)
	m := chunkstore.Manifest{Version: 1, ID: "legacy", Created: time.Now().UTC().Truncate(time.Millisecond), ChunkSize: mib,
		Files: []chunkstore.FileEntry{{Name: "mem", Size: int64(len(data)), Mode: 0o600}}}
	for off := 0; off < len(data); off += mib {
		c := data[off:min(off+mib, len(data))]
		d := chunkstore.Sum(c)
		Put(t, b, chunkstore.ChunkKey(d), c)
		m.Files[0].Chunks = append(m.Files[0].Chunks, chunkstore.ChunkRef{Offset: int64(off), Length: int64(len(c)), Digest: d})
	}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if strings.Contains(string(raw), "domain") {
		t.Fatalf("setup: a manifest without a domain encodes one: %s", raw)
	}
	Put(t, b, chunkstore.ManifestKey("legacy"), raw)

	got, err := s.Get(ctx, "legacy")
	if err != nil || got.Domain != "" {
		t.Fatalf("Get(legacy) = domain %q, %v; want the legacy domain", got.Domain, err)
	}
	checkRestore(t, s, got, "mem", data)

	// A snapshot of the restored file on top of it, its one dirty byte
	// aside unchanged: the parent's unkeyed chunks are not the domain's,
	// so it reads and names every chunk itself.
	p := filepath.Join(t.TempDir(), "mem")
	writeFile(t, p, int64(len(data)), seg{0, data})
	Overwrite(t, p, 10, []byte{^data[10]})
	next, st := mustPut(t, s, b, "next", chunkstore.PutOptions{Domain: "team-a", Parent: &got, Dirty: map[string][]chunkstore.Range{"mem": {{Off: 10, Len: 1}}}},
		chunkstore.File{Name: "mem", Path: p})
	if st.ReadBytes != int64(len(data)) || st.NewChunks != 2 {
		t.Errorf("Put on a legacy parent = %+v, want all %d bytes read and 2 new chunks", st, len(data))
	}
	if next.Parent != "legacy" || next.Domain != "team-a" {
		t.Errorf("Put on a legacy parent: manifest parent %q domain %q, want legacy and team-a", next.Parent, next.Domain)
	}
	if k := chunkstore.ChunkKey(next.Files[0].Chunks[1].Digest); chunkKeys(got)[k] {
		t.Errorf("Put on a legacy parent names the legacy chunk %s", k)
	}
	checkRestore(t, s, next, "mem", fileData(t, p))

	if st := runGC(t, s); st.ChunksDeleted != 0 {
		t.Errorf("GC with the legacy manifest in place deleted %d chunks, want 0", st.ChunksDeleted)
	}
	checkRestore(t, s, got, "mem", data)
	if err := s.Delete(ctx, "legacy"); err != nil {
		t.Fatalf("Delete(legacy) = %v", err)
	}
	if st := runGC(t, s); st.ChunksDeleted != 2 {
		t.Errorf("GC after the legacy manifest went deleted %d chunks, want its 2", st.ChunksDeleted)
	}
	checkRestore(t, s, next, "mem", fileData(t, p))
}
