package main

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// hostileTar is what a hostile guest's agent may send for file get -r:
// setuid and setgid files owned by root, setgid and sticky directories,
// world-writable files, devices, a fifo, and links that try to get out.
var hostileTar = func() []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o2775, Uid: 0, Gid: 0},
		{Name: "bin/suid-sh", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 0, Gid: 0, Size: 3},
		{Name: "bin/sgid", Typeflag: tar.TypeReg, Mode: 0o2755, Uid: 1234, Gid: 5678, Size: 3},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "tmp/open", Typeflag: tar.TypeReg, Mode: 0o666, Size: 3},
		{Name: "tmp/fifo", Typeflag: tar.TypeFifo, Mode: 0o666},
		{Name: "mem", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 1},
		{Name: "sda", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 8},
		{Name: "run.sh", Typeflag: tar.TypeReg, Mode: 0o755, Size: 3},
		{Name: "run", Typeflag: tar.TypeSymlink, Linkname: "run.sh"},
		{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
	} {
		if err := tw.WriteHeader(&h); err != nil {
			panic(err)
		}
		tw.Write(make([]byte, h.Size))
	}
	tw.Close()
	return buf.Bytes()
}()

// TestFileGetHostile: what comes out of a sandbox lands on the host with
// no setuid, setgid or sticky bit, no group or other write, no owner of
// the guest's, and no fifo or device node; plain files, executables and
// symlinks come out as they were.
func TestFileGetHostile(t *testing.T) {
	f := newFakeAPI(t)
	g, _, stderr := newTestGlobals(t, f.env())
	dir := t.TempDir()
	local := filepath.Join(dir, "tree")
	if _, err := run(t.Context(), g, []string{"file", "get", "-r", "sb-1", "/", local}); err != nil {
		t.Fatalf("file get -r = %v", err)
	}
	if _, err := run(t.Context(), g, []string{"file", "get", "sb-1", "/suid/sh", filepath.Join(dir, "sh")}); err != nil {
		t.Fatalf("file get = %v", err)
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	type file = hostFile
	want := map[string]file{
		"tree":             {Mode: fs.ModeDir | 0o700, UID: uid, GID: gid}, // the staging directory's
		"tree/bin":         {Mode: fs.ModeDir | 0o755, UID: uid, GID: gid},
		"tree/bin/suid-sh": {Mode: 0o755, UID: uid, GID: gid},
		"tree/bin/sgid":    {Mode: 0o755, UID: uid, GID: gid},
		"tree/tmp":         {Mode: fs.ModeDir | 0o755, UID: uid, GID: gid},
		"tree/tmp/open":    {Mode: 0o644, UID: uid, GID: gid},
		"tree/run.sh":      {Mode: 0o755, UID: uid, GID: gid},
		"tree/run":         {Mode: fs.ModeSymlink, UID: uid, GID: gid, Target: "run.sh"},
		"tree/etc":         {Mode: fs.ModeSymlink, UID: uid, GID: gid, Target: "/etc"},
		"sh":               {Mode: 0o755, UID: uid, GID: gid},
	}
	got := hostTree(t, dir)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files on the host after file get of a hostile guest (-want +got):\n%s", diff)
	}
	if !strings.Contains(stderr.String(), "left out 3 ") {
		t.Errorf("file get -r stderr = %q, want a warning that 3 entries were left out", stderr.String())
	}
}

// hostFile is what the tests check of a file a download wrote on the
// host; a symbolic link's Mode is fs.ModeSymlink alone.
type hostFile struct {
	Mode     fs.FileMode
	UID, GID uint32
	Target   string // a symbolic link's
}

// hostTree returns the files below dir, by their path relative to it.
func hostTree(t *testing.T, dir string) map[string]hostFile {
	t.Helper()
	got := map[string]hostFile{}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st := fi.Sys().(*syscall.Stat_t)
		f := hostFile{Mode: fi.Mode(), UID: st.Uid, GID: st.Gid}
		if fi.Mode()&fs.ModeSymlink != 0 {
			f.Mode = fs.ModeSymlink
			f.Target, _ = os.Readlink(p)
		}
		got[rel] = f
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return got
}
