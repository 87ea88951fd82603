package chunkcache

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkstoretest"
	"space/internal/chunkstore/local"
)

// countingBackend is a real local backend that counts the Gets it serves.
type countingBackend struct {
	chunkstore.Backend
	mu sync.Mutex
	// +checklocks:mu
	gets map[string]int
}

func (c *countingBackend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	c.mu.Lock()
	c.gets[key]++
	c.mu.Unlock()
	return c.Backend.Get(ctx, key)
}

func (c *countingBackend) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets[key]
}

func newRemote(t *testing.T) *countingBackend {
	t.Helper()
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatalf("setup: local.New = %v", err)
	}
	return &countingBackend{Backend: l, gets: map[string]int{}}
}

func newCache(t *testing.T, remote chunkstore.Backend, dir string, max int64) *Backend {
	t.Helper()
	b, err := New(t.Context(), Config{Remote: remote, Dir: dir, MaxBytes: max})
	if err != nil {
		t.Fatalf("setup: New = %v", err)
	}
	return b
}

// TestConformance runs the backend suite on a cache in front of a local
// directory.
func TestConformance(t *testing.T) {
	chunkstoretest.Run(t, func(t *testing.T) chunkstore.Backend {
		return newCache(t, newRemote(t), t.TempDir(), 1<<30)
	})
}

func put(t *testing.T, b chunkstore.Backend, key, data string) {
	t.Helper()
	chunkstoretest.Put(t, b, key, []byte(data))
}

func get(t *testing.T, b chunkstore.Backend, key string) string {
	t.Helper()
	return string(chunkstoretest.Read(t, b, key))
}

func TestChunksFetchedOnce(t *testing.T) {
	remote := newRemote(t)
	put(t, remote, "chunks/aa/one", "chunk one")
	put(t, remote, "manifests/m", "manifest")
	c := newCache(t, remote, t.TempDir(), 1<<20)
	for range 3 {
		if got := get(t, c, "chunks/aa/one"); got != "chunk one" {
			t.Fatalf("Get(chunks/aa/one) = %q, want %q", got, "chunk one")
		}
		get(t, c, "manifests/m")
	}
	if n := remote.count("chunks/aa/one"); n != 1 {
		t.Errorf("remote Gets of a chunk read 3 times = %d, want 1", n)
	}
	if n := remote.count("manifests/m"); n != 3 {
		t.Errorf("remote Gets of a manifest read 3 times = %d, want 3 (manifests are not cached)", n)
	}
	if got := c.Size(); got != int64(len("chunk one")) {
		t.Errorf("Size() = %d, want %d", got, len("chunk one"))
	}
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	remote := newRemote(t)
	for _, k := range []string{"a", "b", "c"} {
		put(t, remote, "chunks/00/"+k, strings.Repeat(k, 100))
	}
	dir := t.TempDir()
	c := newCache(t, remote, dir, 250)
	get(t, c, "chunks/00/a")
	get(t, c, "chunks/00/b")
	get(t, c, "chunks/00/a") // b is now the least recently used
	get(t, c, "chunks/00/c") // 300 bytes > 250: b goes
	if got := c.Size(); got != 200 {
		t.Errorf("Size() = %d, want 200", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "chunks", "00", "b")); !os.IsNotExist(err) {
		t.Errorf("evicted chunk's file: Stat = %v, want not exist", err)
	}
	get(t, c, "chunks/00/a")
	get(t, c, "chunks/00/b")
	if n, want := remote.count("chunks/00/a"), 1; n != want {
		t.Errorf("remote Gets of a = %d, want %d", n, want)
	}
	if n, want := remote.count("chunks/00/b"), 2; n != want {
		t.Errorf("remote Gets of evicted b = %d, want %d", n, want)
	}
}

// TestReopenCountsAndTrims: a new process counts what the last one left
// and trims it to a smaller bound.
func TestReopenCountsAndTrims(t *testing.T) {
	remote := newRemote(t)
	dir := t.TempDir()
	c := newCache(t, remote, dir, 1000)
	for _, k := range []string{"a", "b", "c"} {
		put(t, remote, "chunks/00/"+k, strings.Repeat(k, 100))
		get(t, c, "chunks/00/"+k)
	}
	again := newCache(t, remote, dir, 1000)
	if got := again.Size(); got != 300 {
		t.Errorf("Size() after reopening = %d, want 300", got)
	}
	smaller := newCache(t, remote, dir, 150)
	if got := smaller.Size(); got != 100 {
		t.Errorf("Size() reopened with a 150-byte bound = %d, want 100", got)
	}
	get(t, smaller, "chunks/00/c")
	if n := remote.count("chunks/00/c"); n != 1 {
		t.Errorf("remote Gets of c, the newest, kept on reopening = %d, want 1", n)
	}
}

