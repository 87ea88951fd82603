package hostimage

import (
	"archive/tar"
	"crypto/x509"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/testenv"
)

// staticBinary builds a small static Go program that prints msg, standing
// in for space or space-agent, and returns its path.
func staticBinary(t *testing.T, msg string) string {
	t.Helper()
	dir := t.TempDir()
	src := "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(" + `"` + msg + `"` + ") }\n"
	for name, data := range map[string]string{"go.mod": "module fake\n\ngo 1.22\n", "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	bin := filepath.Join(dir, "bin")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("setup: go build: %v\n%s", err, out)
	}
	return bin
}

func TestBuildInvalidConfig(t *testing.T) {
	cache, err := cachedir.Open(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	static := staticBinary(t, "space")
	const dynamic = "/bin/sh" // linked against libc on every Debian
	text := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	out := t.TempDir()
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"no cache", Config{Space: static, Agent: static, OutDir: out}, errkind.InvalidArgument},
		{"no space", Config{Cache: cache, Agent: static, OutDir: out}, errkind.InvalidArgument},
		{"no out dir", Config{Cache: cache, Space: static, Agent: static}, errkind.InvalidArgument},
		{"no agent for the worker", Config{Cache: cache, Space: static, OutDir: out, Images: []string{Worker}}, errkind.InvalidArgument},
		{"unknown image", Config{Cache: cache, Space: static, OutDir: out, Images: []string{"proxy"}}, errkind.InvalidArgument},
		{"not an executable", Config{Cache: cache, Space: text, OutDir: out, Images: []string{ControlPlane}}, errkind.FailedPrecondition},
		{"dynamically linked", Config{Cache: cache, Space: dynamic, OutDir: out, Images: []string{ControlPlane}}, errkind.FailedPrecondition},
		{"dynamically linked agent", Config{Cache: cache, Space: static, Agent: dynamic, OutDir: out}, errkind.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Build(t.Context(), tt.cfg); !errors.Is(err, tt.want) {
				t.Errorf("Build(%+v) = %v, want an error wrapping %v", tt.cfg, err, tt.want)
			}
		})
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("failed builds left %d files in the output directory", len(entries))
	}
}

