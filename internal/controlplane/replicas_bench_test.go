package controlplane

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/testenv/pgtest"
)

// BenchmarkReplicaCreates measures what the control plane alone costs a
// create (auth, validation, quota in the store's transaction, placement,
// a claim, the record's writes) on a real PostgreSQL, with a worker that
// takes no time, from 1 and from 3 replicas (each a server with its own
// connection pool). "serial" sends one create at a time: its p50/p99 are
// the overhead a create pays. "parallel" keeps 16 creates in flight over
// the replicas, for four teams (one team's creates serialize on its
// quota row): its creates/s is what the control plane sustains.
func BenchmarkReplicaCreates(b *testing.B) {
	dsn := pgtest.Start(b)
	for _, n := range []int{1, 3} {
		for _, inFlight := range []int{1, 16} {
			name := fmt.Sprintf("replicas=%d/serial", n)
			if inFlight > 1 {
				name = fmt.Sprintf("replicas=%d/parallel", n)
			}
			b.Run(name, func(b *testing.B) { benchReplicaCreates(b, dsn, n, inFlight) })
		}
	}
}

func benchReplicaCreates(b *testing.B, dsn string, n, inFlight int) {
	var handlers []http.Handler
	var keys []string
	for i := range n {
		st, err := postgres.Open(b.Context(), dsn)
		if err != nil {
			b.Fatalf("setup: %v", err)
		}
		b.Cleanup(func() { st.Close() })
		s, err := New(Config{Store: st, Templates: []string{"default"}, Quota: Quota{Sandboxes: 1 << 30, VCPUs: 1 << 30, MemoryMiB: 1 << 50}})
		if err != nil {
			b.Fatalf("setup: %v", err)
		}
		addInstantWorker(s)
		if i == 0 {
			for team := range 4 {
				if _, err := st.CreateTeam(b.Context(), store.Team{ID: fmt.Sprintf("bench%d", team), Name: "bench"}); err != nil && !errors.Is(err, store.ErrAlreadyExists) {
					b.Fatalf("setup: %v", err)
				}
				_, k, err := s.newKey(b.Context(), fmt.Sprintf("bench%d", team), "bench", false)
				if err != nil {
					b.Fatalf("setup: %v", err)
				}
				keys = append(keys, k)
			}
		}
		handlers = append(handlers, s.Handler())
	}
	var (
		mu    sync.Mutex
		times []time.Duration
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	b.ResetTimer()
	t0 := time.Now()
	for range inFlight {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > b.N {
					return
				}
				t := time.Now()
				call(b, handlers[i%n], keys[i%len(keys)], "POST", "/v1/sandboxes", `{"memory_mib":256}`)
				d := time.Since(t)
				mu.Lock()
				times = append(times, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(t0)
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(b.N)/took.Seconds(), "creates/s")
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1000, "p99-ms")
}
