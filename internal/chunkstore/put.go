package chunkstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"space/internal/errkind"
)

// batchBytes is how much Put reads (and holds in memory) before it leases
// and uploads the chunks read: one lease part, and one wait for GC, per
// batch. It is a byte budget rather than a chunk count so that small
// chunks do not multiply those round trips.
const batchBytes = 16 << 20

// batchChunks is how many chunks of chunkSize make a batch.
func batchChunks(chunkSize int64) int { return int(batchBytes / chunkSize) }

// zeros is compared against to find all-zero chunks of any size.
var zeros = make([]byte, MaxChunkSize)

// Put stores files as snapshot id and returns its manifest. It reads only
// data regions (holes are skipped via SEEK_DATA/SEEK_HOLE where the file
// system supports them), records all-zero chunks as holes, uploads only
// chunks the backend does not have in either encoding (compressing them as
// Config.Compression says), and writes the manifest last: a failed or
// cancelled Put leaves no manifest, only chunks a later GC collects.
//
// The files must not change while Put reads them. Bad IDs, names or
// options return errors wrapping errkind.InvalidArgument before anything is
// written; an existing id returns ErrExists (two Puts of the same new id at
// once both succeed, the later manifest winning); ErrLeaseExpired means
// nothing was committed and Put may be retried.
func (s *Store) Put(ctx context.Context, id string, files []File, opts PutOptions) (_ Manifest, stats PutStats, err error) {
	if err := checkPut(id, files, opts); err != nil {
		return Manifest{}, PutStats{}, fmt.Errorf("put snapshot: %w", err)
	}
	fail := func(err error) (Manifest, PutStats, error) {
		return Manifest{}, stats, fmt.Errorf("put snapshot %s: %w", id, err)
	}
	if _, err := s.b.Stat(ctx, ManifestKey(id)); err == nil {
		return fail(ErrExists)
	} else if !errors.Is(err, errkind.NotFound) {
		return fail(err)
	}

	opened := make([]*os.File, len(files))
	defer func() {
		for _, f := range opened {
			if f != nil {
				f.Close()
			}
		}
	}()
	infos := make([]os.FileInfo, len(files))
	for i, f := range files {
		fh, err := os.Open(f.Path)
		if err != nil {
			return fail(err)
		}
		opened[i] = fh
		fi, err := fh.Stat()
		if err != nil {
			return fail(err)
		}
		if !fi.Mode().IsRegular() {
			return fail(fmt.Errorf("%s is not a regular file: %w", f.Path, errkind.InvalidArgument))
		}
		infos[i] = fi
	}

	l := s.newLease(id)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		// After a committed Put a lease left behind only delays GC until it
		// expires (GC then removes it), so only a failed Put reports it.
		if rerr := l.release(rctx); rerr != nil && err != nil {
			err = errors.Join(err, rerr)
		}
	}()

	w := &putWriter{s: s, l: l, stats: &stats, stored: make(map[Digest]string), scratch: make(chan []byte, s.concurrency)}
	w.digests.init(opts.Domain)
	m := Manifest{
		Version:   manifestVersion,
		ID:        id,
		Created:   s.now().UTC().Truncate(time.Millisecond),
		ChunkSize: s.chunkSize,
		Domain:    opts.Domain,
		Files:     make([]FileEntry, 0, len(files)),
	}
	plans := make([]filePlan, len(files))
	var fromParent []ChunkRef
	usable := s.usableDirty(opts)
	for i, f := range files {
		if dirty, ok := usable[f.Name]; ok {
			pf, _ := opts.Parent.File(f.Name) // checkPut made sure it exists
			plans[i] = planFile(infos[i].Size(), s.chunkSize, pf, dirty)
			for _, r := range plans[i].parentRefs {
				fromParent = append(fromParent, r)
			}
		}
	}
	if len(fromParent) > 0 {
		// Lease the parent's chunks this snapshot will reuse. If the parent
		// manifest still exists (and was not replaced) after that, they are
		// still stored, and stay so until our manifest lands.
		ds := make([]Digest, len(fromParent))
		for i, r := range fromParent {
			ds[i] = r.Digest
		}
		if err := w.lease(ctx, ds); err != nil {
			return fail(err)
		}
		if err := w.checkParent(ctx, opts.Parent); err != nil {
			return fail(err)
		}
		for _, r := range fromParent {
			w.stored[r.Digest] = r.Encoding
		}
	}

	if opts.Parent != nil {
		m.Parent = opts.Parent.ID
	}
	for i, f := range files {
		size := infos[i].Size()
		stats.LogicalBytes += size
		refs, err := w.putFile(ctx, opened[i], size, s.chunkSize, plans[i])
		if err != nil {
			return fail(fmt.Errorf("file %s: %w", f.Name, err))
		}
		m.Files = append(m.Files, FileEntry{Name: f.Name, Size: size, Mode: fileMode(infos[i].Mode()), Chunks: refs})
	}

	// Renew right before committing, so the manifest write has a whole TTL
	// to land while every chunk it names is still protected.
	if err := l.add(ctx, nil); err != nil {
		return fail(err)
	}
	b, err := encodeManifest(&m)
	if err != nil {
		return fail(err)
	}
	if err := s.putBytes(ctx, ManifestKey(id), b); err != nil {
		return fail(fmt.Errorf("write manifest: %w", err))
	}
	stats.ManifestBytes = int64(len(b))
	stats.NewBytes += stats.ManifestBytes
	return m, stats, nil
}

