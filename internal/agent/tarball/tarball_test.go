package tarball

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/testenv"
)

// attrs is what the round trip must preserve about one path.
type attrs struct {
	Type     fs.FileMode
	Mode     fs.FileMode
	UID, GID uint32
	MTime    int64 // ns
	Size     int64
	Digest   string // sha256 of a regular file
	Target   string // of a symlink
	LinkedTo string // first path sharing this inode, for hard links
}

// snapshot describes every path below dir, dir itself excluded.
func snapshot(t *testing.T, dir string) map[string]attrs {
	t.Helper()
	got := make(map[string]attrs)
	inodes := make(map[uint64]string)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		a := attrs{
			Type:  fi.Mode().Type(),
			Mode:  fi.Mode() & modeBits,
			UID:   st.Uid,
			GID:   st.Gid,
			MTime: fi.ModTime().UnixNano(),
		}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			a.Size, a.Digest = fi.Size(), fmt.Sprintf("%x", sha256.Sum256(b))
			if first, ok := inodes[st.Ino]; ok {
				a.LinkedTo = first
			} else if st.Nlink > 1 {
				inodes[st.Ino] = rel
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			a.Mode = 0 // symlink permissions mean nothing on Linux
			if a.Target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		got[rel] = a
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return got
}

// buildTree fills dir with one of everything Pack supports.
func buildTree(t *testing.T, dir string) {
	t.Helper()
	big := make([]byte, 3<<20)
	rand.Read(big)
	steps := []func() error{
		func() error { return os.MkdirAll(filepath.Join(dir, "a/b/c"), 0o755) },
		func() error { return os.Mkdir(filepath.Join(dir, "empty"), 0o700) },
		func() error { return os.Mkdir(filepath.Join(dir, "shared"), 0o755) },
		func() error { return os.Chmod(filepath.Join(dir, "shared"), fs.ModeSticky|0o777) },
		func() error { return os.WriteFile(filepath.Join(dir, "a/big"), big, 0o644) },
		func() error { return os.WriteFile(filepath.Join(dir, "a/b/zero"), nil, 0o600) },
		func() error { return os.WriteFile(filepath.Join(dir, "a/b/c/small"), []byte("hello\n"), 0o640) },
		func() error { return os.Symlink("b/zero", filepath.Join(dir, "a/rel")) },
		func() error { return os.Symlink("/etc/hostname", filepath.Join(dir, "abs")) },
		func() error { return os.WriteFile(filepath.Join(dir, "h1"), []byte("linked"), 0o644) },
		func() error { return os.Link(filepath.Join(dir, "h1"), filepath.Join(dir, "a/h2")) },
		func() error { return os.WriteFile(filepath.Join(dir, "suid"), []byte("#!/bin/sh\n"), 0o755) },
		func() error { return os.Lchown(filepath.Join(dir, "suid"), 1234, 5678) },
		func() error { return os.Chmod(filepath.Join(dir, "suid"), fs.ModeSetuid|fs.ModeSetgid|0o755) },
		func() error { return os.Lchown(filepath.Join(dir, "a/b"), 1234, 5678) },
		func() error { return os.Lchown(filepath.Join(dir, "abs"), 1234, 5678) },
		func() error { return unix.Mkfifo(filepath.Join(dir, "a/fifo"), 0o620) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("setup: step %d: %v", i, err)
		}
	}
	setMTimes(t, dir)
}

// setMTimes gives every path below dir a distinct sub-second mtime, deepest
// paths first so that directories keep theirs.
func setMTimes(t *testing.T, dir string) {
	t.Helper()
	var paths []string
	filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if p != dir {
			paths = append(paths, p)
		}
		return err
	})
	base := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := len(paths) - 1; i >= 0; i-- {
		ts := unix.NsecToTimespec(base.Add(time.Duration(i)*time.Hour + 123456789).UnixNano())
		err := unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			t.Fatalf("setup: utimes %s: %v", paths[i], err)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // chown to other users
	src, dst := t.TempDir(), t.TempDir()
	buildTree(t, src)
	want := snapshot(t, src)

	var buf bytes.Buffer
	packed, err := Pack(t.Context(), src, &buf)
	if err != nil {
		t.Fatalf("Pack(%s) = %v", src, err)
	}
	unpacked, err := Unpack(t.Context(), bytes.NewReader(buf.Bytes()), dst, Options{Privileged: true})
	if err != nil {
		t.Fatalf("Unpack = %v", err)
	}
	if diff := cmp.Diff(want, snapshot(t, dst)); diff != "" {
		t.Errorf("unpacked tree differs (-packed +unpacked):\n%s", diff)
	}
	wantStats := Stats{Entries: len(want), Bytes: 3<<20 + int64(len("hello\n")+len("linked")+len("#!/bin/sh\n"))}
	if packed != wantStats {
		t.Errorf("Pack stats = %+v, want %+v", packed, wantStats)
	}
	if unpacked != wantStats {
		t.Errorf("Unpack stats = %+v, want %+v", unpacked, wantStats)
	}
}

