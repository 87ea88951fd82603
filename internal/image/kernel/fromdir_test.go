package kernel

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"space/internal/errkind"
)

// writeEntry writes a kernel entry as Fetch caches it (without real
// kernel contents) under dir, named sha.
func writeEntry(t *testing.T, dir, sha string) string {
	t.Helper()
	entry := filepath.Join(dir, sha)
	if err := os.MkdirAll(filepath.Join(entry, "lib", "modules", "6.1.0-1-cloud-amd64"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(meta{Version: "6.1.0-1-cloud-amd64", Package: "linux-image-6.1.0-1-cloud-amd64", PackageVersion: "6.1.1-1", SHA256: sha})
	for name, data := range map[string][]byte{metaFile: b, "vmlinuz": []byte("bz"), "vmlinux": []byte("elf")} {
		if err := os.WriteFile(filepath.Join(entry, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return entry
}

func TestFromDir(t *testing.T) {
	dir := t.TempDir()
	if _, err := FromDir(dir); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("FromDir(empty) = %v, want invalid argument", err)
	}
	entry := writeEntry(t, dir, "aa11")
	k, err := FromDir(dir)
	if err != nil {
		t.Fatalf("FromDir = %v", err)
	}
	if k.Version != "6.1.0-1-cloud-amd64" || k.SHA256 != "aa11" || k.Vmlinux != filepath.Join(entry, "vmlinux") {
		t.Errorf("FromDir = %+v", k)
	}

	writeEntry(t, dir, "bb22")
	if _, err := FromDir(dir); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("FromDir(two kernels) = %v, want invalid argument", err)
	}
	os.RemoveAll(filepath.Join(dir, "bb22"))

	os.Remove(filepath.Join(entry, "vmlinux"))
	if _, err := FromDir(dir); err == nil {
		t.Error("FromDir(no vmlinux) succeeded")
	}
	if _, err := FromDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("FromDir(a missing directory) succeeded")
	}
}
