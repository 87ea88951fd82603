package rootfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/testenv"
)

// testImage returns a three-layer image that exercises replacement,
// whiteouts, opaque directories, links and modes, and what unpacking it
// must produce.
func testImage(t *testing.T) (v1.Image, map[string]string) {
	t2, t3 := layerTime.Add(time.Hour), layerTime.Add(2*time.Hour)
	l1 := newLayer(t,
		ent{name: "etc/", typ: tar.TypeDir},
		ent{name: "etc/hostname", body: "base"},
		ent{name: "opq/", typ: tar.TypeDir},
		ent{name: "opq/old", body: "old"},
		ent{name: "opq/sub/", typ: tar.TypeDir},
		ent{name: "opq/sub/old2", body: "old2"},
		ent{name: "gone/", typ: tar.TypeDir},
		ent{name: "gone/x", body: "x"},
		ent{name: "bin/", typ: tar.TypeDir},
		ent{name: "bin/su", body: "su", mode: 0o4755},
		ent{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		ent{name: "usr/", typ: tar.TypeDir},
		ent{name: "usr/lib/", typ: tar.TypeDir},
		ent{name: "usr/lib/libc.so", body: "libc", mode: 0o755},
		ent{name: "usr/lib/libc.so.6", typ: tar.TypeLink, link: "usr/lib/libc.so"},
		ent{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
		ent{name: "replaced", body: "file"},
		ent{name: "keep", body: "keep", mode: 0o600},
		ent{name: "./dot", body: "dot"},
	)
	l2 := newLayer(t,
		ent{name: "opq/before", body: "before", mtime: t2}, // same layer, before the marker: stays
		ent{name: "opq/.wh..wh..opq", mtime: t2},
		ent{name: "opq/after", body: "after", mtime: t2},
		ent{name: ".wh.gone", mtime: t2},
		ent{name: "etc/hostname", body: "layer2", mtime: t2},
		ent{name: "lib/added", body: "added", mtime: t2}, // through the symlink
		ent{name: "replaced/", typ: tar.TypeDir, mode: 0o700, mtime: t2},
		ent{name: "replaced/inner", body: "inner", mtime: t2},
		ent{name: "abs", typ: tar.TypeSymlink, link: "/etc/hostname", mtime: t2},
	)
	l3 := newLayer(t, ent{name: ".wh.keep", mtime: t3})
	cfg := v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo hi"},
		WorkingDir: "/work",
		User:       "1000:1000",
	}
	me := fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
	at := func(mode string, tm time.Time) string {
		return mode + " " + me + " " + tm.Format(time.RFC3339)
	}
	want := map[string]string{
		"abs":               "symlink " + me + " -> /etc/hostname",
		"bin":               "dir " + at("0755", layerTime),
		"bin/su":            "file " + at("4755", layerTime) + ` "su"`,
		"dot":               "file " + at("0644", layerTime) + ` "dot"`,
		"etc":               "dir " + at("0755", layerTime),
		"etc/hostname":      "file " + at("0644", t2) + ` "layer2"`,
		"lib":               "symlink " + me + " -> usr/lib",
		"opq":               "dir " + at("0755", layerTime),
		"opq/after":         "file " + at("0644", t2) + ` "after"`,
		"opq/before":        "file " + at("0644", t2) + ` "before"`,
		"replaced":          "dir " + at("0700", t2),
		"replaced/inner":    "file " + at("0644", t2) + ` "inner"`,
		"tmp":               "dir " + at("1777", layerTime),
		"usr":               "dir " + at("0755", layerTime),
		"usr/lib":           "dir " + at("0755", layerTime),
		"usr/lib/added":     "file " + at("0644", t2) + ` "added"`,
		"usr/lib/libc.so":   "file " + at("0755", layerTime) + ` "libc"`,
		"usr/lib/libc.so.6": "file " + at("0755", layerTime) + ` "libc"`,
	}
	return newImage(t, cfg, "", l1, l2, l3), want
}

func TestUnpackOCI(t *testing.T) {
	img, want := testImage(t)
	wantCfg := &ImageConfig{
		Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo hi"},
		WorkingDir: "/work",
		User:       "1000:1000",
	}
	tests := []struct {
		name string
		src  func(t *testing.T) string
	}{
		{"oci layout", func(t *testing.T) string { return writeLayout(t, img) }},
		{"oci layout tarball", func(t *testing.T) string { return tarDir(t, writeLayout(t, img), false) }},
		{"oci layout tarball gzip", func(t *testing.T) string { return tarDir(t, writeLayout(t, img), true) }},
		{"docker archive", func(t *testing.T) string { return writeDockerArchive(t, img) }},
		{"docker archive gzip", func(t *testing.T) string { return gzipFile(t, writeDockerArchive(t, img)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.src(t)
			parent := t.TempDir()
			dst := filepath.Join(parent, "root")
			cfg, err := UnpackOCI(t.Context(), src, dst)
			if err != nil {
				t.Fatalf("UnpackOCI(%s) error = %v", tt.name, err)
			}
			if diff := cmp.Diff(wantCfg, cfg); diff != "" {
				t.Errorf("UnpackOCI(%s) config mismatch (-want +got):\n%s", tt.name, diff)
			}
			if diff := cmp.Diff(want, snapshot(t, dst)); diff != "" {
				t.Errorf("UnpackOCI(%s) tree mismatch (-want +got):\n%s", tt.name, diff)
			}
			a, errA := os.Stat(filepath.Join(dst, "usr/lib/libc.so"))
			b, errB := os.Stat(filepath.Join(dst, "usr/lib/libc.so.6"))
			if errA != nil || errB != nil || !os.SameFile(a, b) {
				t.Errorf("usr/lib/libc.so.6 is not a hard link of usr/lib/libc.so (%v, %v)", errA, errB)
			}
			if names := dirNames(t, parent); !slices.Equal(names, []string{"root"}) {
				t.Errorf("UnpackOCI left %v next to dst, want only root", names)
			}
		})
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestUnpackOCIOwnersDevicesXattrs(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierUnit)
	l := newLayer(t,
		ent{name: "dev/", typ: tar.TypeDir},
		ent{name: "dev/null", typ: tar.TypeChar, major: 1, minor: 3, mode: 0o666},
		ent{name: "dev/sda", typ: tar.TypeBlock, major: 8, minor: 0, mode: 0o660, gid: 6},
		ent{name: "run/", typ: tar.TypeDir},
		ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		ent{name: "home/", typ: tar.TypeDir},
		ent{name: "home/u/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		ent{name: "home/u/tool", body: "t", mode: 0o6755, uid: 1000, gid: 100},
		ent{name: "home/u/link", typ: tar.TypeSymlink, link: "tool", uid: 1000, gid: 1000},
		ent{name: "attr", body: "a", xattrs: map[string]string{"user.space": "yes"}},
	)
	dst := t.TempDir()
	if _, err := UnpackOCI(t.Context(), writeLayout(t, newImage(t, v1.Config{}, "", l)), dst); err != nil {
		t.Fatalf("UnpackOCI() error = %v", err)
	}
	at := func(mode, owner string) string { return mode + " " + owner + " " + layerTime.Format(time.RFC3339) }
	want := map[string]string{
		"attr":        "file " + at("0644", "0:0") + ` "a"`,
		"dev":         "dir " + at("0755", "0:0"),
		"dev/null":    "char 1,3 " + at("0666", "0:0"),
		"dev/sda":     "block 8,0 " + at("0660", "0:6"),
		"home":        "dir " + at("0755", "0:0"),
		"home/u":      "dir " + at("0700", "1000:1000"),
		"home/u/link": "symlink 1000:1000 -> tool",
		"home/u/tool": "file " + at("6755", "1000:100") + ` "t"`,
		"run":         "dir " + at("0755", "0:0"),
		"run/fifo":    "fifo " + at("0600", "0:0"),
	}
	if diff := cmp.Diff(want, snapshot(t, dst)); diff != "" {
		t.Errorf("UnpackOCI() tree mismatch (-want +got):\n%s", diff)
	}
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(filepath.Join(dst, "attr"), "user.space", buf)
	if err != nil || string(buf[:n]) != "yes" {
		t.Errorf("xattr user.space of attr = %q, %v, want %q", buf[:n], err, "yes")
	}
}

func TestUnpackOCIStaysInside(t *testing.T) {
	tests := []struct {
		name    string
		layers  func(outside string) [][]ent
		wantErr error  // or nil
		inside  string // a file that must exist in dst afterwards, or ""
		content string // its content
	}{
		{
			name:    "dotdot entry",
			layers:  func(string) [][]ent { return [][]ent{{{name: "../evil", body: "x"}}} },
			wantErr: errkind.InvalidArgument,
		},
		{
			name:    "dotdot inside the name",
			layers:  func(string) [][]ent { return [][]ent{{{name: "a/../../evil", body: "x"}}} },
			wantErr: errkind.InvalidArgument,
		},
		{
			name:   "absolute name",
			layers: func(string) [][]ent { return [][]ent{{{name: "/evil", body: "x"}}} },
			inside: "evil", content: "x",
		},
		{
			name: "relative symlink climbing out",
			layers: func(string) [][]ent {
				return [][]ent{{{name: "up", typ: tar.TypeSymlink, link: "../../../.."}, {name: "up/evil", body: "x"}}}
			},
			inside: "evil", content: "x",
		},
		{
			name: "absolute symlink to a host directory",
			layers: func(outside string) [][]ent {
				return [][]ent{
					{{name: "host", typ: tar.TypeSymlink, link: outside}},
					{{name: "host/evil", body: "x"}},
				}
			},
			inside: "OUTSIDE/evil", content: "x",
		},
		{
			name: "symlink chain",
			layers: func(string) [][]ent {
				return [][]ent{{
					{name: "a", typ: tar.TypeSymlink, link: "b"},
					{name: "b", typ: tar.TypeSymlink, link: "/.."},
					{name: "a/evil", body: "x"},
				}}
			},
			inside: "evil", content: "x",
		},
		{
			name: "symlink loop",
			layers: func(string) [][]ent {
				return [][]ent{{
					{name: "a", typ: tar.TypeSymlink, link: "b"},
					{name: "b", typ: tar.TypeSymlink, link: "a"},
					{name: "a/evil", body: "x"},
				}}
			},
			wantErr: unix.ELOOP,
		},
		{
			name: "file replacing a symlink to a host file",
			layers: func(outside string) [][]ent {
				return [][]ent{
					{{name: "f", typ: tar.TypeSymlink, link: filepath.Join(outside, "secret")}},
					{{name: "f", body: "x"}},
				}
			},
			inside: "f", content: "x",
		},
		{
			name: "hard link out of the root",
			layers: func(string) [][]ent {
				return [][]ent{{{name: "hl", typ: tar.TypeLink, link: "../outside/secret"}}}
			},
			wantErr: errkind.InvalidArgument,
		},
		{
			name: "hard link through a symlink to a host directory",
			layers: func(outside string) [][]ent {
				return [][]ent{{
					{name: "host", typ: tar.TypeSymlink, link: outside},
					{name: "hl", typ: tar.TypeLink, link: "host/secret"},
				}}
			},
			wantErr: fs.ErrNotExist,
		},
		{
			name: "whiteout through a symlink to a host directory",
			layers: func(outside string) [][]ent {
				return [][]ent{
					{{name: "host", typ: tar.TypeSymlink, link: outside}},
					{{name: "host/.wh.secret"}},
				}
			},
		},
		{
			name: "opaque marker through a symlink to a host directory",
			layers: func(outside string) [][]ent {
				return [][]ent{
					{{name: "host", typ: tar.TypeSymlink, link: outside}},
					{{name: "host/.wh..wh..opq"}},
				}
			},
		},
		{
			name:    "whiteout of dotdot",
			layers:  func(string) [][]ent { return [][]ent{{{name: "d/", typ: tar.TypeDir}, {name: "d/.wh..."}}} },
			wantErr: errkind.InvalidArgument,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dst, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
			if err := os.Mkdir(outside, 0o755); err != nil {
				t.Fatalf("setup: %v", err)
			}
			if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
				t.Fatalf("setup: %v", err)
			}
			var layers []v1.Layer
			for _, entries := range tt.layers(outside) {
				layers = append(layers, newLayer(t, entries...))
			}
			src := writeLayout(t, newImage(t, v1.Config{}, "", layers...))
			_, err := UnpackOCI(t.Context(), src, dst)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("UnpackOCI() error = %v, want one wrapping %v", err, tt.wantErr)
				}
			} else if err != nil {
				t.Errorf("UnpackOCI() error = %v", err)
			}
			if names := dirNames(t, base); !slices.Equal(names, []string{"outside", "root"}) {
				t.Errorf("after UnpackOCI, %s holds %v, want [outside root]", base, names)
			}
			if names := dirNames(t, outside); !slices.Equal(names, []string{"secret"}) {
				t.Errorf("after UnpackOCI, %s holds %v, want [secret]", outside, names)
			}
			if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "secret" {
				t.Errorf("after UnpackOCI, outside/secret = %q, %v, want %q", b, err, "secret")
			}
			if tt.inside != "" {
				p := filepath.Join(dst, strings.ReplaceAll(tt.inside, "OUTSIDE", outside))
				fi, err := os.Lstat(p)
				if err != nil || !fi.Mode().IsRegular() {
					t.Fatalf("after UnpackOCI, %s: %v, want a regular file", p, err)
				}
				if b, _ := os.ReadFile(p); string(b) != tt.content {
					t.Errorf("after UnpackOCI, %s = %q, want %q", p, b, tt.content)
				}
			}
		})
	}
}