func TestPackNames(t *testing.T) {
	dir := t.TempDir()
	mustMkdir(t, filepath.Join(dir, "d"))
	mustWrite(t, filepath.Join(dir, "d/f"), "x")
	mustWrite(t, filepath.Join(dir, "top"), "y")
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer l.Close()

	var buf bytes.Buffer
	if _, err := Pack(t.Context(), dir, &buf); err != nil {
		t.Fatalf("Pack(%s) = %v", dir, err)
	}
	var got []string
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read packed archive: %v", err)
		}
		got = append(got, hdr.Name)
	}
	want := []string{"d/", "d/f", "top"} // sorted, relative, no socket
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Pack entry names (-want +got):\n%s", diff)
	}
}

func TestPackDevice(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // mknod
	dir := t.TempDir()
	if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o640, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatalf("setup: %v", err)
	}
	var buf bytes.Buffer
	if _, err := Pack(t.Context(), dir, &buf); err != nil {
		t.Fatalf("Pack(%s) = %v", dir, err)
	}
	hdr, err := tar.NewReader(&buf).Next()
	if err != nil {
		t.Fatalf("read packed archive: %v", err)
	}
	got := [4]int64{int64(hdr.Typeflag), hdr.Mode, hdr.Devmajor, hdr.Devminor}
	want := [4]int64{tar.TypeChar, 0o640, 1, 3}
	if got != want {
		t.Errorf("Pack(char device) header {type, mode, major, minor} = %o, want %o", got, want)
	}
}

func TestPackErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	mustWrite(t, file, "x")
	for _, tc := range []struct {
		name string
		dir  string
		want error
	}{
		{name: "file", dir: file, want: errkind.FailedPrecondition},
		{name: "missing", dir: filepath.Join(dir, "nope"), want: errkind.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Pack(t.Context(), tc.dir, io.Discard); !errors.Is(err, tc.want) {
				t.Errorf("Pack(%s) = %v, want %v", tc.dir, err, tc.want)
			}
		})
	}
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := Pack(ctx, dir, io.Discard); !errors.Is(err, context.Canceled) {
			t.Errorf("Pack(canceled) = %v, want %v", err, context.Canceled)
		}
	})
}

// entry is one member of a test archive.
type entry struct {
	name     string
	typ      byte
	linkname string
	body     string
	mode     int64 // or 0 for 0644 (0755 for a directory)
	uid, gid int
}

