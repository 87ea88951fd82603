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
// A chunk whose content or length is wrong, or whose compressed object
// does not decompress, returns an error wrapping ErrCorrupt; a chunk the
// backend lacks, ErrChunkMissing (which wraps ErrCorrupt too). A name m lacks is errkind.NotFound; an invalid m,
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
	bufs := make(chan *chunkBuf, s.concurrency) // at most concurrency in use
	for range min(s.concurrency, len(fe.Chunks)) {
		cb := &chunkBuf{size: m.ChunkSize}
		cb.digests.init(m.Domain)
		bufs <- cb
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

// chunkBuf is one Restore goroutine's memory for a chunk of at most size
// bytes: plain for its content, packed for its object if compressed, and
// the digester of the manifest's domain that checks it.
type chunkBuf struct {
	size          int64
	plain, packed []byte // made when first needed, size+1 bytes
	digests       digester
}

// get returns *b, made size+1 bytes long if not yet.
func (cb *chunkBuf) get(b *[]byte) []byte {
	if *b == nil {
		*b = make([]byte, cb.size+1)
	}
	return *b
}

// fetchChunk reads chunk c (at most buf.size bytes) into buf, decompresses
// it if stored compressed, and checks its length and digest (in the
// domain of buf's digester).
func (s *Store) fetchChunk(ctx context.Context, c ChunkRef, buf *chunkBuf) ([]byte, error) {
	var data []byte
	var err error
	switch c.Encoding {
	case EncodingRaw:
		data, err = s.readChunkObject(ctx, c, buf.get(&buf.plain))
		if err == nil && int64(len(data)) != c.Length {
			err = fmt.Errorf("%d bytes, want %d: %w", len(data), c.Length, ErrCorrupt)
		}
	case EncodingZstd:
		var packed []byte
		packed, err = s.readChunkObject(ctx, c, buf.get(&buf.packed))
		if err == nil {
			data, err = s.decodeChunk(packed, buf.get(&buf.plain), c.Length)
		}
	default: // validate lets none through
		err = fmt.Errorf("unknown encoding %q: %w", c.Encoding, ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", c.Digest, err)
	}
	if got := buf.digests.sum(data); got != c.Digest {
		return nil, fmt.Errorf("chunk %s: content hashes to %s: %w", c.Digest, got, ErrCorrupt)
	}
	return data, nil
}

// readChunkObject reads the object of c's encoding into buf (at least
// c.Length+1 bytes). Neither encoding's object is longer than the chunk
// (see plausibleSize): a longer one is ErrCorrupt, a missing one
// ErrChunkMissing.
func (s *Store) readChunkObject(ctx context.Context, c ChunkRef, buf []byte) ([]byte, error) {
	rc, err := s.b.Get(ctx, chunkObjectKey(c.Digest, c.Encoding))
	if errors.Is(err, errkind.NotFound) {
		return nil, ErrChunkMissing
	}
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	n, err := io.ReadFull(rc, buf[:c.Length+1])
	switch {
	case err == nil:
		return nil, fmt.Errorf("object longer than %d bytes: %w", c.Length, ErrCorrupt)
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return buf[:n], nil
	default:
		return nil, err
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
