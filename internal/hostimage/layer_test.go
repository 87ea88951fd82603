package hostimage

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"golang.org/x/sys/unix"

	"space/internal/testenv"
)

// layerEntries lists the entries of l as "<type> <name> <mode> <uid>:<gid>
// <mtime> <link or content>", failing t when a header carries a user name,
// access or change time.
func layerEntries(t *testing.T, l v1.Layer) []string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatalf("Uncompressed() error = %v", err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var got []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		if hdr.Uname != "" || hdr.Gname != "" || !hdr.AccessTime.IsZero() || !hdr.ChangeTime.IsZero() {
			t.Errorf("entry %s: uname %q gname %q atime %v ctime %v, want none", hdr.Name, hdr.Uname, hdr.Gname, hdr.AccessTime, hdr.ChangeTime)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		extra := hdr.Linkname + string(body)
		if c, ok := hdr.PAXRecords["SCHILY.xattr.security.capability"]; ok {
			extra += fmt.Sprintf(" cap=%x", c)
		}
		got = append(got, fmt.Sprintf("%c %s %04o %d:%d %d %s", hdr.Typeflag, hdr.Name, hdr.Mode, hdr.Uid, hdr.Gid, hdr.ModTime.Unix(), extra))
	}
}

// makeTree writes a small tree with every kind of entry addTree handles.
func makeTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	for _, d := range []string{"etc", "usr", "usr/bin", "usr/share", "usr/share/doc", "usr/share/doc/pkg", "dev", "tmp"} {
		must(os.MkdirAll(filepath.Join(root, d), 0o755))
		must(os.Chmod(filepath.Join(root, d), 0o755)) // past the umask
	}
	write := func(rel, data string, mode fs.FileMode) {
		t.Helper()
		p := filepath.Join(root, rel)
		must(os.WriteFile(p, []byte(data), 0o600))
		must(os.Chmod(p, mode))
	}
	write("etc/hostname", "buildhost\n", 0o644)
	write("usr/bin/tool", "#!/bin/sh\n", 0o755)
	write("usr/bin/su", "setuid\n", 0o755|fs.ModeSetuid)
	write("usr/share/doc/pkg/copyright", "license\n", 0o644)
	write("usr/share/doc/pkg/changelog.gz", "news\n", 0o644)
	write("tmp/scratch", "x", 0o644)
	must(os.Chmod(filepath.Join(root, "tmp"), 0o777|fs.ModeSticky))
	must(os.Link(filepath.Join(root, "usr/bin/tool"), filepath.Join(root, "usr/bin/tool2")))
	must(os.Symlink("tool", filepath.Join(root, "usr/bin/alias")))
	must(unix.Mkfifo(filepath.Join(root, "etc/fifo"), 0o644))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return unix.Lutimes(p, []unix.Timeval{unix.NsecToTimeval(old.UnixNano()), unix.NsecToTimeval(old.UnixNano())})
	}))
	return root
}

func TestAddTree(t *testing.T) {
	root := makeTree(t)
	mtime := time.Unix(1700000000, 0)
	l := treeLayer(t, root, treeRules{skip: workerSkip, mtime: mtime})
	uid, gid := os.Getuid(), os.Getgid()
	owner := fmt.Sprintf("%d:%d", uid, gid)
	want := []string{
		"5 dev/ 0755 " + owner + " 1700000000 ",
		"5 etc/ 0755 " + owner + " 1700000000 ",
		"5 tmp/ 1777 " + owner + " 1700000000 ",
		"5 usr/ 0755 " + owner + " 1700000000 ",
		"5 usr/bin/ 0755 " + owner + " 1700000000 ",
		"2 usr/bin/alias 0777 " + owner + " 1700000000 tool",
		"0 usr/bin/su 4755 " + owner + " 1700000000 setuid\n",
		"0 usr/bin/tool 0755 " + owner + " 1700000000 #!/bin/sh\n",
		"1 usr/bin/tool2 0755 " + owner + " 1700000000 usr/bin/tool",
		"5 usr/share/ 0755 " + owner + " 1700000000 ",
		"5 usr/share/doc/ 0755 " + owner + " 1700000000 ",
		"5 usr/share/doc/pkg/ 0755 " + owner + " 1700000000 ",
		"0 usr/share/doc/pkg/copyright 0644 " + owner + " 1700000000 license\n",
	}
	if diff := cmp.Diff(want, layerEntries(t, l)); diff != "" {
		t.Errorf("addTree(workerSkip) entries mismatch (-want +got):\n%s", diff)
	}
	if err := validate.Layer(l); err != nil {
		t.Errorf("validate.Layer() = %v", err)
	}
}