// archive builds a tar of entries.
func archive(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.linkname, Mode: e.mode, Size: int64(len(e.body)),
			Uid: e.uid, Gid: e.gid}
		switch {
		case e.mode != 0:
		case e.typ == tar.TypeDir:
			hdr.Mode = 0o755
		default:
			hdr.Mode = 0o644
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3 // /dev/null
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("setup: header %s: %v", e.name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("setup: body %s: %v", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return buf.Bytes()
}

// bothModes runs f as a subtest for a privileged and an unprivileged
// Unpack.
func bothModes(t *testing.T, f func(t *testing.T, opts Options)) {
	t.Helper()
	for _, opts := range []Options{{}, {Privileged: true}} {
		t.Run(fmt.Sprintf("privileged=%v", opts.Privileged), func(t *testing.T) { f(t, opts) })
	}
}

func TestUnpackRejects(t *testing.T) {
	bothModes(t, testUnpackRejects)
}

func testUnpackRejects(t *testing.T, opts Options) {
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{name: "parent", entries: []entry{{name: "../x", typ: tar.TypeReg, body: "x"}}},
		{name: "absolute", entries: []entry{{name: "/etc/x", typ: tar.TypeReg, body: "x"}}},
		{name: "climb", entries: []entry{{name: "a/../../x", typ: tar.TypeReg, body: "x"}}},
		{name: "hardlink out", entries: []entry{{name: "l", typ: tar.TypeLink, linkname: "../outside"}}},
		{name: "hardlink absolute", entries: []entry{{name: "l", typ: tar.TypeLink, linkname: "/etc/passwd"}}},
		{name: "root as file", entries: []entry{{name: ".", typ: tar.TypeReg, body: "x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dst := filepath.Join(base, "x", "dst")
			mustMkdir(t, dst)
			_, err := Unpack(t.Context(), bytes.NewReader(archive(t, tc.entries...)), dst, opts)
			if !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Unpack(%+v) = %v, want %v", tc.entries, err, errkind.InvalidArgument)
			}
			assertMissing(t, filepath.Join(base, "x", "x"), filepath.Join(base, "outside"), filepath.Join(dst, "l"))
		})
	}
}

func TestUnpackContainsSymlinks(t *testing.T) {
	bothModes(t, testUnpackContainsSymlinks)
}

func testUnpackContainsSymlinks(t *testing.T, opts Options) {
	base := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{name: "to root", entries: []entry{{name: "s", typ: tar.TypeSymlink, linkname: "/"}, {name: "s/escape", typ: tar.TypeReg, body: "x"}}},
		{name: "to outside", entries: []entry{{name: "s", typ: tar.TypeSymlink, linkname: base}, {name: "s/escape", typ: tar.TypeReg, body: "x"}}},
		{name: "up", entries: []entry{{name: "s", typ: tar.TypeSymlink, linkname: "../.."}, {name: "s/escape", typ: tar.TypeReg, body: "x"}}},
		{name: "dir through", entries: []entry{{name: "s", typ: tar.TypeSymlink, linkname: "../.."}, {name: "s/escape/", typ: tar.TypeDir}}},
		{name: "link through", entries: []entry{{name: "s", typ: tar.TypeSymlink, linkname: "/"}, {name: "l", typ: tar.TypeLink, linkname: "s/etc/hostname"}}},
		{name: "fifo through", entries: []entry{{name: "s", typ: tar.TypeSymlink, linkname: base}, {name: "s/escape", typ: tar.TypeFifo}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(base, tc.name, "dst")
			mustMkdir(t, dst)
			_, err := Unpack(t.Context(), bytes.NewReader(archive(t, tc.entries...)), dst, opts)
			if err == nil && (opts.Privileged || tc.name != "fifo through") { // unprivileged, a fifo is skipped
				t.Errorf("Unpack(%+v) = nil, want an error", tc.entries)
			}
			assertMissing(t, filepath.Join(base, "escape"), "/escape", filepath.Join(dst, "l"))
		})
	}
}

// TestUnpackSymlinksInside: a privileged Unpack follows a symlink that
// stays inside the directory; an unprivileged one refuses to.
func TestUnpackSymlinksInside(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{name: "file", entries: []entry{{name: "s/f", typ: tar.TypeReg, body: "inside"}}},
		{name: "dir", entries: []entry{{name: "s/d/", typ: tar.TypeDir}}},
		{name: "hard link", entries: []entry{{name: "real/f", typ: tar.TypeReg, body: "inside"}, {name: "l", typ: tar.TypeLink, linkname: "s/f"}}},
	} {
		entries := append([]entry{{name: "real/", typ: tar.TypeDir}, {name: "s", typ: tar.TypeSymlink, linkname: "real"}}, tc.entries...)
		t.Run(tc.name, func(t *testing.T) {
			bothModes(t, func(t *testing.T, opts Options) {
				dst := t.TempDir()
				_, err := Unpack(t.Context(), bytes.NewReader(archive(t, entries...)), dst, opts)
				if opts.Privileged {
					if err != nil {
						t.Errorf("Unpack(%+v, privileged) = %v, want nil", entries, err)
					}
					return
				}
				if !errors.Is(err, errkind.InvalidArgument) {
					t.Errorf("Unpack(%+v) = %v, want %v", entries, err, errkind.InvalidArgument)
				}
				assertMissing(t, filepath.Join(dst, "real/d"), filepath.Join(dst, "l"))
				if tc.name != "hard link" {
					assertMissing(t, filepath.Join(dst, "real/f"))
				}
			})
		})
	}
}

