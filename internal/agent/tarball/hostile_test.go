package tarball

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/testenv"
)

// got is what TestUnpackHostile checks of one unpacked path.
type got struct {
	Type     fs.FileMode
	Mode     fs.FileMode // permission, setuid, setgid and sticky bits
	UID, GID uint32
}

// TestUnpackHostile: an archive out of a sandbox, unpacked without
// privileges, cannot set an owner, a setuid, setgid or sticky bit or
// group/other write, and makes no fifo or device node.
func TestUnpackHostile(t *testing.T) {
	dst := t.TempDir()
	a := archive(t,
		entry{name: "suid-sh", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o4755},
		entry{name: "sgid-file", typ: tar.TypeReg, body: "x", mode: 0o2755, uid: 1234, gid: 5678},
		entry{name: "both", typ: tar.TypeReg, body: "x", mode: 0o6777},
		entry{name: "writable", typ: tar.TypeReg, body: "x", mode: 0o666},
		entry{name: "sgid-dir/", typ: tar.TypeDir, mode: 0o2775, uid: 1234, gid: 5678},
		entry{name: "sgid-dir/inside", typ: tar.TypeReg, body: "x", mode: 0o644},
		entry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		entry{name: "rootfile", typ: tar.TypeReg, body: "x", mode: 0o755, uid: 0, gid: 0},
		entry{name: "null", typ: tar.TypeChar, mode: 0o666},
		entry{name: "disk", typ: tar.TypeBlock, mode: 0o660},
		entry{name: "tmp/fifo", typ: tar.TypeFifo, mode: 0o666},
		entry{name: "fifo-link", typ: tar.TypeLink, linkname: "tmp/fifo"},
		entry{name: "suid-link", typ: tar.TypeLink, linkname: "suid-sh"},
		entry{name: "was-fifo", typ: tar.TypeFifo},
		entry{name: "was-fifo", typ: tar.TypeReg, body: "now a file"},
		entry{name: "was-fifo-link", typ: tar.TypeLink, linkname: "was-fifo"},
	)
	st, err := Unpack(t.Context(), bytes.NewReader(a), dst, Options{})
	if err != nil {
		t.Fatalf("Unpack = %v", err)
	}
	if want := (Stats{Entries: 11, Bytes: int64(len("#!/bin/sh\n") + 5 + len("now a file")), Skipped: 5}); st != want {
		t.Errorf("Unpack stats = %+v, want %+v", st, want)
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	want := map[string]got{
		"suid-sh":         {Mode: 0o755, UID: uid, GID: gid},
		"suid-link":       {Mode: 0o755, UID: uid, GID: gid},
		"sgid-file":       {Mode: 0o755, UID: uid, GID: gid},
		"both":            {Mode: 0o755, UID: uid, GID: gid},
		"writable":        {Mode: 0o644, UID: uid, GID: gid},
		"sgid-dir":        {Type: fs.ModeDir, Mode: 0o755, UID: uid, GID: gid},
		"sgid-dir/inside": {Mode: 0o644, UID: uid, GID: gid},
		"tmp":             {Type: fs.ModeDir, Mode: 0o755, UID: uid, GID: gid},
		"rootfile":        {Mode: 0o755, UID: uid, GID: gid},
		"was-fifo":        {Mode: 0o644, UID: uid, GID: gid},
		"was-fifo-link":   {Mode: 0o644, UID: uid, GID: gid},
	}
	if diff := cmp.Diff(want, modes(t, dst)); diff != "" {
		t.Errorf("unpacked hostile archive (-want +got):\n%s", diff)
	}
}

// TestUnpackHostileOwner: running as root, an unprivileged Unpack still
// gives nothing away, and Place leaves the owner of a directory it merges
// into alone.
func TestUnpackHostileOwner(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // files owned by another user
	base := t.TempDir()
	staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
	mustMkdir(t, staging)
	mustMkdir(t, filepath.Join(target, "d"))
	if err := os.Lchown(filepath.Join(target, "d"), 1234, 5678); err != nil {
		t.Fatalf("setup: %v", err)
	}
	a := archive(t,
		entry{name: "d/", typ: tar.TypeDir, mode: 0o755, uid: 0, gid: 0},
		entry{name: "d/f", typ: tar.TypeReg, body: "x", mode: 0o4755, uid: 0, gid: 0},
		entry{name: "given", typ: tar.TypeReg, body: "x", mode: 0o644, uid: 1234, gid: 5678},
		entry{name: "ln", typ: tar.TypeSymlink, linkname: "given", uid: 1234, gid: 5678},
	)
	if _, err := Unpack(t.Context(), bytes.NewReader(a), staging, Options{}); err != nil {
		t.Fatalf("Unpack = %v", err)
	}
	if err := Place(staging, target, Options{}); err != nil {
		t.Fatalf("Place = %v", err)
	}
	want := map[string]got{
		"d":     {Type: fs.ModeDir, Mode: 0o755, UID: 1234, GID: 5678}, // the host's, kept
		"d/f":   {Mode: 0o755},
		"given": {Mode: 0o644},
		"ln":    {Type: fs.ModeSymlink},
	}
	if diff := cmp.Diff(want, modes(t, target)); diff != "" {
		t.Errorf("placed hostile archive as root (-want +got):\n%s", diff)
	}
}

// TestUnpackPrivilegedRefusesDevices: even the sandbox owner's archive
// makes no device node.
func TestUnpackPrivilegedRefusesDevices(t *testing.T) {
	dst := t.TempDir()
	_, err := Unpack(t.Context(), bytes.NewReader(archive(t, entry{name: "null", typ: tar.TypeChar})), dst, Options{Privileged: true})
	if !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("Unpack(char device, privileged) = %v, want %v", err, errkind.InvalidArgument)
	}
	assertMissing(t, filepath.Join(dst, "null"))
}

