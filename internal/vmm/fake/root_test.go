package fake

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"space/internal/errkind"
	"space/internal/vmm"
)

// TestNeedsRoot: without root, Boot and Restore refuse before they create
// anything; the fake never runs a guest unjailed.
func TestNeedsRoot(t *testing.T) {
	d, err := New(Config{})
	if err != nil {
		t.Fatalf("setup: New() = %v", err)
	}
	d.euid = func() int { return 1000 }
	run := filepath.Join(t.TempDir(), "vm")
	if _, err := d.Boot(t.Context(), vmm.Spec{RunDir: run}); !errors.Is(err, ErrNeedsRoot) || !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Boot() as uid 1000 = %v, want ErrNeedsRoot (FailedPrecondition)", err)
	}
	snap := t.TempDir()
	if err := os.WriteFile(filepath.Join(snap, metaFile), []byte(`{"driver":"fake","version":"`+Version+`","disks":0}`), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := d.Restore(t.Context(), snap, vmm.Spec{RunDir: run}); !errors.Is(err, ErrNeedsRoot) {
		t.Errorf("Restore() as uid 1000 = %v, want ErrNeedsRoot", err)
	}
	if _, err := os.Stat(run); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir after a refused boot: %v, want none", err)
	}
}