// TestBuild builds both images from the real bases (the worker's takes a
// debootstrap, minutes, once per cache), twice, and checks what is in them
// and that the second build gives the same archives.
func TestBuild(t *testing.T) {
	testenv.RequireSlow(t)
	testenv.RequireRoot(t, testenv.TierNetns) // debootstrap
	testenv.RequireTool(t, testenv.TierUnit, "debootstrap", "debootstrap")
	testenv.RequireTool(t, testenv.TierUnit, "apt-cache", "apt")
	cache, err := cachedir.Open(testenv.CacheDir(t))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	space, agent := staticBinary(t, "space"), staticBinary(t, "space-agent")
	cfg := Config{
		Cache: cache, Space: space, Agent: agent,
		Version: "v1.2.3", Revision: "0123456789abcdef0123456789abcdef01234567", Source: "https://example.org/space",
		Epoch: time.Unix(1800000000, 0),
	}
	build := func(t *testing.T, cfg Config) []Image {
		t.Helper()
		start := time.Now()
		images, err := Build(t.Context(), cfg)
		if err != nil {
			t.Fatalf("Build() error = %v", err)
		}
		t.Logf("Build(images %q) took %v", imageNames(cfg.Images), time.Since(start).Round(time.Millisecond))
		return images
	}
	cfg.OutDir = t.TempDir()
	first := build(t, cfg)
	second := cfg
	second.OutDir = t.TempDir()
	if diff := cmp.Diff(first, build(t, second)); diff != "" {
		t.Errorf("second Build() images mismatch (-first +second):\n%s", diff)
	}
	for _, img := range first {
		a, b := filepath.Join(cfg.OutDir, img.Archive), filepath.Join(second.OutDir, img.Archive)
		if fileSum(t, a) != fileSum(t, b) {
			t.Errorf("archives %s of two builds differ", img.Archive)
		}
		t.Logf("%s: %s, %.1f MiB", img.Reference, img.Digest, float64(img.Size)/(1<<20))
	}
	var index []Image
	if b, err := os.ReadFile(filepath.Join(cfg.OutDir, IndexFile)); err != nil || json.Unmarshal(b, &index) != nil {
		t.Fatalf("read %s: %v", IndexFile, err)
	}
	if diff := cmp.Diff(first, index); diff != "" {
		t.Errorf("%s mismatch (-built +listed):\n%s", IndexFile, diff)
	}
	if len(first) != 2 || first[0].Name != "space-controlplane" || first[1].Name != "space-worker" {
		t.Fatalf("Build() = %+v, want space-controlplane and space-worker", first)
	}

	wantLabels := map[string]string{
		"org.opencontainers.image.version":  "v1.2.3",
		"org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
		"org.opencontainers.image.source":   "https://example.org/space",
		"org.opencontainers.image.created":  "2027-01-15T08:00:00Z",
	}
	t.Run("controlplane", func(t *testing.T) {
		im := first[0]
		img := openArchive(t, filepath.Join(cfg.OutDir, im.Archive), im.Reference, im.Tag)
		checkDockerArchive(t, filepath.Join(cfg.OutDir, im.Archive), img)
		checkConfig(t, img, []string{"/usr/local/bin/space", "server"}, "65532:65532", wantLabels)
		files, data := readImage(t, img, "etc/passwd", "etc/ssl/certs/ca-certificates.crt")
		checkFiles(t, files, "usr/local/bin/space", "usr/share/zoneinfo/UTC", "usr/share/zoneinfo/Europe/Berlin",
			"etc/services", "etc/nsswitch.conf", "tmp", "var/lib/space", "proc")
		if h := files["var/lib/space"]; h == nil || h.Uid != nonroot || h.Gid != nonroot || h.Mode != 0o700 {
			t.Errorf("var/lib/space = %+v, want a directory 0700 of %d:%d", h, nonroot, nonroot)
		}
		if !strings.Contains(data["etc/passwd"], "nonroot:x:65532:65532:") {
			t.Errorf("etc/passwd = %q, want the nonroot user", data["etc/passwd"])
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(data["etc/ssl/certs/ca-certificates.crt"])) || strings.Count(data["etc/ssl/certs/ca-certificates.crt"], "BEGIN CERTIFICATE") < 100 {
			t.Errorf("etc/ssl/certs/ca-certificates.crt holds %d certificates, want a full bundle", strings.Count(data["etc/ssl/certs/ca-certificates.crt"], "BEGIN CERTIFICATE"))
		}
		if h := files["usr/local/bin/space"]; h != nil && h.Size != fileSize(t, space) {
			t.Errorf("usr/local/bin/space has %d bytes, want the %d of %s", h.Size, fileSize(t, space), space)
		}
	})
	t.Run("worker", func(t *testing.T) {
		im := first[1]
		img := openArchive(t, filepath.Join(cfg.OutDir, im.Archive), im.Reference, im.Tag)
		checkConfig(t, img, []string{"/usr/local/bin/space", "worker"}, "0:0", wantLabels)
		files, _ := readImage(t, img)
		checkFiles(t, files,
			"usr/local/bin/space", "usr/local/bin/space-agent",
			"usr/bin/qemu-system-x86_64", "usr/bin/qemu-img",
			"usr/share/seabios/bios-256k.bin", "usr/share/qemu/kvmvapic.bin", "usr/share/qemu/linuxboot_dma.bin",
			"usr/lib/ipxe/qemu/efi-virtio.rom",
			"usr/sbin/mkfs.ext4", "usr/sbin/mkfs.xfs", "usr/bin/ip", "usr/sbin/debootstrap",
			"etc/ssl/certs/ca-certificates.crt", "etc/apt/sources.list", "var/lib/dpkg/status")
		var lists, leaks []string
		for name, h := range files {
			switch {
			case strings.HasPrefix(name, "var/lib/apt/lists/") && strings.HasSuffix(name, "_Packages"):
				lists = append(lists, name)
			case name == "etc/hostname" || name == "etc/resolv.conf" || strings.HasPrefix(name, "dev/") || strings.HasPrefix(name, "var/log/"):
				leaks = append(leaks, name)
			case h.ModTime.Unix() != 0 && name != "usr" && name != "usr/lib" && !strings.HasPrefix(name, "usr/local") &&
				!strings.HasPrefix(name, "usr/lib/space"): // the binaries' and the kernel's layers have the epoch
				leaks = append(leaks, name+" (mtime "+h.ModTime.String()+")")
			}
		}
		// The guests' kernel, one cache entry of the kernel package, for
		// --guest-kernel.
		var kernels []string
		for name := range files {
			if ok, _ := path.Match(strings.TrimPrefix(KernelDir, "/")+"/*/vmlinux", name); ok {
				kernels = append(kernels, name)
			}
		}
		if len(kernels) != 1 {
			t.Errorf("worker image kernels %v, want one %s/<sha256>/vmlinux", kernels, KernelDir)
		} else {
			dir := path.Dir(kernels[0])
			checkFiles(t, files, dir+"/kernel.json", dir+"/vmlinuz")
			if !slices.ContainsFunc(slices.Collect(maps.Keys(files)), func(n string) bool {
				return strings.HasPrefix(n, dir+"/lib/modules/") && strings.HasSuffix(n, "/modules.order")
			}) {
				t.Errorf("no lib/modules/*/modules.order under %s", dir)
			}
		}
		if len(lists) == 0 {
			t.Errorf("no apt package lists in the worker image, want the suite's (the worker looks its guest kernel up there)")
		}
		if len(leaks) > 0 {
			slices.Sort(leaks)
			t.Errorf("worker image holds what the build host or time leaves behind: %v", leaks[:min(10, len(leaks))])
		}
	})
	t.Run("tag follows content", func(t *testing.T) {
		third := cfg
		third.Images = []string{ControlPlane}
		third.Space = staticBinary(t, "space, changed")
		got := build(t, third)
		if len(got) != 1 || got[0].Tag == first[0].Tag || got[0].Digest == first[0].Digest {
			t.Fatalf("Build(another space binary) = %+v, want a new digest and tag for space-controlplane (was %s)", got, first[0].Tag)
		}
		openArchive(t, filepath.Join(cfg.OutDir, got[0].Archive), got[0].Reference, got[0].Tag)
		if _, err := os.Stat(filepath.Join(cfg.OutDir, first[0].Archive)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("old archive %s: %v, want it removed", first[0].Archive, err)
		}
		var index []Image
		if b, err := os.ReadFile(filepath.Join(cfg.OutDir, IndexFile)); err != nil || json.Unmarshal(b, &index) != nil {
			t.Fatalf("read %s: %v", IndexFile, err)
		}
		if diff := cmp.Diff([]Image{got[0], first[1]}, index); diff != "" {
			t.Errorf("%s after rebuilding the control plane mismatch (-want +got):\n%s", IndexFile, diff)
		}
	})
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatalf("stat: %v", err)
	}
	return fi.Size()
}

func checkConfig(t *testing.T, img v1.Image, entrypoint []string, user string, labels map[string]string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("ConfigFile() error = %v", err)
	}
	c := cf.Config
	if diff := cmp.Diff(entrypoint, c.Entrypoint); diff != "" {
		t.Errorf("entrypoint mismatch (-want +got):\n%s", diff)
	}
	if c.User != user {
		t.Errorf("user = %q, want %q", c.User, user)
	}
	for k, v := range labels {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
}

func checkFiles(t *testing.T, files map[string]*tar.Header, names ...string) {
	t.Helper()
	for _, n := range names {
		if files[n] == nil {
			t.Errorf("image lacks %s", n)
		}
	}
}

func imageNames(images []string) string {
	if images == nil {
		return "all"
	}
	return strings.Join(images, ",")
}