func TestUnpackOCINotAnImage(t *testing.T) {
	tests := []struct {
		name string
		src  func(t *testing.T) string
	}{
		{"random bytes", func(t *testing.T) string {
			return writeTestFile(t, "image.tar", []byte("this is not a tarball, just some text"))
		}},
		{"empty file", func(t *testing.T) string { return writeTestFile(t, "image.tar", nil) }},
		{"tarball of something else", func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hi"), 0o644); err != nil {
				t.Fatalf("setup: %v", err)
			}
			return tarDir(t, dir, false)
		}},
		{"gzip of text", func(t *testing.T) string {
			return gzipFile(t, writeTestFile(t, "notes.txt", []byte("hello")))
		}},
		{"directory without index.json", func(t *testing.T) string { return t.TempDir() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.src(t)
			dst := filepath.Join(t.TempDir(), "root")
			_, err := UnpackOCI(t.Context(), src, dst)
			if !errors.Is(err, errkind.InvalidArgument) {
				t.Fatalf("UnpackOCI(%s) error = %v, want one wrapping %v", tt.name, err, errkind.InvalidArgument)
			}
			want := src + ": not an OCI image layout or docker-archive tarball"
			if !strings.Contains(err.Error(), want) {
				t.Errorf("UnpackOCI(%s) error = %q, want it to say %q", tt.name, err, want)
			}
			if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("UnpackOCI(%s) created dst (%v), want nothing", tt.name, err)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		_, err := UnpackOCI(t.Context(), filepath.Join(t.TempDir(), "nope"), t.TempDir())
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("UnpackOCI(missing) error = %v, want one wrapping %v", err, fs.ErrNotExist)
		}
	})
}

func writeTestFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return p
}

func TestUnpackOCIPicksPlatform(t *testing.T) {
	other := "s390x"
	if runtime.GOARCH == other {
		other = "arm64"
	}
	mk := func(t *testing.T, arch string) v1.Image {
		return newImage(t, v1.Config{Cmd: []string{arch}}, arch, newLayer(t, ent{name: "arch", body: arch}))
	}
	tests := []struct {
		name    string
		src     func(t *testing.T) string
		want    string // content of /arch, or "" for an error
		wantErr error
	}{
		{"layout with two", func(t *testing.T) string { return writeLayout(t, mk(t, other), mk(t, runtime.GOARCH)) }, runtime.GOARCH, nil},
		{"layout with only another", func(t *testing.T) string { return writeLayout(t, mk(t, other)) }, other, nil},
		{"layout with none fitting", func(t *testing.T) string { return writeLayout(t, mk(t, other), mk(t, "riscv64")) }, "", errkind.NotFound},
		{"docker archive with two", func(t *testing.T) string { return writeDockerArchive(t, mk(t, other), mk(t, runtime.GOARCH)) }, runtime.GOARCH, nil},
		{"docker archive with none fitting", func(t *testing.T) string { return writeDockerArchive(t, mk(t, other), mk(t, "riscv64")) }, "", errkind.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := t.TempDir()
			cfg, err := UnpackOCI(t.Context(), tt.src(t), dst)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("UnpackOCI() error = %v, want one wrapping %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("UnpackOCI() error = %v", err)
			}
			b, err := os.ReadFile(filepath.Join(dst, "arch"))
			if err != nil || string(b) != tt.want {
				t.Errorf("UnpackOCI() unpacked arch %q (%v), want %q", b, err, tt.want)
			}
			if diff := cmp.Diff([]string{tt.want}, cfg.Cmd); diff != "" {
				t.Errorf("UnpackOCI() config Cmd mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
