package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/client"
	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkloc"
	"space/internal/chunkstore/s3"
	"space/internal/errkind"
	"space/internal/testenv"
	"space/internal/testenv/weedtest"
)

// s3Chunks returns a chunk store under prefix "space" of srv's bucket.
func s3Chunks(srv weedtest.Server) ChunkStore {
	return ChunkStore{
		Location:    fmt.Sprintf("s3://%s/space?endpoint=%s&tls=false", srv.Bucket, srv.Endpoint),
		Credentials: chunkloc.Credentials{AccessKey: srv.AccessKey, SecretKey: srv.SecretKey},
	}
}

// bucketObjects lists every object of srv's bucket with its size.
func bucketObjects(t *testing.T, srv weedtest.Server) []string {
	t.Helper()
	b, err := s3.New(s3.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatalf("s3.New = %v", err)
	}
	var keys []string
	if err := b.List(t.Context(), "", func(o chunkstore.ObjectInfo) error {
		keys = append(keys, fmt.Sprintf("%s %d", o.Key, o.Size))
		return nil
	}); err != nil {
		t.Fatalf("list bucket: %v", err)
	}
	return keys
}

// startFakeWorker runs a standalone worker with the fake VMM, registered
// with ts, on chunk store cs.
func startFakeWorker(t *testing.T, ts *testServer, cs ChunkStore, memoryMiB int64) *testServer {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(ts.dataDir, WorkerTokenFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	wt := &testServer{dataDir: newDataDir(t), workerID: newWorkerID(t)}
	cfg := WorkerConfig{
		ID: wt.workerID, DataDir: wt.dataDir, ControlPlane: ts.url, Token: strings.TrimSpace(string(token)),
		Listen: "127.0.0.1:0", CacheBase: t.TempDir(), VMM: VMMFake, Chunks: cs, VCPUs: 8, MemoryMiB: memoryMiB,
	}
	if os.Getenv("SPACE_TEST_LOG") != "" {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("worker_id", wt.workerID)
	}
	wt.url, wt.stop = runTestWorker(t, cfg)
	return wt
}

// TestFakeVMMSnapshotAcrossWorkersOnS3 runs a control plane and two
// standalone workers (fake VMM: jailed host processes, not VMs) sharing
// one bucket of a real S3 server (SeaweedFS): a snapshot taken on one
// worker restores on the other, which fetched its chunks through its
// chunk cache; neither has a local chunk store. Purging a worker removes
// its cache and leaves every object in the bucket.
func TestFakeVMMSnapshotAcrossWorkersOnS3(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // the fake jails its guests
	srv := weedtest.Start(t)
	cs := s3Chunks(srv)
	ts := startFakeServerWith(t, Config{NoWorker: true, Chunks: cs})
	a := startFakeWorker(t, ts, cs, 1024)
	b := startFakeWorker(t, ts, cs, 1024)
	ctx := t.Context()
	c := ts.client
	testenv.Eventually(t, 30*time.Second, func() bool {
		status, body := rawCall(t, ts, "GET", "/v1/workers", "")
		return status == 200 && strings.Count(body, `"healthy":true`) == 2
	})

	src, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	if _, err := c.WriteFile(ctx, src.ID, "/work/f", strings.NewReader("carried\n"), client.WriteOptions{Mode: 0o600, Mkdir: true}); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	t0 := time.Now()
	sn, err := c.CreateSnapshot(ctx, src.ID, "travel")
	if err != nil {
		t.Fatalf("CreateSnapshot = %v", err)
	}
	testenv.Eventually(t, time.Minute, func() bool {
		s, err := c.Snapshot(ctx, sn.ID)
		return err == nil && s.State == "ready"
	})
	took := time.Since(t0)
	other := a
	if src.Worker == a.workerID {
		other = b
	}
	// The source sandbox keeps its worker busier, so the copy goes to the
	// other one.
	t0 = time.Now()
	cp, err := c.CreateSandbox(ctx, api.CreateSandbox{FromSnapshot: "travel"})
	restored := time.Since(t0)
	if err != nil {
		t.Fatalf("CreateSandbox(from_snapshot) = %v", err)
	}
	if cp.Worker != other.workerID {
		t.Fatalf("copy placed on %s, want %s (the worker that did not take the snapshot)", cp.Worker, other.workerID)
	}
	var got strings.Builder
	if _, err := c.ReadFile(ctx, cp.ID, "/work/f", &got); err != nil || got.String() != "carried\n" {
		t.Errorf("copy on the other worker: /work/f = %q, %v; want %q", got.String(), err, "carried\n")
	}
	cached := dirBytes(t, filepath.Join(other.dataDir, ChunkCacheDir, "chunks"))
	if cached == 0 {
		t.Errorf("the restoring worker's chunk cache holds no chunk")
	}
	for _, w := range []*testServer{a, b} {
		if _, err := os.Stat(filepath.Join(w.dataDir, "chunks")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("worker %s has a local chunk store: Stat = %v", w.workerID, err)
		}
	}
	objects := bucketObjects(t, srv)
	if !slices.ContainsFunc(objects, func(k string) bool { return strings.HasPrefix(k, "space/manifests/") }) ||
		!slices.ContainsFunc(objects, func(k string) bool { return strings.HasPrefix(k, "space/chunks/") }) {
		t.Errorf("bucket holds %q, want manifests and chunks under space/", objects)
	}
	t.Logf("snapshot %s (%d KiB logical, %d KiB new) stored in %v; restored on the other worker in %v, its cache %d KiB; bucket %d objects",
		sn.ID, sn.LogicalBytes>>10, sn.NewBytes>>10, took.Round(time.Millisecond), restored.Round(time.Millisecond), cached>>10, len(objects))

	for _, id := range []string{cp.ID, src.ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatalf("DeleteSandbox(%s) = %v", id, err)
		}
	}
	other.stop()
	purge := WorkerConfig{DataDir: other.dataDir, VMM: VMMFake, Chunks: ChunkStore{Location: cs.Location}, RemoveChunks: true}
	if err := PurgeWorker(ctx, purge); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("PurgeWorker(s3 chunks, RemoveChunks) = %v, want InvalidArgument", err)
	}
	if _, err := os.Stat(filepath.Join(other.dataDir, ChunkCacheDir)); err != nil {
		t.Errorf("refused purge removed the chunk cache: %v", err)
	}
	purge.RemoveChunks = false // and no credentials: purging does not contact the bucket
	if err := PurgeWorker(ctx, purge); err != nil {
		t.Fatalf("PurgeWorker(s3 chunks) = %v", err)
	}
	if _, err := os.Stat(other.dataDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("purged data dir (with the chunk cache): Stat = %v, want not exist", err)
	}
	if after := bucketObjects(t, srv); !cmp.Equal(after, objects) {
		t.Errorf("purge changed the bucket (-before +after):\n%s", cmp.Diff(objects, after))
	}
}