func TestUnpackDotNames(t *testing.T) {
	dst := t.TempDir()
	a := archive(t,
		entry{name: "./", typ: tar.TypeDir},
		entry{name: "./a/", typ: tar.TypeDir},
		entry{name: "./a//b", typ: tar.TypeReg, body: "b"},
	)
	if err := os.Chmod(dst, 0o700); err != nil {
		t.Fatalf("setup: %v", err)
	}
	st, err := Unpack(t.Context(), bytes.NewReader(a), dst, Options{})
	if err != nil {
		t.Fatalf("Unpack = %v", err)
	}
	if want := (Stats{Entries: 3, Bytes: 1}); st != want {
		t.Errorf("Unpack stats = %+v, want %+v", st, want)
	}
	if fi, err := os.Lstat(dst); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("Lstat(dst) = %v, %v, want mode 0755 from the \"./\" entry", fi.Mode(), err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a/b")); err != nil || string(b) != "b" {
		t.Errorf("read a/b = %q, %v, want %q", b, err, "b")
	}
}

func TestUnpackReplaces(t *testing.T) {
	dst := t.TempDir()
	mustWrite(t, filepath.Join(dst, "f"), "old")
	mustWrite(t, filepath.Join(dst, "other"), "keep")
	mustMkdir(t, filepath.Join(dst, "d"))
	mustWrite(t, filepath.Join(dst, "d/kept"), "kept")
	if err := os.Symlink("other", filepath.Join(dst, "s")); err != nil {
		t.Fatalf("setup: %v", err)
	}
	a := archive(t,
		entry{name: "f", typ: tar.TypeReg, body: "new"},
		entry{name: "d/", typ: tar.TypeDir},
		entry{name: "s", typ: tar.TypeReg, body: "was a symlink"},
	)
	if _, err := Unpack(t.Context(), bytes.NewReader(a), dst, Options{}); err != nil {
		t.Fatalf("Unpack = %v", err)
	}
	for name, want := range map[string]string{"f": "new", "other": "keep", "d/kept": "kept", "s": "was a symlink"} {
		if b, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(b) != want {
			t.Errorf("read %s = %q, %v, want %q", name, b, err, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(dst, "d")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("Lstat(d) = %v, %v, want mode 0755", fi.Mode(), err)
	}
}

func TestUnpackTruncated(t *testing.T) {
	big := make([]byte, 1<<20)
	rand.Read(big)
	whole := archive(t, entry{name: "f", typ: tar.TypeReg, body: string(big)}, entry{name: "g", typ: tar.TypeReg, body: "g"})
	var noTrailer bytes.Buffer
	tw := tar.NewWriter(&noTrailer)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Flush() // pads the data; Close would add the end-of-archive marker

	for _, tc := range []struct {
		name string
		data []byte
	}{
		{name: "in data", data: whole[:len(whole)/2]},
		{name: "in header", data: whole[:512+len(big)+100]},
		{name: "no trailer", data: noTrailer.Bytes()},
		{name: "half trailer", data: whole[:len(whole)-512]},
		{name: "empty", data: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Unpack(t.Context(), bytes.NewReader(tc.data), t.TempDir(), Options{})
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("Unpack(%d of %d bytes) = %v, want %v", len(tc.data), len(whole), err, io.ErrUnexpectedEOF)
			}
		})
	}
}

func TestUnpackCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	a := archive(t, entry{name: "f", typ: tar.TypeReg, body: "x"})
	if _, err := Unpack(ctx, bytes.NewReader(a), t.TempDir(), Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Unpack(canceled) = %v, want %v", err, context.Canceled)
	}
}

func TestPlaceNew(t *testing.T) {
	base := t.TempDir()
	staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
	mustMkdir(t, filepath.Join(staging, "d"))
	mustWrite(t, filepath.Join(staging, "d/f"), "f")
	want := snapshot(t, staging)

	if err := Place(staging, target, Options{}); err != nil {
		t.Fatalf("Place = %v", err)
	}
	if diff := cmp.Diff(want, snapshot(t, target)); diff != "" {
		t.Errorf("placed tree differs (-staged +placed):\n%s", diff)
	}
	assertMissing(t, staging)
}

func TestPlaceMerge(t *testing.T) {
	base := t.TempDir()
	staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
	mustMkdir(t, filepath.Join(target, "d"))
	mustWrite(t, filepath.Join(target, "keep"), "keep")
	mustWrite(t, filepath.Join(target, "over"), "old")
	mustWrite(t, filepath.Join(target, "d/old"), "old")
	if err := os.Symlink("keep", filepath.Join(target, "link")); err != nil {
		t.Fatalf("setup: %v", err)
	}
	mustMkdir(t, filepath.Join(staging, "d/sub"))
	mustMkdir(t, filepath.Join(staging, "newdir"))
	mustWrite(t, filepath.Join(staging, "over"), "new")
	mustWrite(t, filepath.Join(staging, "link"), "file over symlink")
	mustWrite(t, filepath.Join(staging, "d/new"), "new")
	mustWrite(t, filepath.Join(staging, "d/sub/x"), "x")
	mustWrite(t, filepath.Join(staging, "newdir/y"), "y")
	if err := os.Chmod(filepath.Join(staging, "d"), 0o750); err != nil {
		t.Fatalf("setup: %v", err)
	}
	mtime := time.Date(2021, 6, 7, 8, 9, 10, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(staging, "d"), mtime, mtime); err != nil {
		t.Fatalf("setup: %v", err)
	}

	if err := Place(staging, target, Options{}); err != nil {
		t.Fatalf("Place = %v", err)
	}
	for name, want := range map[string]string{
		"keep": "keep", "over": "new", "link": "file over symlink",
		"d/old": "old", "d/new": "new", "d/sub/x": "x", "newdir/y": "y",
	} {
		if b, err := os.ReadFile(filepath.Join(target, name)); err != nil || string(b) != want {
			t.Errorf("read %s = %q, %v, want %q", name, b, err, want)
		}
	}
	fi, err := os.Lstat(filepath.Join(target, "d"))
	if err != nil || fi.Mode().Perm() != 0o750 || !fi.ModTime().Equal(mtime) {
		t.Errorf("Lstat(d) = %v %v, %v, want mode 0750 mtime %v", fi.Mode(), fi.ModTime(), err, mtime)
	}
	assertMissing(t, staging)
}

func TestPlaceConflicts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, staging, target string)
	}{
		{name: "file over dir", setup: func(t *testing.T, staging, target string) {
			mustMkdir(t, filepath.Join(target, "sub/x"))
			mustMkdir(t, filepath.Join(staging, "sub"))
			mustWrite(t, filepath.Join(staging, "sub/x"), "file")
		}},
		{name: "dir over file", setup: func(t *testing.T, staging, target string) {
			mustWrite(t, filepath.Join(target, "x"), "file")
			mustMkdir(t, filepath.Join(staging, "x"))
		}},
		{name: "dir over symlink", setup: func(t *testing.T, staging, target string) {
			mustMkdir(t, filepath.Join(target, "real"))
			if err := os.Symlink("real", filepath.Join(target, "x")); err != nil {
				t.Fatalf("setup: %v", err)
			}
			mustMkdir(t, filepath.Join(staging, "x"))
			mustWrite(t, filepath.Join(staging, "x/f"), "f")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
			mustMkdir(t, staging)
			mustMkdir(t, target)
			mustWrite(t, filepath.Join(target, "a"), "old") // sorts before the conflict
			mustWrite(t, filepath.Join(staging, "a"), "new")
			tc.setup(t, staging, target)
			wantTarget, wantStaging := snapshot(t, target), snapshot(t, staging)

			if err := Place(staging, target, Options{}); !errors.Is(err, errkind.FailedPrecondition) {
				t.Errorf("Place = %v, want %v", err, errkind.FailedPrecondition)
			}
			if diff := cmp.Diff(wantTarget, snapshot(t, target)); diff != "" {
				t.Errorf("target changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(wantStaging, snapshot(t, staging)); diff != "" {
				t.Errorf("staging changed (-before +after):\n%s", diff)
			}
		})
	}
}

