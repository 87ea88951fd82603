package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"space/internal/chunkstore"
	"space/internal/errkind"
	"space/internal/reflink"
	"space/internal/sandbox"
	"space/internal/vmm"
)

// snapshotInfoFile marks a complete snapshot directory: it is written
// last, so a directory without it is a snapshot a crash interrupted.
const snapshotInfoFile = "info.json"

func (w *Worker) snapshotsDir() string { return filepath.Join(w.cfg.DataDir, "snapshots") }

// snapshotDir returns where snapshot id lives, checking the id.
func (w *Worker) snapshotDir(id string) (string, error) {
	if !validSnapshotID(id) {
		return "", fmt.Errorf("snapshot id %.64q: %w", id, errkind.InvalidArgument)
	}
	return filepath.Join(w.snapshotsDir(), id), nil
}

// validSnapshotID accepts 1-64 characters of [a-z0-9_].
func validSnapshotID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// ErrSnapshotNotFound is returned for a snapshot the worker does not hold.
var ErrSnapshotNotFound = fmt.Errorf("snapshot not found on this worker: %w", errkind.NotFound)

// Snapshot takes a live snapshot of sandbox sandboxID as snapshot
// req.SnapshotID: memory, device state and writable disk at one instant.
// The sandbox keeps running (it is paused only while its state is saved).
// With a chunk store the snapshot goes there too, unless req.Local.
// While the worker holds no lease it is ErrNoLease.
func (w *Worker) Snapshot(ctx context.Context, sandboxID string, req SnapshotRequest) (SnapshotInfo, error) {
	if err := w.checkServing("snapshot " + sandboxID); err != nil {
		return SnapshotInfo{}, err
	}
	snapID := req.SnapshotID
	dir, err := w.snapshotDir(snapID)
	if err != nil {
		return SnapshotInfo{}, err
	}
	s, err := w.get(sandboxID)
	if err != nil {
		return SnapshotInfo{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	// The driver resumes a guest it paused for the snapshot: one the
	// fence paused meanwhile is paused again.
	defer w.holdFence(context.WithoutCancel(ctx), s)
	s.mu.Lock()
	state, vm, spec, team := s.rec.State, s.vm, s.rec.Spec, s.rec.Team
	s.mu.Unlock()
	if (state != sandbox.Running && state != sandbox.Paused) || vm == nil {
		return SnapshotInfo{}, fmt.Errorf("%s is %s: %w", sandboxID, state, ErrNotRunning)
	}
	sn, ok := vm.(vmm.Snapshotter)
	if !ok {
		return SnapshotInfo{}, fmt.Errorf("%s: %T cannot snapshot: %w", sandboxID, vm, errkind.FailedPrecondition)
	}
	if err := os.MkdirAll(w.snapshotsDir(), 0o700); err != nil {
		return SnapshotInfo{}, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", snapID, errkind.Conflict)
		}
		return SnapshotInfo{}, err
	}
	// On reflink storage the VM has a MemoryPath: a driver that can
	// takes a diff merged onto its previous snapshot (Firecracker), and
	// the memory file shares the extents of what did not change.
	opts := vmm.SnapshotOptions{Diff: w.cfg.ReflinkStorage, Ephemeral: req.Ephemeral, Paused: func() { w.crash("snapshot.vm-paused") }}
	vmStopped := s.stopVM()
	taken, err := sn.Snapshot(ctx, filepath.Join(dir, "vm"), opts)
	vmStopped()
	if err != nil {
		return SnapshotInfo{}, errors.Join(err, os.RemoveAll(dir))
	}
	w.crash("snapshot.vm-saved")
	info := SnapshotInfo{ID: snapID, SandboxID: sandboxID, Spec: spec, Created: time.Now().UTC(), PausedMS: taken.Took.Milliseconds()}
	info.LogicalBytes, info.StoredBytes, err = treeSize(filepath.Join(dir, "vm"))
	if err == nil && w.cfg.Chunks != nil && !req.Local {
		info.Chunked = true
		info.NewBytes, info.ReadBytes, err = w.putChunks(ctx, dir, info, dedupDomain(team, sandboxID), taken.Reflinked)
		w.crash("snapshot.chunks-stored")
	}
	if err == nil {
		err = writeJSONFile(dir, snapshotInfoFile, info)
	}
	if err != nil {
		return SnapshotInfo{}, errors.Join(err, os.RemoveAll(dir))
	}
	w.metrics.pause.Observe(taken.Took.Seconds())
	if info.Chunked {
		w.metrics.stored.Observe(float64(info.NewBytes))
	} else {
		w.metrics.stored.Observe(float64(info.StoredBytes))
	}
	w.log.Info("snapshot taken", "sandbox_id", sandboxID, "snapshot_id", snapID, "paused", taken.Took, "reflinked", taken.Reflinked)
	return info, nil
}

// dedupDomain returns the chunk store's dedup domain of the snapshots of
// a sandbox of team: the team's own, so that what a snapshot stores (its
// new_bytes, the time it takes) never depends on what another team
// stored. A sandbox recorded without a team (none should be) gets one of
// its own.
func dedupDomain(team, sandboxID string) string {
	if team == "" {
		return "sandbox/" + sandboxID
	}
	return chunkstore.TeamDomain(team)
}

// putChunks stores the snapshot's files and its info as manifest info.ID
// in the chunk store, in dedup domain domain, and returns the bytes that
// added. Files reflinked from the guest's (reflinked) are compared by
// extents with the sandbox's previous stored snapshot: only ranges that
// changed since are read.
func (w *Worker) putChunks(ctx context.Context, dir string, info SnapshotInfo, domain string, reflinked bool) (newBytes, readBytes int64, err error) {
	staged := filepath.Join(dir, ".chunk-info.json")
	if err := writeJSONFile(dir, ".chunk-info.json", info); err != nil {
		return 0, 0, err
	}
	defer os.Remove(staged)
	files := []chunkstore.File{{Name: snapshotInfoFile, Path: staged}}
	entries, err := os.ReadDir(filepath.Join(dir, "vm"))
	if err != nil {
		return 0, 0, err
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			files = append(files, chunkstore.File{Name: "vm." + e.Name(), Path: filepath.Join(dir, "vm", e.Name())})
		}
	}
	opts := chunkstore.PutOptions{Domain: domain}
	if reflinked {
		opts.Parent, opts.Dirty = w.dirtySince(ctx, info, files[1:])
	}
	_, st, err := w.cfg.Chunks.Put(ctx, info.ID, files, opts)
	if err != nil && opts.Parent != nil && ctx.Err() == nil {
		// The parent went (deleted meanwhile): nothing was committed, so
		// store the snapshot on its own.
		w.log.Info("storing snapshot without its parent", "snapshot_id", info.ID, "parent", opts.Parent.ID, "err", err)
		opts = chunkstore.PutOptions{Domain: domain}
		_, st, err = w.cfg.Chunks.Put(ctx, info.ID, files, opts)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("store snapshot %s: %w", info.ID, err)
	}
	parent, dirty := "", int64(0)
	if opts.Parent != nil {
		parent = opts.Parent.ID
		for _, rs := range opts.Dirty {
			for _, r := range rs {
				dirty += r.Len
			}
		}
	}
	w.log.Info("snapshot stored", "snapshot_id", info.ID, "parent", parent, "dirty", dirty, "logical", st.LogicalBytes,
		"read", st.ReadBytes, "new", st.NewBytes, "new_uncompressed", st.RawNewBytes, "reused_chunks", st.ReusedChunks)
	return st.NewBytes, st.ReadBytes, nil
}