// TestStartFailsOnBadS3Chunks: a wrong endpoint, credentials or bucket,
// or a bad URL, fail the start of a server and of a worker at once, with
// an error that says which, and leave nothing behind (not even the data
// dir).
func TestStartFailsOnBadS3Chunks(t *testing.T) {
	srv := weedtest.Start(t)
	good := s3Chunks(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	closed := ln.Addr().String()
	ln.Close()
	with := func(loc string, creds chunkloc.Credentials) ChunkStore {
		return ChunkStore{Location: loc, Credentials: creds}
	}
	tests := []struct {
		name   string
		chunks ChunkStore
		kind   error
		says   string
	}{
		{"wrong endpoint", with(fmt.Sprintf("s3://%s?endpoint=%s&tls=false", srv.Bucket, closed), good.Credentials),
			errkind.Unavailable, "server unreachable"},
		{"wrong credentials", with(good.Location, chunkloc.Credentials{AccessKey: srv.AccessKey, SecretKey: "wrong-secret"}),
			errkind.PermissionDenied, "access denied"},
		{"missing bucket", with(fmt.Sprintf("s3://%s-none?endpoint=%s&tls=false", srv.Bucket, srv.Endpoint), good.Credentials),
			errkind.FailedPrecondition, "no such bucket"},
		{"no endpoint", with("s3://"+srv.Bucket, good.Credentials), errkind.InvalidArgument, "endpoint is required"},
		{"negative cache", ChunkStore{Location: good.Location, Credentials: good.Credentials, CacheMiB: -1}, errkind.InvalidArgument, "cache size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := func(who string, err error, dataDir string) {
				t.Helper()
				if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.says) {
					t.Errorf("%s start = %v, want %v saying %q", who, err, tt.kind, tt.says)
				}
				if err != nil && strings.Contains(err.Error(), "wrong-secret") {
					t.Errorf("%s start error shows the secret: %v", who, err)
				}
				if _, serr := os.Stat(dataDir); !errors.Is(serr, fs.ErrNotExist) {
					t.Errorf("%s start failed but made its data dir: Stat = %v", who, serr)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			dataDir := filepath.Join(t.TempDir(), "server")
			err := Run(ctx, Config{DataDir: dataDir, CacheBase: t.TempDir(), VMM: VMMFake, NoWorker: true, Listen: "127.0.0.1:0", Chunks: tt.chunks})
			check("server", err, dataDir)
			dataDir = filepath.Join(t.TempDir(), "worker")
			err = RunWorker(ctx, WorkerConfig{DataDir: dataDir, ControlPlane: "http://127.0.0.1:1", Token: "t", CacheBase: t.TempDir(), VMM: VMMFake, Chunks: tt.chunks})
			check("worker", err, dataDir)
		})
	}
}
