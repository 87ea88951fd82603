package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sync/errgroup"

	"space/internal/errkind"
)

// Restore writes file name of snapshot m to dstPath as a sparse file:
// holes stay holes, and every chunk is checked against its digest before it
// is written. The file appears at dstPath (replacing what was there) only
// once it is complete and synced; on error nothing is left behind.
//
// A chunk whose content or length is wrong returns an error wrapping
// ErrCorrupt; a chunk the backend lacks, ErrChunkMissing (which wraps
// ErrCorrupt too). A name m lacks is errkind.NotFound; an invalid m,
// errkind.InvalidArgument.
func (s *Store) Restore(ctx context.Context, m Manifest, name, dstPath string) (err error) {
	if err := m.validate(); err != nil {
		return fmt.Errorf("restore: invalid manifest: %v: %w", err, errkind.InvalidArgument)
	}
	fe, ok := m.File(name)
	if !ok {
		return fmt.Errorf("restore %s: snapshot has no file %q: %w", m.ID, name, errkind.NotFound)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dstPath), "."+filepath.Base(dstPath)+".restore-")
	if err != nil {
		return fmt.Errorf("restore %s/%s: %w", m.ID, name, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	fail := func(err error) error { return fmt.Errorf("restore %s/%s: %w", m.ID, name, err) }
	if err := tmp.Chmod(fe.Mode.Perm()); err != nil {
		return fail(err)
	}
	if err := tmp.Truncate(fe.Size); err != nil {
		return fail(err)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.concurrency)
	// Sized by the manifest, not this Store: it may have been written by
	// a store with another chunk size.
	bufs := make(chan []byte, s.concurrency) // at most concurrency in use
	for range min(s.concurrency, len(fe.Chunks)) {
		bufs <- make([]byte, m.ChunkSize+1)
	}
	for _, c := range fe.Chunks {
		g.Go(func() error {
			buf := <-bufs
			defer func() { bufs <- buf }()
			data, err := s.fetchChunk(gctx, c, buf)
			if err != nil {
				return fmt.Errorf("chunk at offset %d: %w", c.Offset, err)
			}
			_, err = tmp.WriteAt(data, c.Offset)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), dstPath); err != nil {
		return fail(err)
	}
	return syncDir(filepath.Dir(dstPath))
}

// fetchChunk reads chunk c into buf (at least c.Length+1 bytes) and checks
// its length and digest.
func (s *Store) fetchChunk(ctx context.Context, c ChunkRef, buf []byte) ([]byte, error) {
	rc, err := s.b.Get(ctx, ChunkKey(c.Digest))
	if errors.Is(err, errkind.NotFound) {
		return nil, fmt.Errorf("chunk %s: %w", c.Digest, ErrChunkMissing)
	}
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	n, err := io.ReadFull(rc, buf[:c.Length+1])
	switch {
	case err == nil:
		return nil, fmt.Errorf("chunk %s: longer than %d bytes: %w", c.Digest, c.Length, ErrCorrupt)
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		if int64(n) != c.Length {
			return nil, fmt.Errorf("chunk %s: %d bytes, want %d: %w", c.Digest, n, c.Length, ErrCorrupt)
		}
	default:
		return nil, fmt.Errorf("chunk %s: %w", c.Digest, err)
	}
	data := buf[:n]
	if got := Sum(data); got != c.Digest {
		return nil, fmt.Errorf("chunk %s: content hashes to %s: %w", c.Digest, got, ErrCorrupt)
	}
	return data, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