func TestDeleteAndPutDropCopy(t *testing.T) {
	remote := newRemote(t)
	put(t, remote, "chunks/00/a", "old")
	c := newCache(t, remote, t.TempDir(), 1<<20)
	get(t, c, "chunks/00/a")
	put(t, c, "chunks/00/a", "new")
	if got := get(t, c, "chunks/00/a"); got != "new" {
		t.Errorf("Get after Put = %q, want %q", got, "new")
	}
	if err := c.Delete(t.Context(), "chunks/00/a"); err != nil {
		t.Fatalf("Delete = %v", err)
	}
	if _, err := c.Get(t.Context(), "chunks/00/a"); err == nil {
		t.Errorf("Get after Delete = nil error, want not found")
	}
	if got := c.Size(); got != 0 {
		t.Errorf("Size() after Delete = %d, want 0", got)
	}
}

func TestBadConfig(t *testing.T) {
	remote := newRemote(t)
	for _, cfg := range []Config{
		{Dir: t.TempDir(), MaxBytes: 1},
		{Remote: remote, MaxBytes: 1},
		{Remote: remote, Dir: t.TempDir()},
	} {
		if _, err := New(t.Context(), cfg); err == nil {
			t.Errorf("New(%+v) = nil error, want one", cfg)
		}
	}
}

// TestTornCopyRefetched: a cached file a crash left short or damaged
// (cache files are not synced) is dropped and the object fetched again.
func TestTornCopyRefetched(t *testing.T) {
	remote := newRemote(t)
	put(t, remote, "chunks/00/a", "the content")
	put(t, remote, "chunks/00/b", "other content")
	dir := t.TempDir()
	c := newCache(t, remote, dir, 1<<20)
	get(t, c, "chunks/00/a")
	get(t, c, "chunks/00/b")
	pa, pb := filepath.Join(dir, "chunks", "00", "a"), filepath.Join(dir, "chunks", "00", "b")
	if err := os.Truncate(pa, 5); err != nil {
		t.Fatalf("setup: %v", err)
	}
	f, err := os.ReadFile(pb)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	f[0] ^= 1
	if err := os.WriteFile(pb, f, 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, c := range []*Backend{c, newCache(t, remote, dir, 1<<20)} { // this process, and the next
		if got := get(t, c, "chunks/00/a"); got != "the content" {
			t.Errorf("Get(a) after its copy was torn = %q, want the remote's", got)
		}
		if got := get(t, c, "chunks/00/b"); got != "other content" {
			t.Errorf("Get(b) after its copy was damaged = %q, want the remote's", got)
		}
		os.Truncate(pa, 5)
		os.WriteFile(pb, f, 0o600)
	}
	if n := remote.count("chunks/00/a"); n != 3 {
		t.Errorf("remote Gets of a = %d, want 3 (first, and after each tear)", n)
	}
}

// TestConcurrentGets reads many chunks from many goroutines through a
// cache that holds a few: every read is right and the bound holds.
func TestConcurrentGets(t *testing.T) {
	remote := newRemote(t)
	const n, size = 40, 1000
	want := map[string]string{}
	for i := range n {
		k := fmt.Sprintf("chunks/%02d/k%d", i%4, i)
		want[k] = strings.Repeat(string(rune('a'+i%26)), size)
		put(t, remote, k, want[k])
	}
	c := newCache(t, remote, t.TempDir(), 10*size)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := fmt.Sprintf("chunks/%02d/k%d", (g+i)%n%4, (g+i)%n)
				rc, err := c.Get(t.Context(), k)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || string(b) != want[k] {
					errs <- fmt.Errorf("Get(%s) = %d bytes, %v; want the remote's", k, len(b), err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := c.Size(); got > 10*size {
		t.Errorf("Size() = %d, want at most %d", got, 10*size)
	}
}
