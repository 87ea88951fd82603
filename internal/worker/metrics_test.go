package worker

import (
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkcache"
	"space/internal/chunkstore/chunkstoretest"
	"space/internal/chunkstore/local"
	"space/internal/metricstest"
)

// TestChunkCacheMetric checks that a worker whose chunk store is behind
// a local cache reports what the cache holds, and that the capacity
// gauges and the lint are right for a worker with no sandboxes.
func TestChunkCacheMetric(t *testing.T) {
	remote, err := local.New(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cache, err := chunkcache.New(t.Context(), chunkcache.Config{Remote: remote, Dir: t.TempDir(), MaxBytes: 1 << 20})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	chunks, err := chunkstore.New(chunkstore.Config{Backend: cache})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	data := []byte("a chunk the cache keeps")
	key := chunkstore.ChunkKey(chunkstore.Sum(data))
	chunkstoretest.Put(t, cache, key, data)
	if rc, err := cache.Get(t.Context(), key); err != nil {
		t.Fatalf("setup: Get = %v", err)
	} else {
		rc.Close()
	}
	reg := prometheus.NewRegistry()
	w, err := New(Config{ID: "unit", DataDir: t.TempDir(), RunRoot: t.TempDir(), Driver: neverBoots{}, Templates: noTemplates{},
		Chunks: chunks, ChunkStore: "s3://bucket", VCPUs: 4, MemoryMiB: 1024, Metrics: reg})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	fams := metricstest.Scrape(t, srv.URL)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"space_worker_chunk_cache_bytes", nil, float64(cache.Size())},
		{"space_worker_capacity", map[string]string{"resource": "vcpu"}, 4},
		{"space_worker_capacity", map[string]string{"resource": "memory_bytes"}, 1 << 30},
		{"space_worker_committed", map[string]string{"resource": "vcpu"}, 0},
		{"space_worker_pool_size", nil, 0},
	} {
		if got, ok := fams.Value(c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if cache.Size() == 0 {
		t.Errorf("setup: the cache holds nothing")
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint() = %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