// usableDirty returns the dirty ranges Put may plan with: none if the
// parent's chunks are cut at another size than this Store's, since then
// not one of them covers the extent a chunk of ours does, or are named in
// another dedup domain, since a manifest's chunks are all of its own.
func (s *Store) usableDirty(opts PutOptions) map[string][]Range {
	if opts.Parent == nil || opts.Parent.ChunkSize != s.chunkSize || opts.Parent.Domain != opts.Domain {
		return nil
	}
	return opts.Dirty
}

func checkPut(id string, files []File, opts PutOptions) error {
	if err := CheckID(id); err != nil {
		return err
	}
	if err := CheckDomain(opts.Domain); err != nil {
		return err
	}
	names := make(map[string]bool, len(files))
	for _, f := range files {
		if err := CheckID(f.Name); err != nil {
			return err
		}
		if names[f.Name] {
			return fmt.Errorf("file name %s given twice: %w", f.Name, errkind.InvalidArgument)
		}
		names[f.Name] = true
		if f.Path == "" {
			return fmt.Errorf("file %s: empty path: %w", f.Name, errkind.InvalidArgument)
		}
	}
	if opts.Parent != nil {
		if err := opts.Parent.validate(); err != nil {
			return fmt.Errorf("parent manifest: %v: %w", err, errkind.InvalidArgument)
		}
	}
	if opts.Dirty != nil && opts.Parent == nil {
		return fmt.Errorf("dirty ranges given without a parent: %w", errkind.InvalidArgument)
	}
	for name, rs := range opts.Dirty {
		if !names[name] {
			return fmt.Errorf("dirty ranges for %q, which is not a file of this snapshot: %w", name, errkind.InvalidArgument)
		}
		if _, ok := opts.Parent.File(name); !ok {
			return fmt.Errorf("dirty ranges for %s, which parent %s lacks: %w", name, opts.Parent.ID, errkind.InvalidArgument)
		}
		for _, r := range rs {
			if r.Off < 0 || r.Len <= 0 || r.Off+r.Len < r.Off {
				return fmt.Errorf("file %s: bad dirty range %+v: %w", name, r, errkind.InvalidArgument)
			}
		}
	}
	return nil
}

// putWriter is one Put's state; one goroutine uses it.
type putWriter struct {
	s       *Store
	l       *lease
	stats   *PutStats
	digests digester // of the snapshot's domain
	// stored holds chunks known to be stored and leased by this Put, and
	// the encoding of the object refs to them name.
	stored  map[Digest]string
	pending []*pendingChunk
	bufs    [][]byte // a batch's chunk buffers, made lazily
	// scratch holds buffers for compressed chunks, one per upload running
	// (at most Config.Concurrency), made lazily.
	scratch chan []byte
}

type pendingChunk struct {
	data   []byte // the chunk's content
	digest Digest
	ref    *ChunkRef // where the digest goes once computed
}

// filePlan says which chunks of a file are taken from the parent. The zero
// value reads every chunk.
type filePlan struct {
	clean      []bool             // chunk i is the parent's, or nil
	parentRefs map[int64]ChunkRef // the parent's stored clean chunks by offset
}

