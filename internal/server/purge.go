package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkloc"
	"space/internal/errkind"
	"space/internal/storage"
)

// PurgeWorker removes everything the worker whose data dir is
// cfg.DataDir (a standalone worker's, or a server's with its embedded
// worker) made on this host: every sandbox's VM, tap, network namespace
// and control group, the worker's control group parent and run root,
// the storage image it mounted, and then the data dir itself (with the
// chunk store or the S3 store's chunk cache in it). A chunk store
// elsewhere, cfg.Chunks, may be shared with a server: a directory is
// left unless cfg.RemoveChunks, and an S3 bucket is never touched (not
// even contacted; cfg.RemoveChunks with one is errkind.InvalidArgument).
// It is what uninstalling runs on each node. The worker must not
// be running: its data dir is locked while it runs, and the error says
// so (an uninstall retries until the worker's pod is gone). A data dir
// that does not exist is nothing to purge. cfg's VMM, Firecracker and
// Host must be those the worker ran with; its control plane and token
// are not needed.
func PurgeWorker(ctx context.Context, cfg WorkerConfig) error {
	if cfg.DataDir == "" {
		return fmt.Errorf("purge: data dir is required: %w", errkind.InvalidArgument)
	}
	if err := checkVMM(cfg.VMM); err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	loc, err := cfg.Chunks.location(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	if loc.Remote() && cfg.RemoveChunks {
		return fmt.Errorf("purge: remove chunks of %s: an S3 bucket is shared, purge never deletes its objects: %w", loc, errkind.InvalidArgument)
	}
	if _, err := os.Stat(cfg.DataDir); errors.Is(err, os.ErrNotExist) {
		cfg.Log.Info("purge: no data dir, nothing to remove", "data_dir", cfg.DataDir)
		return nil
	}
	unlock, err := lockDir(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	defer unlock()
	id, err := workerIdentity(cfg.DataDir, cfg.ID, legacyWorkerID(cfg.DataDir))
	if err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	// Nothing boots: the images are never read.
	img, err := templateImages(ctx, VMMFake, "", "", "", cfg.Log)
	if err != nil {
		return err
	}
	// Purging reads and deletes no snapshot: the worker needs a chunk
	// store only to open, and a bucket is left alone (not contacted, so
	// purging needs no credentials).
	var chunks *chunkstore.Store
	if !loc.Remote() {
		if chunks, err = chunkloc.Open(ctx, loc, chunkloc.Options{}); err != nil {
			return fmt.Errorf("purge: %w", err)
		}
	}
	cache := cmp.Or(cfg.CacheBase, filepath.Join(cfg.DataDir, "purge-cache"))
	workerDir := filepath.Join(cfg.DataDir, "worker")
	w, err := newWorker(ctx, workerConfig{
		VMM: cfg.VMM, Firecracker: cfg.Firecracker, Host: cfg.Host, Purge: true, Progress: io.Discard,
		ID: id, DataDir: workerDir, CacheBase: cache, Images: img, Log: cfg.Log, Chunks: chunks,
	})
	if err != nil {
		return fmt.Errorf("purge: open worker %s: %w", id, err)
	}
	var errs []error
	if err := w.Purge(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := storage.Unmount(ctx, workerDir); err != nil {
		errs = append(errs, fmt.Errorf("unmount %s: %w", workerDir, err))
	}
	if len(errs) > 0 {
		// Keep the data dir: it holds what a retry needs to find the rest.
		return fmt.Errorf("purge: %w", errors.Join(errs...))
	}
	if err := removeTree(cfg.DataDir); err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	switch {
	case loc.Remote():
		cfg.Log.Info("purge: the S3 chunk store is left (it is shared); its local cache is removed", "chunks", loc.String())
	case cfg.Chunks.Location != "" && cfg.RemoveChunks:
		if err := removeTree(loc.Dir); err != nil {
			return fmt.Errorf("purge: %w", err)
		}
	case cfg.Chunks.Location != "":
		cfg.Log.Info("purge: the chunk store outside the data dir is left (it may be shared)", "chunk_dir", loc.Dir)
	}
	cfg.Log.Info("purged worker", "worker_id", id, "data_dir", cfg.DataDir)
	return nil
}

// removeTree removes dir and everything in it. A dir that is a mount
// point (a container's volume) cannot go: it is left empty.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