// TestAddTreeReproducible: the layer depends on the tree's content only,
// not on its time stamps or where it is.
func TestAddTreeReproducible(t *testing.T) {
	rules := treeRules{mtime: baseTime}
	a := treeLayer(t, makeTree(t), rules)
	other := makeTree(t)
	now := time.Now()
	if err := os.Chtimes(filepath.Join(other, "usr/bin/tool"), now, now); err != nil {
		t.Fatalf("setup: %v", err)
	}
	b := treeLayer(t, other, rules)
	if a.digest != b.digest || a.diffID != b.diffID {
		t.Errorf("layers of equal trees: digests %v and %v, diff IDs %v and %v, want equal", a.digest, b.digest, a.diffID, b.diffID)
	}
	if err := os.WriteFile(filepath.Join(other, "etc/hostname"), []byte("changed\n"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if c := treeLayer(t, other, rules); c.diffID == a.diffID {
		t.Errorf("layer of a changed tree has the old diff ID %v", a.diffID)
	}
}

func TestAddTreeCapability(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // setting file capabilities needs CAP_SETFCAP
	root := t.TempDir()
	p := filepath.Join(root, "ping")
	if err := os.WriteFile(p, []byte("x"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	// A version 2 capability set with cap_net_raw (bit 13) permitted and
	// effective.
	capability := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := unix.Setxattr(p, "security.capability", capability, 0); err != nil {
		t.Fatalf("setup: set file capabilities: %v", err)
	}
	got := layerEntries(t, treeLayer(t, root, treeRules{mtime: baseTime}))
	want := []string{fmt.Sprintf("0 ping 0755 0:0 0 x cap=%x", capability)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("addTree() entries mismatch (-want +got):\n%s", diff)
	}
}

func treeLayer(t *testing.T, root string, r treeRules) *fileLayer {
	t.Helper()
	l, err := writeLayer(filepath.Join(t.TempDir(), "layer.tar.gz"), func(tw *tar.Writer) error {
		return addTree(t.Context(), tw, root, r)
	})
	if err != nil {
		t.Fatalf("writeLayer(addTree(%s)) error = %v", root, err)
	}
	return l
}

func TestWorkerSkip(t *testing.T) {
	tests := []struct {
		rel  string
		mode fs.FileMode
		want bool
	}{
		{"dev", fs.ModeDir, false},
		{"dev/null", fs.ModeDevice | fs.ModeCharDevice, true},
		{"proc/1", fs.ModeDir, true},
		{"var/log", fs.ModeDir, false},
		{"var/log/apt", fs.ModeDir, true},
		{"var/log/dpkg.log", 0, true},
		{"etc/hostname", 0, true},
		{"etc/resolv.conf", 0, true},
		{"etc/hosts.allow", 0, false},
		{"var/lib/dpkg/status", 0, false},
		{"var/lib/dpkg/status-old", 0, true},
		{"var/cache/debconf/config.dat-old", 0, true},
		{"var/lib/apt/lists/deb_dists_bookworm_main_binary-amd64_Packages", 0, false},
		{"usr/share/doc/qemu-system-x86", fs.ModeDir, false},
		{"usr/share/doc/qemu-system-x86/copyright", 0, false},
		{"usr/share/doc/qemu-system-x86/changelog.Debian.gz", 0, true},
		{"usr/share/doc/libfoo1", fs.ModeSymlink, false},
		{"usr/share/man/man1/ls.1.gz", 0, true},
		{"usr/share/locale/de/LC_MESSAGES/apt.mo", 0, true},
		{"usr/share/seabios/bios-256k.bin", 0, false},
		{"usr/bin/qemu-system-x86_64", 0, false},
	}
	for _, tt := range tests {
		if got := workerSkip(tt.rel, tt.mode); got != tt.want {
			t.Errorf("workerSkip(%q, %v) = %v, want %v", tt.rel, tt.mode, got, tt.want)
		}
	}
}

func TestAddFiles(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"space": "server", "agent": "guest"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	mtime := time.Unix(1800000000, 0)
	l, err := writeLayer(filepath.Join(dir, "layer.tar.gz"), func(tw *tar.Writer) error {
		return addFiles(tw, []file{
			{src: filepath.Join(dir, "space"), dst: "usr/local/bin/space", mode: 0o755},
			{src: filepath.Join(dir, "agent"), dst: "usr/local/bin/space-agent", mode: 0o755},
		}, mtime)
	})
	if err != nil {
		t.Fatalf("writeLayer(addFiles) error = %v", err)
	}
	want := []string{
		"5 usr/ 0755 0:0 1800000000 ",
		"5 usr/local/ 0755 0:0 1800000000 ",
		"5 usr/local/bin/ 0755 0:0 1800000000 ",
		"0 usr/local/bin/space 0755 0:0 1800000000 server",
		"0 usr/local/bin/space-agent 0755 0:0 1800000000 guest",
	}
	if diff := cmp.Diff(want, layerEntries(t, l)); diff != "" {
		t.Errorf("addFiles() entries mismatch (-want +got):\n%s", diff)
	}
}

func TestAddDebEntry(t *testing.T) {
	tree, certs := memTree{}, map[string][]byte{}
	prefixes := []string{"usr/share/zoneinfo/", "usr/share/ca-certificates/mozilla/", "usr/share/doc/tzdata/copyright"}
	entries := []struct {
		hdr  tar.Header
		data string
	}{
		{tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, ""},
		{tar.Header{Name: "./usr/share/zoneinfo/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 7}, ""},
		{tar.Header{Name: "./usr/share/zoneinfo/UTC", Typeflag: tar.TypeReg, Mode: 0o644}, "TZif"},
		{tar.Header{Name: "./usr/share/zoneinfo/Zulu", Typeflag: tar.TypeLink, Linkname: "./usr/share/zoneinfo/UTC"}, ""},
		{tar.Header{Name: "./usr/share/zoneinfo/localtime", Typeflag: tar.TypeSymlink, Linkname: "/etc/localtime"}, ""},
		{tar.Header{Name: "./usr/share/ca-certificates/mozilla/B.crt", Typeflag: tar.TypeReg, Mode: 0o644}, "B"},
		{tar.Header{Name: "./usr/share/ca-certificates/mozilla/A.crt", Typeflag: tar.TypeReg, Mode: 0o644}, "A\n"},
		{tar.Header{Name: "./usr/share/doc/tzdata/copyright", Typeflag: tar.TypeReg, Mode: 0o644}, "license"},
		{tar.Header{Name: "./usr/share/doc/tzdata/changelog.gz", Typeflag: tar.TypeReg, Mode: 0o644}, "news"},
		{tar.Header{Name: "./usr/sbin/tzconfig", Typeflag: tar.TypeReg, Mode: 0o755}, "#!/bin/sh"},
	}
	for _, e := range entries {
		if err := addDebEntry(tree, certs, prefixes, &e.hdr, strings.NewReader(e.data)); err != nil {
			t.Fatalf("addDebEntry(%s) error = %v", e.hdr.Name, err)
		}
	}
	l, err := writeLayer(filepath.Join(t.TempDir(), "layer.tar.gz"), func(tw *tar.Writer) error { return tree.write(tw, baseTime) })
	if err != nil {
		t.Fatalf("writeLayer(memTree) error = %v", err)
	}
	want := []string{
		"5 usr/ 0755 0:0 0 ",
		"5 usr/share/ 0755 0:0 0 ",
		"5 usr/share/doc/ 0755 0:0 0 ",
		"5 usr/share/doc/tzdata/ 0755 0:0 0 ",
		"0 usr/share/doc/tzdata/copyright 0644 0:0 0 license",
		"5 usr/share/zoneinfo/ 0755 0:0 0 ",
		"0 usr/share/zoneinfo/UTC 0644 0:0 0 TZif",
		"0 usr/share/zoneinfo/Zulu 0644 0:0 0 TZif",
		"2 usr/share/zoneinfo/localtime 0777 0:0 0 /etc/localtime",
	}
	if diff := cmp.Diff(want, layerEntries(t, l)); diff != "" {
		t.Errorf("memTree from package entries mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][]byte{"A.crt": []byte("A\n"), "B.crt": []byte("B")}, certs); diff != "" {
		t.Errorf("certificates mismatch (-want +got):\n%s", diff)
	}
}