// planFile marks the chunks of a file of size, cut at chunkSize, that
// overlap no dirty range and have the same extent in the parent's entry.
// The parent must be cut at chunkSize too.
func planFile(size, chunkSize int64, parent FileEntry, dirty []Range) filePlan {
	n := (size + chunkSize - 1) / chunkSize
	p := filePlan{clean: make([]bool, n), parentRefs: map[int64]ChunkRef{}}
	for i := range p.clean {
		off := int64(i) * chunkSize
		p.clean[i] = off < parent.Size && min(off+chunkSize, parent.Size) == min(off+chunkSize, size)
	}
	for _, r := range dirty {
		for i := r.Off / chunkSize; i < n && i <= (r.Off+r.Len-1)/chunkSize; i++ {
			p.clean[i] = false
		}
	}
	for _, c := range parent.Chunks {
		if i := c.Offset / chunkSize; i < n && p.clean[i] {
			p.parentRefs[c.Offset] = c
		}
	}
	return p
}

// putFile returns the chunk refs of a file cut at chunkSize, reading the
// chunks plan does not take from the parent (whose chunks Put has leased
// already).
func (w *putWriter) putFile(ctx context.Context, f *os.File, size, chunkSize int64, plan filePlan) ([]ChunkRef, error) {
	data, err := dataRanges(f, size)
	if err != nil {
		return nil, err
	}
	n := int((size + chunkSize - 1) / chunkSize)
	batch := batchChunks(chunkSize)
	refs := make([]*ChunkRef, 0, n)
	for i := range n {
		off := int64(i) * chunkSize
		length := min(chunkSize, size-off)
		if plan.clean != nil && plan.clean[i] {
			if r, ok := plan.parentRefs[off]; ok {
				refs = append(refs, &r)
				w.stats.ReusedChunks++
			} else {
				w.stats.HoleChunks++
			}
			continue
		}
		parts := intersect(data, off, length)
		if len(parts) == 0 {
			w.stats.HoleChunks++
			continue
		}
		buf := w.buffer(len(w.pending), chunkSize)[:length]
		clear(buf)
		for _, p := range parts {
			dst := buf[p.Off-off : p.Off-off+p.Len]
			if k, err := f.ReadAt(dst, p.Off); k != len(dst) {
				if err == io.EOF {
					err = fmt.Errorf("file shrank while being read")
				}
				return nil, fmt.Errorf("read at %d: %w", p.Off, err)
			}
			w.stats.ReadBytes += p.Len
		}
		if bytes.Equal(buf, zeros[:length]) {
			w.stats.HoleChunks++
			continue
		}
		ref := &ChunkRef{Offset: off, Length: length}
		refs = append(refs, ref)
		w.pending = append(w.pending, &pendingChunk{data: buf, ref: ref})
		if len(w.pending) == batch {
			if err := w.flush(ctx); err != nil {
				return nil, err
			}
		}
	}
	// flush fills in the digests of the refs still pending.
	if err := w.flush(ctx); err != nil {
		return nil, err
	}
	out := make([]ChunkRef, len(refs))
	for i, r := range refs {
		out[i] = *r
	}
	return out, nil
}

// buffer returns the i-th chunk buffer of a batch (one Put uses one
// chunkSize).
func (w *putWriter) buffer(i int, chunkSize int64) []byte {
	for len(w.bufs) <= i {
		w.bufs = append(w.bufs, make([]byte, chunkSize))
	}
	return w.bufs[i]
}

// lease names chunks in the lease, then waits out any GC run. Only after
// that may Put decide that a chunk is stored.
func (w *putWriter) lease(ctx context.Context, ds []Digest) error {
	if err := w.l.add(ctx, ds); err != nil {
		return err
	}
	return w.s.waitForGC(ctx, w.l)
}

// flush leases the pending chunks, waits out any GC run, then uploads the
// pending chunks the backend lacks, and fills in the refs' digests and
// encodings.
func (w *putWriter) flush(ctx context.Context) error {
	defer func() { w.pending = w.pending[:0] }()
	var lease []Digest
	inLease := make(map[Digest]bool) // a batch of small chunks is thousands
	for _, p := range w.pending {
		p.digest = w.digests.sum(p.data)
		p.ref.Digest = p.digest
		if _, ok := w.stored[p.digest]; !ok && !inLease[p.digest] {
			inLease[p.digest] = true
			lease = append(lease, p.digest)
		}
	}
	if len(lease) == 0 {
		w.stats.ReusedChunks += len(w.pending)
		w.setEncodings()
		return w.l.keepAlive(ctx)
	}
	if err := w.lease(ctx, lease); err != nil {
		return err
	}

	type upload struct {
		p   *pendingChunk
		res chunkWrite
	}
	var ups []*upload
	for _, p := range w.pending {
		if _, ok := w.stored[p.digest]; ok || !inLease[p.digest] {
			w.stats.ReusedChunks++
			continue
		}
		delete(inLease, p.digest) // later copies in the batch reuse this one
		ups = append(ups, &upload{p: p})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.s.concurrency)
	for _, u := range ups {
		g.Go(func() error {
			var err error
			u.res, err = w.storeChunk(gctx, u.p)
			return err
		})
	}
	err := g.Wait()
	for _, u := range ups {
		if u.res.isNew {
			w.stats.NewChunks++
			w.stats.NewBytes += u.res.grown
			w.stats.RawNewBytes += int64(len(u.p.data))
		} else if err == nil {
			w.stats.ReusedChunks++
		}
	}
	if err != nil {
		return err
	}
	for _, u := range ups {
		w.stored[u.p.digest] = u.res.encoding
	}
	w.setEncodings()
	return nil
}

