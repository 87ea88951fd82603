package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/worker"
)

// noAudit is a store that drops audit entries: the "off" side of
// BenchmarkObservedCreates.
type noAudit struct{ store.Store }

func (noAudit) AppendAudit(_ context.Context, e store.AuditEntry) (store.AuditEntry, error) {
	return e, nil
}

// slowWorker is an instant worker whose creates take a while, as a
// restore does.
type slowWorker struct {
	instantWorker
	delay time.Duration
}

func (w *slowWorker) Create(ctx context.Context, req worker.CreateRequest) (worker.Info, error) {
	time.Sleep(w.delay)
	return w.instantWorker.Create(ctx, req)
}

// observedServer is a control plane with everything an operator watches
// either on (Prometheus registry scraped every 100 ms, the audit log, a
// webhook whose receiver takes every event, a follower of /v1/events)
// or off (no registry, audit entries dropped, no webhook, no follower).
// Lifecycle events are recorded either way: the store writes them in the
// state change's own transaction. The worker's creates take delay.
func observedServer(b *testing.B, on bool, delay time.Duration) (http.Handler, string, *atomic.Int64) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	st, err := sqlite.Open(ctx, b.TempDir()+"/space.db")
	if err != nil {
		b.Fatalf("setup: %v", err)
	}
	b.Cleanup(func() { st.Close() })
	cfg := Config{Store: noAudit{st}, Templates: []string{"default"}, Quota: Quota{Sandboxes: 1 << 30},
		Webhooks: WebhookConfig{AllowPrivate: true, Poll: 50 * time.Millisecond}}
	var reg *prometheus.Registry
	if on {
		reg = prometheus.NewRegistry()
		cfg.Store, cfg.Metrics = st, reg
	}
	s, err := New(cfg)
	if err != nil {
		b.Fatalf("setup: %v", err)
	}
	s.AddWorker(&slowWorker{delay: delay})
	s.mu.Lock()
	s.seen["instant"] = time.Now().Add(time.Hour)
	s.mu.Unlock()
	key, err := s.Bootstrap(ctx, false)
	if err != nil {
		b.Fatalf("setup: %v", err)
	}
	h := s.Handler()
	delivered := new(atomic.Int64)
	if !on {
		return h, key, delivered
	}
	// The scraper.
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	b.Cleanup(metrics.Close)
	go func() {
		for ctx.Err() == nil {
			if resp, err := http.Get(metrics.URL); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	// The webhook and its receiver; the leader's dispatcher.
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		delivered.Add(1)
	}))
	b.Cleanup(recv.Close)
	call(b, h, key, "POST", "/v1/webhooks", fmt.Sprintf(`{"url":%q}`, recv.URL))
	go s.runWebhooks(ctx)
	// The follower.
	api := httptest.NewServer(h)
	b.Cleanup(api.Close)
	req, _ := http.NewRequestWithContext(ctx, "GET", api.URL+"/v1/events?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatalf("setup: follow: %v", err)
	}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
		}
	}()
	b.Cleanup(cancel) // first: end the follower's stream, so the servers close
	return h, key, delivered
}

// BenchmarkObservedCreates measures creates (and deletes) per second
// through the control plane with what an operator watches on against
// off, in one run, and reports the ratio (goal: at least 0.95 for real
// creates). "worker-0ms" has a worker that takes no time, so it shows
// the control plane's own cost, its worst case; "worker-50ms" one whose
// creates take 50 ms, about a restore on a KVM host.
//
//	go test -run '^$' -bench BenchmarkObservedCreates -benchtime 200x ./internal/controlplane/
func BenchmarkObservedCreates(b *testing.B) {
	for _, delay := range []time.Duration{0, 50 * time.Millisecond} {
		b.Run(fmt.Sprintf("worker-%dms", delay.Milliseconds()), func(b *testing.B) {
			rate := map[bool]float64{}
			n := b.N
			for _, on := range []bool{false, true} {
				h, key, _ := observedServer(b, on, delay)
				start := time.Now()
				for range n {
					rec := call(b, h, key, "POST", "/v1/sandboxes", `{"memory_mib":256}`)
					var sb struct {
						ID string `json:"id"`
					}
					json.Unmarshal(rec.Body.Bytes(), &sb)
					call(b, h, key, "DELETE", "/v1/sandboxes/"+sb.ID, "")
				}
				rate[on] = float64(n) / time.Since(start).Seconds()
			}
			b.ReportMetric(rate[false], "creates/s-off")
			b.ReportMetric(rate[true], "creates/s-on")
			b.ReportMetric(rate[true]/rate[false], "on/off")
		})
	}
}