func TestPlaceErrors(t *testing.T) {
	base := t.TempDir()
	staging := filepath.Join(base, "staging")
	mustMkdir(t, staging)
	file := filepath.Join(base, "file")
	mustWrite(t, file, "x")
	for _, tc := range []struct {
		name   string
		target string
	}{
		{name: "target is a file", target: file},
		{name: "no parent", target: filepath.Join(base, "missing", "target")},
		{name: "parent is a file", target: filepath.Join(file, "target")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Place(staging, tc.target, Options{}); !errors.Is(err, errkind.FailedPrecondition) {
				t.Errorf("Place(%s) = %v, want %v", tc.target, err, errkind.FailedPrecondition)
			}
		})
	}
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
}

func mustWrite(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
}

// assertMissing fails t for each path that exists.
func assertMissing(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Lstat(%s) = %v, want it not to exist", p, err)
		}
	}
}

// sender is a FileSender that copies the file itself, sending at most
// limit bytes of each (a file that shrank under it).
type sender struct {
	bytes.Buffer
	limit int64
	files int
}

func (s *sender) SendFile(f *os.File, n int64) (int64, error) {
	s.files++
	return io.Copy(&s.Buffer, io.LimitReader(f, min(n, s.limit)))
}

// TestPackFileSender: a destination that sends big files itself gets the
// archive Pack writes otherwise, byte for byte, and a file it finds
// shorter than its header said is padded with zeros as Pack pads it.
func TestPackFileSender(t *testing.T) {
	src := t.TempDir()
	buildTree(t, src)
	long := filepath.Join(src, strings.Repeat("n", 150)) // a PAX name record
	if err := os.WriteFile(long, bytes.Repeat([]byte{7}, MinSend+1), 0o644); err != nil {
		t.Fatal(err)
	}
	setMTimes(t, src)
	var plain bytes.Buffer
	if _, err := Pack(t.Context(), src, &plain); err != nil {
		t.Fatalf("Pack = %v", err)
	}
	s := &sender{limit: 1 << 62}
	st, err := Pack(t.Context(), src, s)
	if err != nil {
		t.Fatalf("Pack to a FileSender = %v", err)
	}
	if s.files != 2 || !bytes.Equal(s.Bytes(), plain.Bytes()) {
		t.Errorf("Pack to a FileSender: %d files sent, archive of %d bytes equal to the plain one's %d: %v", s.files, s.Len(), plain.Len(), bytes.Equal(s.Bytes(), plain.Bytes()))
	}
	if st.Entries == 0 || st.Bytes < 2*MinSend {
		t.Errorf("Pack to a FileSender: stats %+v", st)
	}

	// The files shrank to 1000 bytes after their headers were made.
	short := &sender{limit: 1000}
	if _, err := Pack(t.Context(), src, short); err != nil {
		t.Fatalf("Pack to a FileSender of short files = %v", err)
	}
	tr := tar.NewReader(&short.Buffer)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the archive of short files: %v", err)
		}
		if hdr.Size < MinSend {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil || int64(len(body)) != hdr.Size || bytes.ContainsFunc(body[1000:], func(r rune) bool { return r != 0 }) {
			t.Errorf("entry %s of a file cut short: %v, %d of %d bytes, or not zeros after the cut", hdr.Name, err, len(body), hdr.Size)
		}
	}
}