// dirtySince returns the Put parent and dirty ranges that take from the
// sandbox's latest stored snapshot on this disk whatever its extent maps
// prove unchanged (reflink.Changed): the dirty log of a guest on reflink
// storage. Without such a snapshot (nil, nil), or where extents cannot be
// compared, files are read in full. (The parent is the same sandbox's,
// so of its team's dedup domain, unless it predates domains: then Put
// reads in full.)
func (w *Worker) dirtySince(ctx context.Context, info SnapshotInfo, files []chunkstore.File) (*chunkstore.Manifest, map[string][]chunkstore.Range) {
	prev, ok := w.latestStored(info.SandboxID, info.ID)
	if !ok {
		return nil, nil
	}
	m, err := w.cfg.Chunks.Get(ctx, prev.ID)
	if err != nil {
		return nil, nil
	}
	prevDir, err := w.snapshotDir(prev.ID)
	if err != nil {
		return nil, nil
	}
	dirty := map[string][]chunkstore.Range{}
	for _, f := range files {
		if _, ok := m.File(f.Name); !ok {
			continue
		}
		name, _ := strings.CutPrefix(f.Name, "vm.")
		changed, err := reflink.Changed(filepath.Join(prevDir, "vm", name), f.Path)
		if err != nil {
			w.log.Debug("reading snapshot file in full", "file", f.Path, "err", err)
			continue
		}
		rs := make([]chunkstore.Range, 0, len(changed))
		for _, r := range changed {
			rs = append(rs, chunkstore.Range{Off: r.Off, Len: r.Len})
		}
		dirty[f.Name] = rs
	}
	if len(dirty) == 0 {
		return nil, nil
	}
	return &m, dirty
}