// TestUnpackHostileLinks: no entry writes through a link, whether the
// archive made it or dst held it.
func TestUnpackHostileLinks(t *testing.T) {
	t.Run("existing symlink in dst", func(t *testing.T) {
		base := t.TempDir()
		outside, dst := filepath.Join(base, "outside"), filepath.Join(base, "dst")
		mustMkdir(t, outside)
		mustMkdir(t, dst)
		if err := os.Symlink(outside, filepath.Join(dst, "s")); err != nil {
			t.Fatalf("setup: %v", err)
		}
		a := archive(t, entry{name: "s/f", typ: tar.TypeReg, body: "x"})
		if _, err := Unpack(t.Context(), bytes.NewReader(a), dst, Options{}); err == nil {
			t.Errorf("Unpack(s/f through an existing symlink out) = nil, want an error")
		}
		assertMissing(t, filepath.Join(outside, "f"))
	})
	t.Run("existing symlink as a file", func(t *testing.T) {
		base := t.TempDir()
		victim, dst := filepath.Join(base, "victim"), filepath.Join(base, "dst")
		mustWrite(t, victim, "host")
		mustMkdir(t, dst)
		if err := os.Symlink(victim, filepath.Join(dst, "f")); err != nil {
			t.Fatalf("setup: %v", err)
		}
		a := archive(t, entry{name: "f", typ: tar.TypeReg, body: "guest", mode: 0o4777})
		if _, err := Unpack(t.Context(), bytes.NewReader(a), dst, Options{}); err != nil {
			t.Fatalf("Unpack = %v", err)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "host" {
			t.Errorf("read the symlink's target = %q, %v, want %q", b, err, "host")
		}
		if fi, err := os.Lstat(filepath.Join(dst, "f")); err != nil || fi.Mode() != 0o755 {
			t.Errorf("Lstat(f) = %v, %v, want a regular file of mode 0755", fi.Mode(), err)
		}
	})
	t.Run("hard link then rewrite", func(t *testing.T) {
		dst := t.TempDir()
		a := archive(t,
			entry{name: "a", typ: tar.TypeReg, body: "first"},
			entry{name: "b", typ: tar.TypeLink, linkname: "a"},
			entry{name: "a", typ: tar.TypeReg, body: "second"},
			entry{name: "c", typ: tar.TypeLink, linkname: "b"},
			entry{name: "c", typ: tar.TypeReg, body: "third"},
		)
		if _, err := Unpack(t.Context(), bytes.NewReader(a), dst, Options{}); err != nil {
			t.Fatalf("Unpack = %v", err)
		}
		for name, want := range map[string]string{"a": "second", "b": "first", "c": "third"} {
			if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != want {
				t.Errorf("read %s = %q, %v, want %q", name, b, err, want)
			}
		}
	})
}

// TestUnpackUserTree: a user's ordinary tree comes out of an unprivileged
// Unpack as it went in: contents, modes up to 0755, mtimes, symlinks as
// links (relative, absolute, dangling), hard links, nested and empty
// directories.
func TestUnpackUserTree(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	steps := []func() error{
		func() error { return os.MkdirAll(filepath.Join(src, "a/b/c"), 0o755) },
		func() error { return os.Mkdir(filepath.Join(src, "private"), 0o700) },
		func() error { return os.Mkdir(filepath.Join(src, "empty"), 0o750) },
		func() error {
			return os.WriteFile(filepath.Join(src, "a/run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
		},
		func() error { return os.WriteFile(filepath.Join(src, "a/b/c/data"), []byte("data"), 0o644) },
		func() error { return os.WriteFile(filepath.Join(src, "private/key"), []byte("k"), 0o600) },
		func() error { return os.WriteFile(filepath.Join(src, "ro"), []byte("r"), 0o444) },
		func() error { return os.Symlink("a/run.sh", filepath.Join(src, "run")) },
		func() error { return os.Symlink("/etc/hostname", filepath.Join(src, "abs")) },
		func() error { return os.Symlink("missing", filepath.Join(src, "dangling")) },
		func() error { return os.Link(filepath.Join(src, "a/b/c/data"), filepath.Join(src, "hard")) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("setup: step %d: %v", i, err)
		}
	}
	setMTimes(t, src)
	want := snapshot(t, src)

	var buf bytes.Buffer
	if _, err := Pack(t.Context(), src, &buf); err != nil {
		t.Fatalf("Pack(%s) = %v", src, err)
	}
	st, err := Unpack(t.Context(), bytes.NewReader(buf.Bytes()), dst, Options{})
	if err != nil {
		t.Fatalf("Unpack = %v", err)
	}
	if diff := cmp.Diff(want, snapshot(t, dst)); diff != "" {
		t.Errorf("unpacked user tree differs (-packed +unpacked):\n%s", diff)
	}
	if st.Skipped != 0 || st.Entries != len(want) {
		t.Errorf("Unpack stats = %+v, want %d entries and none skipped", st, len(want))
	}
}

// modes describes the type, mode and owner of every path below dir.
func modes(t *testing.T, dir string) map[string]got {
	t.Helper()
	m := make(map[string]got)
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		g := got{Type: fi.Mode().Type(), Mode: fi.Mode() & modeBits, UID: st.Uid, GID: st.Gid}
		if g.Type == fs.ModeSymlink {
			g.Mode = 0
		}
		m[rel] = g
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return m
}
