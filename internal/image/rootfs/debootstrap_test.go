package rootfs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/testenv"
)

func TestDebootstrapInvalidConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  BootstrapConfig
	}{
		{"no dir", BootstrapConfig{Suite: "bookworm", Mirror: "http://deb.example.org/debian"}},
		{"comma in a package", BootstrapConfig{Dir: t.TempDir(), Suite: "bookworm", Mirror: "http://deb.example.org/debian", Packages: []string{"curl,git"}}},
		{"empty package", BootstrapConfig{Dir: t.TempDir(), Suite: "bookworm", Mirror: "http://deb.example.org/debian", Packages: []string{""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Debootstrap(t.Context(), tt.cfg); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Debootstrap(%+v) = %v, want an error wrapping %v", tt.cfg, err, errkind.InvalidArgument)
			}
		})
	}
}

func TestDefaultKey(t *testing.T) {
	base := BootstrapConfig{Suite: "bookworm", Variant: "minbase", Mirror: "http://deb.example.org/debian", Packages: []string{"curl", "git"}}
	key := func(cfg BootstrapConfig) string {
		t.Helper()
		k, err := defaultKey(cfg)
		if err != nil {
			t.Fatalf("defaultKey(%+v) error = %v", cfg, err)
		}
		return k
	}
	k := key(base)
	if !strings.HasPrefix(k, "bookworm-minbase-") || strings.ContainsAny(k, "/\x00") {
		t.Errorf("defaultKey(%+v) = %q, want a file name starting bookworm-minbase-", base, k)
	}
	reordered := base
	reordered.Packages = []string{"git", "curl"}
	if got := key(reordered); got != k {
		t.Errorf("defaultKey(reordered packages) = %q, want %q", got, k)
	}
	tests := []struct {
		name   string
		change func(*BootstrapConfig)
	}{
		{"suite", func(c *BootstrapConfig) { c.Suite = "trixie" }},
		{"variant", func(c *BootstrapConfig) { c.Variant = "buildd" }},
		{"mirror", func(c *BootstrapConfig) { c.Mirror = "http://other.example.org/debian" }},
		{"packages", func(c *BootstrapConfig) { c.Packages = []string{"curl"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			cfg.Packages = slices.Clone(base.Packages)
			tt.change(&cfg)
			if got := key(cfg); got == k {
				t.Errorf("defaultKey() with another %s = %q, the same as before", tt.name, got)
			}
		})
	}
}

func TestShrink(t *testing.T) {
	tests := []struct {
		keepLists bool
		want      []string
	}{
		{false, []string{"var/cache/apt/archives/lock", "var/lib/dpkg/status"}},
		{true, []string{
			"var/cache/apt/archives/lock",
			"var/lib/apt/lists/deb_dists_bookworm_InRelease",
			"var/lib/apt/lists/partial/x",
			"var/lib/dpkg/status",
		}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("keepLists=%v", tt.keepLists), func(t *testing.T) {
			root := t.TempDir()
			for _, name := range []string{
				"var/cache/apt/archives/curl_7.88_amd64.deb",
				"var/cache/apt/archives/lock",
				"var/cache/apt/pkgcache.bin",
				"var/lib/apt/lists/deb_dists_bookworm_InRelease",
				"var/lib/apt/lists/partial/x",
				"var/lib/dpkg/status",
			} {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatalf("setup: %v", err)
				}
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			if err := shrink(root, tt.keepLists); err != nil {
				t.Fatalf("shrink() error = %v", err)
			}
			var got []string
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					rel, _ := filepath.Rel(root, p)
					got = append(got, rel)
				}
				return err
			})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("shrink(keepLists=%v) left files mismatch (-want +got):\n%s", tt.keepLists, diff)
			}
			for _, dir := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
				if fi, err := os.Stat(filepath.Join(root, dir)); err != nil || !fi.IsDir() {
					t.Errorf("shrink() removed %s (%v), want it kept", dir, err)
				}
			}
		})
	}
}

// TestDefault builds the default template's image (minutes, once per cache)
// and looks inside with debugfs.
func TestDefault(t *testing.T) {
	testenv.RequireSlow(t)
	testenv.RequireRoot(t, testenv.TierUnit)
	testenv.RequireTool(t, testenv.TierUnit, "debootstrap", "debootstrap")
	requireE2fsprogs(t)
	cache, err := cachedir.Open(testenv.CacheDir(t))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	start := time.Now()
	img, err := Default(t.Context(), cache, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatalf("Default() error = %v", err)
	}
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatalf("Default() = %s: %v", img, err)
	}
	t.Logf("Default() = %s in %v: %d MiB, %d MiB on disk", img, time.Since(start).Round(time.Millisecond),
		fi.Size()/mib, fi.Sys().(*syscall.Stat_t).Blocks*512/mib)
	if got := statField(t, img, "Filesystem volume name"); got != DefaultLabel {
		t.Errorf("Default() image label = %q, want %q", got, DefaultLabel)
	}
	for _, p := range []string{"/usr/bin/python3", "/usr/bin/curl", "/usr/bin/git", "/bin/bash", "/usr/bin/ps", "/etc/ssl/certs/ca-certificates.crt"} {
		out, err := exec.Command("debugfs", "-R", "stat "+p, img).CombinedOutput()
		if err != nil || strings.Contains(string(out), "not found") || !strings.Contains(string(out), "Type: ") {
			t.Errorf("Default() image has no %s: %v\n%s", p, err, out)
		}
	}
	for _, dir := range []string{"/var/cache/apt/archives", "/var/lib/apt/lists"} {
		for name := range lsNames(debugfs(t, img, "ls -l "+dir)) {
			if strings.HasSuffix(name, ".deb") || strings.HasSuffix(name, "Packages") || strings.HasSuffix(name, "InRelease") {
				t.Errorf("Default() image still holds %s/%s", dir, name)
			}
		}
	}

	start = time.Now()
	again, err := Default(t.Context(), cache, nil)
	if err != nil || again != img {
		t.Errorf("Default() again = %q, %v, want %q from the cache", again, err, img)
	}
	t.Logf("Default() from the cache in %v", time.Since(start))
}