// latestStored returns the newest complete snapshot of sandboxID on this
// disk that is also in the chunk store, other than except.
func (w *Worker) latestStored(sandboxID, except string) (SnapshotInfo, bool) {
	entries, err := os.ReadDir(w.snapshotsDir())
	if err != nil {
		return SnapshotInfo{}, false
	}
	var best SnapshotInfo
	for _, e := range entries {
		if e.Name() == except || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		si, err := w.snapshotInfo(e.Name())
		if err != nil || !si.Chunked || si.SandboxID != sandboxID {
			continue
		}
		if si.Created.After(best.Created) {
			best = si
		}
	}
	return best, best.ID != ""
}

// fetch makes sure the worker has snapshot id on its disk, reassembling it
// from the chunk store into its snapshot cache when it has not (a snapshot
// another worker took). It reports whether it had to.
func (w *Worker) fetch(ctx context.Context, id string) (fetched bool, err error) {
	if _, err := w.snapshotInfo(id); !errors.Is(err, errkind.NotFound) {
		return false, err
	}
	if w.cfg.Chunks == nil {
		return false, fmt.Errorf("%s: %w", id, ErrSnapshotNotFound)
	}
	m, err := w.cfg.Chunks.Get(ctx, id)
	if err != nil {
		return false, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := os.MkdirAll(w.snapshotsDir(), 0o700); err != nil {
		return false, err
	}
	tmp, err := os.MkdirTemp(w.snapshotsDir(), ".fetch-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Mkdir(filepath.Join(tmp, "vm"), 0o700); err != nil {
		return false, err
	}
	t0 := time.Now()
	for _, f := range m.Files {
		dst := filepath.Join(tmp, snapshotInfoFile)
		if name, ok := strings.CutPrefix(f.Name, "vm."); ok {
			dst = filepath.Join(tmp, "vm", name)
		} else if f.Name != snapshotInfoFile {
			return false, fmt.Errorf("snapshot %s: unexpected file %q: %w", id, f.Name, errkind.Internal)
		}
		if err := w.cfg.Chunks.Restore(ctx, m, f.Name, dst); err != nil {
			return false, fmt.Errorf("snapshot %s: %w", id, err)
		}
	}
	dir, err := w.snapshotDir(id)
	if err != nil {
		return false, err
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) && !strings.Contains(err.Error(), "not empty") {
		return false, err
	}
	w.log.Info("snapshot fetched from the chunk store", "snapshot_id", id, "took", time.Since(t0))
	return true, nil
}

// SnapshotInfo returns the worker's snapshot id, or ErrSnapshotNotFound.
func (w *Worker) SnapshotInfo(_ context.Context, id string) (SnapshotInfo, error) {
	return w.snapshotInfo(id)
}

func (w *Worker) snapshotInfo(id string) (SnapshotInfo, error) {
	dir, err := w.snapshotDir(id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	var info SnapshotInfo
	b, err := os.ReadFile(filepath.Join(dir, snapshotInfoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return info, fmt.Errorf("%s: %w", id, ErrSnapshotNotFound)
	}
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(b, &info); err != nil || info.ID != id {
		return info, fmt.Errorf("snapshot %s: unreadable info: %v: %w", id, err, errkind.Internal)
	}
	return info, nil
}

// DeleteSnapshot removes the worker's copy of snapshot id. Sandboxes
// restored from it do not need it any more (their memory and disk are
// their own copies).
func (w *Worker) DeleteSnapshot(ctx context.Context, id string) error {
	dir, err := w.snapshotDir(id)
	if err != nil {
		return err
	}
	if w.cfg.Chunks != nil {
		// The manifest goes; the chunk store's GC frees chunks no other
		// manifest uses.
		err := w.cfg.Chunks.Delete(ctx, id)
		if err != nil && !errors.Is(err, errkind.NotFound) {
			return err
		}
		if err == nil {
			if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
				return nil // stored, never cached here
			}
		}
	}
	// The info file goes first: a crash halfway leaves an incomplete
	// snapshot, which Start removes, never a damaged complete one.
	if err := os.Remove(filepath.Join(dir, snapshotInfoFile)); errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", id, ErrSnapshotNotFound)
		}
	} else if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// CreateFromSnapshot starts sandbox id for team as a copy of snapshot
// snapID: the memory, processes and files at the snapshot, with its own
// writable disk, fresh entropy, clock and hostname. The spec is the
// snapshot's; a non-nil spec (a template's sandbox) must have its
// template and resources and gives its own exec defaults (Env, Workdir,
// User).
func (w *Worker) CreateFromSnapshot(ctx context.Context, id, team, snapID string, spec *Spec) (Info, error) {
	if err := w.checkServing("create " + id); err != nil {
		return Info{}, err
	}
	return w.createFromSnapshot(ctx, id, team, snapID, spec, nil, false)
}

// createFromSnapshot is CreateFromSnapshot with the values of the
// secrets spec grants; take spends the snapshot (CreateRequest.TakeSnapshot).
func (w *Worker) createFromSnapshot(ctx context.Context, id, team, snapID string, spec *Spec, secretValues map[string][]byte, take bool) (Info, error) {
	if _, err := w.fetch(ctx, snapID); err != nil {
		return Info{}, err
	}
	info, err := w.snapshotInfo(snapID)
	if err != nil {
		return Info{}, err
	}
	sp := info.Spec
	if spec != nil {
		if spec.Template != sp.Template || spec.VCPUs != sp.VCPUs || spec.MemoryMiB != sp.MemoryMiB || spec.DiskMiB != sp.DiskMiB {
			return Info{}, fmt.Errorf("snapshot %s has %d vcpus, %d MiB of memory and %d MiB of disk of %s, asked %d, %d and %d of %s: %w",
				snapID, sp.VCPUs, sp.MemoryMiB, sp.DiskMiB, sp.Template, spec.VCPUs, spec.MemoryMiB, spec.DiskMiB, spec.Template, errkind.InvalidArgument)
		}
		sp.Env, sp.Workdir, sp.User, sp.Secrets = spec.Env, spec.Workdir, spec.User, spec.Secrets
		switch {
		case sp.Network != nil && spec.Network != nil:
			sp.Network = spec.Network
		case sp.Network != nil:
			sp.Network = &Network{} // the NIC is in the snapshot: allow nothing
		case spec.Network != nil:
			return Info{}, fmt.Errorf("snapshot %s was taken without a network interface: %w", snapID, errkind.InvalidArgument)
		}
	}
	return w.create(ctx, id, team, sp, createOpts{snapID: snapID, secretValues: secretValues, take: take && !info.Chunked})
}

// Restore rolls sandbox id back to snapshot snapID in place: its VM is
// replaced by one restored from the snapshot (same sandbox ID, the
// snapshot's memory, processes and disk). A crash during the restore
// finishes it on the next start: the record names the snapshot until the
// new VM answers. While the worker holds no lease it is ErrNoLease.
func (w *Worker) Restore(ctx context.Context, id, snapID string) (Info, error) {
	if err := w.checkServing("restore " + id); err != nil {
		return Info{}, err
	}
	if _, err := w.fetch(ctx, snapID); err != nil {
		return Info{}, err
	}
	info, err := w.snapshotInfo(snapID)
	if err != nil {
		return Info{}, err
	}
	s, err := w.get(id)
	if err != nil {
		return Info{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	state, spec := s.rec.State, s.rec.Spec
	s.mu.Unlock()
	if state != sandbox.Running && state != sandbox.Paused {
		return Info{}, fmt.Errorf("%s is %s: %w", id, state, ErrNotRunning)
	}
	if info.Spec.Template != spec.Template || info.Spec.VCPUs != spec.VCPUs || info.Spec.MemoryMiB != spec.MemoryMiB {
		return Info{}, fmt.Errorf("snapshot %s has %d vcpus and %d MiB of %s, sandbox %s %d and %d of %s: %w",
			snapID, info.Spec.VCPUs, info.Spec.MemoryMiB, info.Spec.Template, id, spec.VCPUs, spec.MemoryMiB, spec.Template, errkind.FailedPrecondition)
	}
	if (info.Spec.Network == nil) != (spec.Network == nil) {
		return Info{}, fmt.Errorf("snapshot %s and sandbox %s differ in having a network interface (snapshots from before every sandbox had one have none): %w",
			snapID, id, errkind.FailedPrecondition)
	}
	s.mu.Lock()
	s.rec.RestoreFrom = snapID
	err = s.setStateLocked(sandbox.Creating)
	s.mu.Unlock()
	if err != nil {
		return Info{}, err
	}
	if err := s.save(); err != nil {
		return Info{}, err
	}
	w.crash("restore.recorded")
	return w.restoreLocked(ctx, s)
}

// restoreLocked replaces the sandbox's VM (if any) by one restored from
// s.rec.RestoreFrom. On failure the sandbox is failed: its previous VM is
// already gone. The caller holds s.op.
func (w *Worker) restoreLocked(ctx context.Context, s *sbx) (Info, error) {
	s.closeGateway()
	s.mu.Lock()
	id, snapID, vm, agent := s.rec.ID, s.rec.RestoreFrom, s.vm, s.agent
	s.vm, s.agent = nil, nil
	s.mu.Unlock()
	if agent != nil {
		agent.Close()
	}
	var errs []error
	if vm != nil {
		errs = append(errs, vm.Stop(ctx))
	}
	errs = append(errs, w.removeCgroupNamed(ctx, w.cgroupOf(s)), os.RemoveAll(s.runDir), os.RemoveAll(s.diskDir()))
	if err := errors.Join(errs...); err != nil {
		return Info{}, w.failRestore(ctx, s, err)
	}
	w.crash("restore.old-vm-gone")
	if err := w.launch(ctx, s, snapID, false); err != nil {
		return Info{}, w.failRestore(ctx, s, err)
	}
	w.log.Info("sandbox restored", "sandbox_id", id, "snapshot_id", snapID)
	return s.info(), nil
}

func (w *Worker) failRestore(ctx context.Context, s *sbx, cause error) error {
	err := fmt.Errorf("restore %s: %w", s.id(), cause)
	return errors.Join(err, w.fail(ctx, s, err.Error()))
}

// treeSize sums the apparent sizes and the allocated bytes of the regular
// files below dir.
func treeSize(dir string) (logical, stored int64, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			logical += fi.Size()
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				stored += st.Blocks * 512
			}
		}
		return nil
	})
	return logical, stored, err
}

