package imagebuild

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/testenv"
)

func TestBuildInvalidConfig(t *testing.T) {
	cache, err := cachedir.Open(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no cache", Config{AgentPath: "/bin/true"}},
		{"no agent", Config{Cache: cache}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Build(t.Context(), tt.cfg); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Build(%+v) = %v, want %v", tt.cfg, err, errkind.InvalidArgument)
			}
		})
	}
}

func TestNotStatic(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "script")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if got := notStatic(text); got == "" {
		t.Errorf("notStatic(shell script) = %q, want a reason", got)
	}
	if got := notStatic("/bin/sh"); got == "" {
		t.Errorf("notStatic(/bin/sh) = %q, want a reason (it is dynamically linked)", got)
	}
}

// TestBuild builds (or finds in the shared cache) the real images; a cold
// cache downloads a kernel and runs debootstrap, which takes minutes.
func TestBuild(t *testing.T) {
	testenv.RequireSlow(t)
	testenv.RequireRoot(t, testenv.TierSlow)
	testenv.RequireTool(t, testenv.TierSlow, "debootstrap", "debootstrap")
	cache, err := cachedir.Open(testenv.CacheDir(t))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	// A fixed stand-in agent keeps one cached initramfs across runs.
	agent := filepath.Join(t.TempDir(), "space-agent")
	if err := os.WriteFile(agent, []byte("imagebuild test agent\n"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	art, err := Build(t.Context(), Config{Cache: cache, AgentPath: agent})
	if err != nil {
		t.Fatalf("Build = %v", err)
	}
	for name, p := range map[string]string{
		"vmlinuz": art.Kernel.Vmlinuz, "vmlinux": art.Kernel.Vmlinux,
		"initramfs": art.Initramfs, "rootfs": art.Rootfs,
	} {
		if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
			t.Errorf("Build: %s %s: stat = %v, want a non-empty file", name, p, err)
		}
	}
}

func TestCopyImage(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	const size = 64 << 20
	f, err := os.Create(src)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	head := bytes.Repeat([]byte("head"), 1024)
	tail := bytes.Repeat([]byte("tail"), 1024)
	if _, err := f.WriteAt(head, 0); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := f.WriteAt(tail, 40<<20); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}

	dst := filepath.Join(dir, "dst.img")
	if err := os.WriteFile(dst, []byte("old content"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := CopyImage(t.Context(), src, dst); err != nil {
		t.Fatalf("CopyImage = %v", err)
	}
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("read src: %v", err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatalf("read dst: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("CopyImage: dst (%d bytes) differs from src (%d bytes)", len(got), len(want))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatalf("stat dst: %v", err)
	}
	if used := st.Blocks * 512; used > 4<<20 {
		t.Errorf("CopyImage: dst uses %d bytes of disk for %d bytes of data, want it sparse", used, len(head)+len(tail))
	}

	if err := CopyImage(t.Context(), dst, dst); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("CopyImage(dst, dst) = %v, want %v", err, errkind.InvalidArgument)
	}
	if err := CopyImage(t.Context(), filepath.Join(dir, "missing"), filepath.Join(dir, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CopyImage(missing) = %v, want %v", err, os.ErrNotExist)
	}
}
