package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"space/internal/errkind"
)

func TestWorkerIdentity(t *testing.T) {
	t.Run("NewDirGetsARandomIDOnce", func(t *testing.T) {
		dir := t.TempDir()
		id, err := workerIdentity(dir, "", "local")
		if err != nil || !strings.HasPrefix(id, "w-") || len(id) != 18 {
			t.Fatalf("workerIdentity(new dir) = %q, %v, want w- and 16 characters", id, err)
		}
		again, err := workerIdentity(dir, "", "local")
		if err != nil || again != id {
			t.Errorf("workerIdentity(same dir) = %q, %v, want %q", again, err, id)
		}
		other, _ := workerIdentity(t.TempDir(), "", "local")
		if other == id {
			t.Errorf("two new data dirs both got %q", id)
		}
	})
	t.Run("GivenIDIsRecorded", func(t *testing.T) {
		dir := t.TempDir()
		if id, err := workerIdentity(dir, "alpha", ""); err != nil || id != "alpha" {
			t.Fatalf("workerIdentity(alpha) = %q, %v", id, err)
		}
		if id, err := workerIdentity(dir, "", ""); err != nil || id != "alpha" {
			t.Errorf("workerIdentity(recorded) = %q, %v, want alpha", id, err)
		}
		_, err := workerIdentity(dir, "beta", "")
		if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "belongs to worker alpha") {
			t.Errorf("workerIdentity(other id) = %v, want FailedPrecondition naming alpha", err)
		}
	})
	t.Run("DirFromBeforeIDsKeepsItsLegacyID", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "worker"), 0o700); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if id, err := workerIdentity(dir, "", "local"); err != nil || id != "local" {
			t.Errorf("workerIdentity(old dir) = %q, %v, want local", id, err)
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := workerIdentity(dir, "no spaces", ""); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("workerIdentity(bad id) = %v, want InvalidArgument", err)
		}
		if _, err := os.Stat(filepath.Join(dir, workerIDFile)); !os.IsNotExist(err) {
			t.Errorf("a refused id left %s: %v", workerIDFile, err)
		}
		os.WriteFile(filepath.Join(dir, workerIDFile), []byte("../x\n"), 0o600)
		if _, err := workerIdentity(dir, "", ""); !errors.Is(err, errkind.FailedPrecondition) {
			t.Errorf("workerIdentity(corrupt file) = %v, want FailedPrecondition", err)
		}
	})
}