// writeJSONFile writes v as dir/name through a synced temporary file.
func writeJSONFile(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if err = errors.Join(err, tmp.Sync(), tmp.Close()); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

// spendSnapshot takes snapshot id out of service for sandbox sandboxID to
// move its files from: it renames the directory to a hidden name (so no
// other restore finds it, and a restarted worker removes it) and returns
// that. The caller removes it when done.
func (w *Worker) spendSnapshot(id, sandboxID string) (string, error) {
	dir, err := w.snapshotDir(id)
	if err != nil {
		return "", err
	}
	spent := filepath.Join(w.snapshotsDir(), ".spent-"+id+"-"+sandboxID)
	if err := os.Rename(dir, spent); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s: %w", id, ErrSnapshotNotFound)
		}
		return "", fmt.Errorf("spend snapshot %s: %w", id, err)
	}
	return spent, nil
}

// removeIncompleteSnapshots removes snapshot directories a crash left
// without their info file, and spent ones (spendSnapshot).
func (w *Worker) removeIncompleteSnapshots() error {
	entries, err := os.ReadDir(w.snapshotsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		dir := filepath.Join(w.snapshotsDir(), e.Name())
		if _, err := os.Stat(filepath.Join(dir, snapshotInfoFile)); errors.Is(err, fs.ErrNotExist) || strings.HasPrefix(e.Name(), ".") {
			w.log.Warn("removing incomplete snapshot", "dir", dir)
			errs = append(errs, os.RemoveAll(dir))
		}
	}
	return errors.Join(errs...)
}
