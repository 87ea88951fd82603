package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/testenv"
	"space/internal/testenv/pgtest"
)

// TestReplicasReachEachOthersEmbeddedWorkers runs two servers, each with
// its embedded worker (the fake VMM), on one PostgreSQL store: each
// advertises its worker to the other, so either serves every sandbox
// (get, exec through the data plane, delete), wherever it runs.
func TestReplicasReachEachOthersEmbeddedWorkers(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // the fake jails its guests
	dsn := pgURL(t, pgtest.Start(t))
	shared := t.TempDir()
	tokenFile, keyFile := filepath.Join(shared, "worker.token"), filepath.Join(shared, "secrets.key")
	token, err := secretFile(tokenFile)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	type replica struct {
		url, dataDir, workerID string
	}
	var replicas []replica
	for range 2 {
		dataDir, workerID := newDataDir(t), newWorkerID(t)
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan string, 1)
		done := make(chan error, 1)
		go func() {
			done <- Run(ctx, Config{
				DataDir: dataDir, WorkerID: workerID, Listen: "127.0.0.1:0", CacheBase: t.TempDir(), VMM: VMMFake,
				StoreURL: dsn, WorkerToken: token, SecretsKeyFile: keyFile, Version: "test", Ready: func(u string) { ready <- u },
			})
		}()
		select {
		case u := <-ready:
			replicas = append(replicas, replica{url: u, dataDir: dataDir, workerID: workerID})
		case err := <-done:
			cancel()
			t.Fatalf("setup: server: %v", err)
		case <-time.After(time.Minute):
			cancel()
			t.Fatalf("setup: server not ready in 1m")
		}
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		})
	}
	keyB, err := os.ReadFile(filepath.Join(replicas[0].dataDir, AdminKeyFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	key := strings.TrimSpace(string(keyB))
	var clients []*client.Client
	for _, r := range replicas {
		c, err := client.New(r.url, key)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		clients = append(clients, c)
	}
	// Each replica learns the other's worker from the store.
	for i, r := range replicas {
		deadline := time.Now().Add(30 * time.Second)
		for {
			n := healthyOf(t, r.url, key)
			if n == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d lists %d healthy workers after 30s, want both embedded ones", i, n)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Two creates through replica 1 land one on each worker (placement
	// takes the one with more room).
	on := map[string]string{}
	for range 2 {
		sb, err := clients[1].CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 256})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		on[sb.ID] = sb.Worker
	}
	workers := map[string]bool{}
	for _, w := range on {
		workers[w] = true
	}
	if !workers[replicas[0].workerID] || !workers[replicas[1].workerID] {
		t.Fatalf("sandboxes on %v, want one on each embedded worker (%s, %s)", on, replicas[0].workerID, replicas[1].workerID)
	}
	for id, w := range on {
		for i, c := range clients {
			var out bytes.Buffer
			exit, err := c.Exec(t.Context(), id, api.Exec{Command: []string{"echo", "hi"}}, &out, &out)
			if err != nil || exit.Code != 0 || strings.TrimSpace(out.String()) != "hi" {
				t.Errorf("exec in %s (on %s) through replica %d = %+v, %v, %q; want hi", id, w, i, exit, err, out.String())
			}
		}
	}
	for id := range on {
		if err := clients[0].DeleteSandbox(t.Context(), id); err != nil {
			t.Errorf("delete %s through replica 0: %v", id, err)
		}
	}
}

// healthyOf counts the healthy workers the server at url lists.
func healthyOf(t *testing.T, url, key string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", url+"/v1/workers", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var ws api.WorkerList
	if json.NewDecoder(resp.Body).Decode(&ws) != nil {
		return 0
	}
	n := 0
	for _, w := range ws.Workers {
		if w.Healthy {
			n++
		}
	}
	return n
}
