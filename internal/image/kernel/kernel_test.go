package kernel

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/testenv"
)

// fakeDeb returns a .deb (ar of a gzipped data.tar) holding files.
func fakeDeb(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var tb bytes.Buffer
	zw := gzip.NewWriter(&tb)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: "./" + name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatalf("setup: %v", err)
		}
		tw.Write(body)
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := zw.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	var b bytes.Buffer
	b.WriteString("!<arch>\n")
	for _, m := range []struct {
		name string
		body []byte
	}{{"debian-binary", []byte("2.0\n")}, {"data.tar.gz", tb.Bytes()}} {
		fmt.Fprintf(&b, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", m.name+"/", 0, 0, 0, "100644", len(m.body))
		b.Write(m.body)
		if len(m.body)%2 == 1 {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// fakeRepo puts fake apt tools on PATH that serve deb as the package
// linux-image-1.2.3-4-cloud-amd64 (and the metapackage
// linux-image-cloud-amd64). It returns the file apt-get logs each call to.
func fakeRepo(t *testing.T, deb []byte) (calls string) {
	t.Helper()
	dir := t.TempDir()
	debPath := filepath.Join(dir, "kernel.deb")
	if err := os.WriteFile(debPath, deb, 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	sum := sha256.Sum256(deb)
	calls = filepath.Join(dir, "apt-get.log")
	const pkg = "linux-image-1.2.3-4-cloud-amd64"
	aptCache := fmt.Sprintf(`#!/bin/sh
for last; do :; done
case "$last" in
linux-image-cloud-amd64) printf 'Package: linux-image-cloud-amd64\nVersion: 1.2.3-4\nDepends: %[1]s (= 1.2.3-4)\nFilename: pool/m.deb\nSHA256: 00\n\n';;
%[1]s) printf 'Package: %[1]s\nVersion: 1.2.3-4\nDepends: kmod\nFilename: pool/main/l/linux/%[1]s_1.2.3-4_amd64.deb\nSize: %[2]d\nSHA256: %[3]s\n\n';;
*) echo 'E: No packages found' >&2; exit 100;;
esac
`, pkg, len(deb), hex.EncodeToString(sum[:]))
	aptGet := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\ncp %s %s_1.2.3-4_amd64.deb\n", calls, debPath, pkg)
	for name, body := range map[string]string{"apt-cache": aptCache, "apt-get": aptGet} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return calls
}

func TestFetchFake(t *testing.T) {
	vmlinux := fakeVmlinux(t, "Xen", xenElfnotePhys32Entry, 4096)
	vmlinuz := bzImage(lz4Legacy(t, vmlinux), len(vmlinux))
	const ver = "1.2.3-4-cloud-amd64"
	deb := fakeDeb(t, map[string][]byte{
		"boot/vmlinuz-" + ver:                        vmlinuz,
		"boot/System.map-" + ver:                     []byte("map"),
		"lib/modules/" + ver + "/modules.builtin":    []byte("kernel/fs/ext4/ext4.ko\n"),
		"lib/modules/" + ver + "/kernel/fs/x/x.ko":   []byte("module"),
		"usr/share/doc/linux-image-" + ver + "/note": []byte("doc"),
	})
	calls := fakeRepo(t, deb)
	cache, err := cachedir.Open(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	sum := sha256.Sum256(deb)
	entry := cache.Path("kernel", hex.EncodeToString(sum[:]))
	want := &Kernel{
		Version:        ver,
		Package:        "linux-image-" + ver,
		PackageVersion: "1.2.3-4",
		SHA256:         hex.EncodeToString(sum[:]),
		Vmlinuz:        filepath.Join(entry, "vmlinuz"),
		Vmlinux:        filepath.Join(entry, "vmlinux"),
		ModulesDir:     filepath.Join(entry, "lib/modules", ver),
	}
	for i := range 2 {
		got, err := Fetch(t.Context(), Config{Cache: cache})
		if err != nil {
			t.Fatalf("Fetch() #%d = %v", i+1, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Fetch() #%d mismatch (-want +got):\n%s", i+1, diff)
		}
	}
	log, err := os.ReadFile(calls)
	if err != nil {
		t.Fatalf("read apt-get log: %v", err)
	}
	if n := strings.Count(string(log), "download"); n != 1 {
		t.Errorf("apt-get download ran %d times over two Fetches, want 1", n)
	}
	for path, wantBody := range map[string][]byte{want.Vmlinuz: vmlinuz, want.Vmlinux: vmlinux, filepath.Join(want.ModulesDir, "kernel/fs/x/x.ko"): []byte("module")} {
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, wantBody) {
			t.Errorf("entry file %s: %d bytes, %v; want %d bytes", path, len(got), err, len(wantBody))
		}
	}
	ents, _ := os.ReadDir(entry)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"kernel.json", "lib", "vmlinux", "vmlinuz"}, names); diff != "" {
		t.Errorf("entry contents mismatch (-want +got):\n%s", diff)
	}
}

func TestFetchErrors(t *testing.T) {
	if _, err := Fetch(t.Context(), Config{}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Fetch(no cache) = %v, want InvalidArgument", err)
	}
	fakeRepo(t, []byte("unused"))
	cache, err := cachedir.Open(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := Fetch(t.Context(), Config{Cache: cache, Package: "linux-image-nosuch"}); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Fetch(unknown package) = %v, want NotFound", err)
	}
}

// TestFetchHost fetches the host's real cloud kernel into the shared test
// cache.
func TestFetchHost(t *testing.T) {
	testenv.RequireSlow(t)
	testenv.RequireTool(t, testenv.TierSlow, "apt-get", "apt")
	cache, err := cachedir.Open(testenv.CacheDir(t))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	k, err := Fetch(t.Context(), Config{Cache: cache})
	if err != nil {
		t.Fatalf("Fetch() = %v", err)
	}
	t.Logf("kernel %s from %s %s", k.Version, k.Package, k.PackageVersion)
	if !regexp.MustCompile(`^\d+\.\d+\.\d+-\d+-cloud-amd64$`).MatchString(k.Version) || k.Package != "linux-image-"+k.Version {
		t.Errorf("Fetch() = version %q, package %q; want <x.y.z-n>-cloud-amd64 and linux-image-<version>", k.Version, k.Package)
	}
	vmlinux, err := os.ReadFile(k.Vmlinux)
	if err != nil {
		t.Fatalf("read vmlinux: %v", err)
	}
	if err := checkPVH(vmlinux); err != nil {
		t.Errorf("vmlinux: %v", err)
	}
	for _, p := range []string{"modules.builtin", "kernel/drivers/virtio/virtio.ko"} {
		if _, err := os.Stat(filepath.Join(k.ModulesDir, p)); err != nil {
			t.Errorf("modules tree: %v", err)
		}
	}

	// Warm cache: apt-get must not run (a failing one comes first on PATH).
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "apt-get"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	again, err := Fetch(t.Context(), Config{Cache: cache})
	if err != nil {
		t.Fatalf("Fetch() with warm cache = %v", err)
	}
	if diff := cmp.Diff(k, again); diff != "" {
		t.Errorf("Fetch() with warm cache mismatch (-first +second):\n%s", diff)
	}
}
