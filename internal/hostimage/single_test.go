package hostimage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"space/internal/errkind"
)

func TestWriteBinaryArchive(t *testing.T) {
	bin := staticBinary(t, "pause")
	dst := filepath.Join(t.TempDir(), "pause.tar")
	const ref = "localhost/space-pause:1"
	if err := WriteBinaryArchive(t.Context(), bin, ref, dst); err != nil {
		t.Fatalf("WriteBinaryArchive() error = %v", err)
	}
	img := openLayout(t, dst, ref, "1")
	checkDockerArchive(t, dst, img)
	checkConfig(t, img, []string{"/bin"}, "", nil)
	files, _ := readImage(t, img)
	if len(files) != 1 || files["bin"] == nil || files["bin"].Mode != 0o755 {
		t.Errorf("image files = %v, want just bin, mode 0755", files)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Errorf("image layers = %d (%v), want 1", len(layers), err)
	}
}

func TestWriteBinaryArchiveInvalid(t *testing.T) {
	bin := staticBinary(t, "pause")
	dir := t.TempDir()
	tests := []struct {
		name, bin, ref string
		want           error
	}{
		{"bad reference", bin, "localhost/UPPER:1", errkind.InvalidArgument},
		{"no tag", bin, "localhost/pause", errkind.InvalidArgument},
		{"dynamic binary", "/bin/sh", "localhost/pause:1", errkind.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(dir, "out.tar")
			err := WriteBinaryArchive(t.Context(), tt.bin, tt.ref, dst)
			if !errors.Is(err, tt.want) {
				t.Errorf("WriteBinaryArchive(%s, %s) error = %v, want %v", tt.bin, tt.ref, err, tt.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("after a failed WriteBinaryArchive: %s holds %d entries, want none", dir, len(ents))
			}
		})
	}
}
