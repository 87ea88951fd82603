package imagebuild

import (
	"errors"
	"os"
	"path/filepath"
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