// setEncodings fills in the encodings of the pending refs, all of whose
// chunks are stored.
func (w *putWriter) setEncodings() {
	for _, p := range w.pending {
		p.ref.Encoding = w.stored[p.digest]
	}
}

// storeChunk stores a pending chunk (see Store.storeChunk) with a scratch
// buffer of the writer's.
func (w *putWriter) storeChunk(ctx context.Context, p *pendingChunk) (chunkWrite, error) {
	var buf []byte
	select {
	case buf = <-w.scratch:
	default: // every buffer in use: make one
	}
	res, err := w.s.storeChunk(ctx, p.digest, p.data, &buf)
	if buf != nil {
		select {
		case w.scratch <- buf:
		default:
		}
	}
	return res, err
}

// checkParent makes sure the stored parent manifest is the one given.
func (w *putWriter) checkParent(ctx context.Context, parent *Manifest) error {
	m, err := w.s.Get(ctx, parent.ID)
	if err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	for _, want := range parent.Files {
		got, ok := m.File(want.Name)
		if !ok || got.Size != want.Size || !slices.Equal(got.Chunks, want.Chunks) {
			return fmt.Errorf("parent %s was replaced since it was read: %w", parent.ID, errkind.FailedPrecondition)
		}
	}
	return nil
}

// chunkWrite is what storeChunk did with a chunk.
type chunkWrite struct {
	encoding string // of the object refs to the chunk name
	isNew    bool   // it uploaded the chunk
	grown    int64  // bytes the backend grew by
}

// storeChunk makes sure the backend holds chunk d, whose content is data,
// in one encoding or the other, and returns which. It encodes data first
// (compressing into *scratch) to learn the encoding it would write, looks
// for that object, then for the other: either will do, so stores that
// compress and stores that do not share chunks, and neither stores a chunk
// twice. It uploads only if neither exists with a plausible size; a
// damaged object at the key it writes is replaced.
func (s *Store) storeChunk(ctx context.Context, d Digest, data []byte, scratch *[]byte) (chunkWrite, error) {
	encoding, stored := s.encodeChunk(data, scratch)
	var had int64 // the size of the damaged object the upload replaces
	for _, e := range []string{encoding, otherEncoding(encoding)} {
		o, err := s.b.Stat(ctx, chunkObjectKey(d, e))
		switch {
		case err == nil && plausibleSize(e, o.Size, int64(len(data))):
			return chunkWrite{encoding: e}, nil
		case err == nil && e == encoding:
			had = o.Size
		case err != nil && !errors.Is(err, errkind.NotFound):
			return chunkWrite{}, fmt.Errorf("chunk %s: %w", d, err)
		}
	}
	if err := s.b.Put(ctx, chunkObjectKey(d, encoding), bytes.NewReader(stored), int64(len(stored))); err != nil {
		return chunkWrite{}, fmt.Errorf("chunk %s: %w", d, err)
	}
	return chunkWrite{encoding: encoding, isNew: true, grown: int64(len(stored)) - had}, nil
}

// intersect returns the parts of the sorted, disjoint data ranges that
// fall in [off, off+length).
func intersect(data []Range, off, length int64) []Range {
	end := off + length
	i, _ := slices.BinarySearchFunc(data, off, func(r Range, off int64) int {
		if r.Off+r.Len <= off {
			return -1
		}
		return 1
	})
	var out []Range
	for ; i < len(data) && data[i].Off < end; i++ {
		s, e := max(data[i].Off, off), min(data[i].Off+data[i].Len, end)
		if s < e {
			out = append(out, Range{Off: s, Len: e - s})
		}
	}
	return out
}
