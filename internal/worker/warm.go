package worker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"space/internal/errkind"
	"space/internal/imagebuild"
	"space/internal/store"
	"space/internal/vmm"
)

// Warm templates: the first sandbox of each shape (template, vCPUs,
// memory, disk) is snapshotted right after it booted, before anything ran
// in it; later sandboxes of that shape restore that snapshot instead of
// booting. A template is keyed by its images too, so new images (a new
// agent, kernel or root) get new templates.

func (w *Worker) warmRoot() string { return filepath.Join(w.cfg.DataDir, "warm") }

// warmDir is where the warm template of spec's shape and img lives.
func (w *Worker) warmDir(spec Spec, img *imagebuild.Artifacts) string {
	h := sha256.New()
	// "nic": the template's VM has a NIC (templates from before had none).
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00nic", spec.Template, img.Kernel.Vmlinux, img.Initramfs, img.Rootfs)
	key := fmt.Sprintf("%s-%dc-%dm-%dd-%s", spec.Template, spec.VCPUs, spec.MemoryMiB, spec.DiskMiB, hex.EncodeToString(h.Sum(nil))[:16])
	return filepath.Join(w.warmRoot(), key)
}

func (w *Worker) warmReady(spec Spec, img *imagebuild.Artifacts) bool {
	_, err := os.Stat(filepath.Join(w.warmDir(spec, img), snapshotInfoFile))
	return err == nil
}

// captureWarm snapshots vm, which has just booted with spec, as the warm
// template of its shape. It writes into a temporary directory and renames
// it into place, so a template is complete or absent; if another create
// got there first, its template stays.
func (w *Worker) captureWarm(ctx context.Context, vm vmm.VM, spec Spec, img *imagebuild.Artifacts) error {
	sn, ok := vm.(vmm.Snapshotter)
	if !ok {
		return fmt.Errorf("%T cannot snapshot: %w", vm, errkind.FailedPrecondition)
	}
	if err := os.MkdirAll(w.warmRoot(), 0o700); err != nil {
		return err
	}
	var b [6]byte
	rand.Read(b[:])
	tmp := filepath.Join(w.warmRoot(), ".tmp-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	taken, err := sn.Snapshot(ctx, filepath.Join(tmp, "vm"), vmm.SnapshotOptions{})
	if err == nil {
		info := SnapshotInfo{ID: "warm", Spec: spec, PausedMS: taken.Took.Milliseconds()}
		info.LogicalBytes, info.StoredBytes, err = treeSize(filepath.Join(tmp, "vm"))
		if err == nil {
			err = writeJSONFile(tmp, snapshotInfoFile, info)
		}
	}
	if err == nil {
		err = os.Rename(tmp, w.warmDir(spec, img))
		if err == nil {
			w.log.Info("warm template captured", "dir", w.warmDir(spec, img), "paused", taken.Took)
			return nil
		}
		if errors.Is(err, os.ErrExist) || strings.Contains(err.Error(), "not empty") {
			err = nil // another create captured it first
		}
	}
	return errors.Join(err, os.RemoveAll(tmp))
}

// removeIncompleteWarm removes temporary warm template directories a crash
// left, and templates without a NIC (from before every sandbox had one;
// no create restores them any more).
func (w *Worker) removeIncompleteWarm() error {
	entries, err := os.ReadDir(w.warmRoot())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		dir := filepath.Join(w.warmRoot(), e.Name())
		var info SnapshotInfo
		if strings.HasPrefix(e.Name(), ".tmp-") {
			errs = append(errs, os.RemoveAll(dir))
		} else if b, err := os.ReadFile(filepath.Join(dir, snapshotInfoFile)); err == nil && json.Unmarshal(b, &info) == nil && info.Spec.Network == nil {
			w.log.Info("removing a warm template without a NIC", "dir", dir)
			errs = append(errs, os.RemoveAll(dir))
		}
	}
	return errors.Join(errs...)
}

// Warm captures the warm template of spec's shape if there is none yet,
// by booting a sandbox of the worker's own and removing it again. The
// server calls it at start for the default shape, so even the first user
// sandbox is a restore.
func (w *Worker) Warm(ctx context.Context, spec Spec) error {
	spec = withNIC(spec)
	if err := validateSpec(spec); err != nil {
		return err
	}
	img, err := w.cfg.Templates.Template(ctx, spec.Template)
	if err != nil {
		return err
	}
	if w.warmReady(spec, img) {
		return nil
	}
	id := store.NewSandboxID()
	if _, err := w.create(ctx, id, poolTeam, spec, createOpts{internal: true}); err != nil {
		return fmt.Errorf("warm %s: %w", spec.Template, err)
	}
	return w.Delete(context.WithoutCancel(ctx), id)
}
