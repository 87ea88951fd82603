// Package chunkstore stores snapshot files as manifests of content-addressed
// chunks, so a new snapshot stores only the chunks no earlier one of its
// dedup domain did.
//
// # Model
//
// A snapshot of a VM is a few files: a memory file (hundreds of MiB to a
// few GiB, mostly sparse), a device-state file, a sparse disk image. Put
// cuts each file into chunks of the Store's chunk size (Config.ChunkSize,
// 64 KiB unless set) at fixed, aligned offsets (the last chunk is shorter)
// and names each chunk by its digest, the BLAKE3-256 hash of its content
// keyed by the snapshot's dedup domain (see Dedup domains).
// Holes are never read: Put walks the file with SEEK_DATA/SEEK_HOLE
// (reading everything where the file system lacks them) and skips chunks
// that are wholly a hole; a chunk that reads as all zeros is recorded as a
// hole too. Neither is stored. A chunk that is stored is compressed
// where that pays (see Compression).
//
// A manifest (JSON) records the chunk size and the dedup domain and lists
// a snapshot's files:
// name, size, permission bits, and the chunk refs {offset, length, digest,
// encoding} of the chunks that are not holes. Restore rebuilds a file from a
// manifest as a sparse file (truncate, then WriteAt of each chunk) and
// checks every chunk against its digest and length before writing it: a
// damaged chunk is ErrCorrupt, a lost one ErrChunkMissing, never silently
// wrong data.
//
// A VMM with dirty-page tracking can pass PutOptions.Dirty: then only the
// chunks overlapping the dirty ranges are read, and the others are taken
// from PutOptions.Parent's manifest.
//
// # Dedup domains
//
// Deduplication across tenants is an oracle: if what a Put stores
// (NewBytes) or how long it takes depends on whether some other tenant
// stored the same chunk, a tenant learns that someone holds a given
// content, and can guess a file's secret field one chunk at a time (the
// attack on convergent storage). So every Put names a dedup domain
// (PutOptions.Domain, one per tenant: the worker uses "team/<team ID>",
// base images "platform/base-images"), and a chunk's digest is
//
//	BLAKE3-256 keyed with DeriveKey("space chunkstore 2026-12-07 chunk digest key v1", domain)
//
// of its content (SumIn). The same bytes in two domains are two chunks
// with two names: Put, which looks up only the names it computed, never
// asks the backend about, matches or reuses a chunk of another domain,
// and what it stores, the requests it makes and so its timing depend only
// on its own domain's chunks (and the backend's load). The key is not
// secret: tenants never name chunks or reach the backend; the domain only
// separates. A manifest records its domain (Manifest.Domain), and every
// chunk it refers to is of that domain: Restore checks each chunk's
// digest in it, and a parent of another domain lends Put no chunks (it
// reads every file in full instead), as a parent of another chunk size
// does. Leases, GC and the chunk cache go by digests and keys as before:
// a keyed digest is just another digest, and two domains' digests of one
// content differ like any two digests. So a host's chunk cache
// (chunkstore/chunkcache) never serves one domain's restore from what
// another domain's fetched. What is shared is the store's machinery, not
// content: a Put waits out GC runs, whose length depends on how much all
// domains deleted.
//
// Manifests written before domains existed have none (the legacy domain
// ""): their digests are the unkeyed BLAKE3-256 (Sum), and they restore
// and keep their chunks through GC as before. Put never writes the legacy
// domain, so nothing new is named there. Binaries from before domains
// refuse a manifest that has one (ErrCorrupt: an unknown field), and
// their GC then deletes nothing: upgrade every process sharing a backend
// before relying on old ones to restore new snapshots.
//
// The cost: content shared by several tenants (a template's pages, the
// same base files) is stored once per tenant instead of once.
//
// # Chunk size
//
// A snapshot stores whole chunks, so a guest's scattered 4 KiB page writes
// cost a chunk each; small chunks make what a snapshot stores follow what
// the guest dirtied, large ones cost fewer objects, requests and manifest
// entries. The size is a per-store setting, a power of two from
// MinChunkSize (4 KiB) to MaxChunkSize (4 MiB), recorded in every
// manifest: Restore, Get and GC go by the manifest's size, so stores with
// different sizes share a backend and read each other's snapshots
// (manifests written when the size was fixed at 1 MiB say 1 MiB). Only
// two things do not cross sizes: chunks of different sizes do not
// deduplicate, and a parent cut at another size lends no chunks (Put
// reads every file in full instead).
//
// # Compression
//
// Much of guest memory is zeros and kernel structures, and a guest that
// dirties one page costs a whole chunk: compressed, such a chunk stores
// little more than that page. So Put compresses each chunk it uploads with
// zstd (its fastest level; one frame per chunk, so every chunk decompresses
// on its own) and keeps the compressed form if it is at least an eighth
// smaller; else (random or encrypted pages, compressed files) it stores
// the chunk raw, which restores without decompressing.
// Config.Compression "none" stores every chunk raw.
//
// A chunk is still named by the digest of its content (in its domain),
// whatever its encoding: deduplication, leases, GC and Restore's check go
// by the digest. Each encoding has its own key,
//
//	chunks/<hh>/<digest>      raw: the content itself
//	chunks/<hh>/<digest>.zst  zstd: one zstd frame of the content
//
// and every chunk ref names the one to read (ChunkRef.Encoding: "" raw,
// "zstd"). So stores that compress, stores that do not, and manifests
// written before compression existed (all raw) share a backend and read
// each other's snapshots. Before it uploads a chunk, Put looks for the
// object it would write, then for the other: a chunk stored in either
// encoding is referenced as it is, not stored again. Both may exist for
// one digest (two writers at once); GC keeps or deletes all the objects
// of a digest together. Restore decompresses a chunk into a buffer of the
// ref's length, refusing more, and checks the digest of what it got: a
// frame that does not decode, or decodes to another length or content, is
// ErrCorrupt.
//
// PutStats.NewBytes counts what the backend stores (compressed sizes);
// RawNewBytes, the content of the same chunks.
//
// # Vocabulary
//
//   - chunk: up to the chunk size of a file, stored once at
//     "chunks/<hh>/<digest>" or, compressed, "chunks/<hh>/<digest>.zst".
//   - dedup domain: the tenant a snapshot's chunks belong to; chunks
//     deduplicate only within one (see Dedup domains).
//   - manifest: a snapshot's file list, at "manifests/<id>". A snapshot
//     exists exactly when its manifest does; Put writes it last.
//   - backend: the object store (Backend): a local directory
//     (chunkstore/local) or an S3 bucket (chunkstore/s3), which a host
//     reads through a bounded cache of the chunks it fetched
//     (chunkstore/chunkcache). chunkstore/chunkloc parses and opens the
//     --chunks location of either.
//   - lease: a writer's record, visible to GC, of the chunks it will
//     reference, at "leases/<id>.<nonce>/<seq>.<expiry>".
//   - GC marker: a GC run's announcement that it is running, at
//     "gc/<nonce>.<expiry>".
//   - expiry: Unix milliseconds in a lease part's or marker's key; the
//     object is live until then (plus ClockSkew, for the other side).
//
// # Garbage collection
//
// GC deletes chunks no manifest refers to (all objects of their digests,
// raw and compressed). Writers run at the same time,
// in other processes, and share nothing but the backend, which offers no
// locks or conditional writes. The danger is a writer that finds a chunk
// already stored (say, one only a just-deleted snapshot used), decides not
// to upload it, and writes a manifest naming it after GC deleted it. Two
// records, each written before its owner reads the other's, rule that out.
//
// Writer (Put), for each batch of chunks:
//
//  1. write a lease part naming the batch's digests (this renews the lease);
//  2. list the GC markers; while an unexpired one exists, wait (renewing
//     the lease);
//  3. only now Stat each chunk (in both encodings) and upload the missing
//     ones;
//
// then renew the lease once more, write the manifest, delete the lease.
//
// GC:
//
//  1. list the chunks: the candidates (a chunk stored later is none);
//  2. write its marker;
//  3. list and read the leases: chunks named by an unexpired lease are live;
//  4. list and read the manifests: chunks they name are live;
//  5. delete the candidates that are not live, renewing the marker between
//     batches and stopping if it expired;
//  6. delete expired leases and markers (crashed writers and runs), then
//     its own marker.
//
// Why it is safe: take a chunk a writer relies on. The writer wrote its
// lease part (W1) before listing markers (W2); GC wrote its marker (G2)
// before listing leases (G3). If G3 ran after W1, GC sees the lease and
// keeps the chunk. Otherwise W1 came after G3, so W2 came after G2 and
// the writer sees the marker and waits until this run is over before it
// looks at the chunk; if GC deleted it, the writer uploads it again. A GC
// run that starts later sees the lease in its step 3. A writer deletes its
// lease only after its manifest landed, and GC lists manifests after
// leases, so one of the two always covers the chunk. Chunks that Dirty
// takes from the parent are leased first, in one part, the same way; then
// Put checks that the parent manifest still exists unchanged, so they are
// still stored.
//
// Assumptions: the backend is strongly consistent for read-after-write
// and list-after-write (local file systems, AWS S3 since 2020, MinIO,
// SeaweedFS); the clocks of the processes sharing a backend differ by
// less than Config.ClockSkew, and one backend request finishes within it;
// a process that stalls longer than Config.LeaseTTL notices before it acts
// (a writer's renewal fails with ErrLeaseExpired and it commits nothing; a
// GC run whose marker expired stops without deleting more). Each side
// honours the other's expiry ClockSkew longer than the owner does. The
// manifest write itself is the one step not re-checked: it must finish
// within LeaseTTL of the renewal before it. Config.GCGrace adds an
// optional age margin (by the backend's ModTime) on top.
//
// Costs: a writer blocks while a GC run is deleting (GC lists chunks
// before it writes its marker, so that part does not block writers).
// NewBytes is exact unless two writers upload the same new chunk at once.
// Put compresses a chunk before it knows whether the backend has it (to
// know which object to look for first): CPU spent on chunks already
// stored, to save a request on the ones stored raw.
//
// # Concurrency
//
// A Store has no mutable state and no locks of its own (its zstd encoder
// and decoder are safe for concurrent use, each running up to GOMAXPROCS
// frames at once); its methods may be called concurrently. One Put
// compresses and uploads, and Restore and GC fetch (and decompress) or
// delete, up to Config.Concurrency objects at once from goroutines that
// end before the call returns.
package chunkstore
