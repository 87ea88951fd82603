package server

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/testenv"
)

// TestFakeVMMFileOps drives stat, mkdir, move, metadata and watch
// through the API against guests of the fake VMM (agents on the host).
func TestFakeVMMFileOps(t *testing.T) {
	ts := startFakeServer(t, 0, 0)
	sb, err := ts.client.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	testFileOps(t, ts.client, sb.ID, "/work/ops")
}

// TestFileOps drives stat, mkdir, move, metadata and watch through the
// API against a real VM, and checks what only a real guest shows: names
// of its users, a file system without user extended attributes, and
// that a watch the client drops closes the agent's inotify instance.
func TestFileOps(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	testFileOps(t, c, sb.ID, "/root/ops")

	if _, err := c.WriteFile(ctx, sb.ID, "/root/owned", strings.NewReader("x"), client.WriteOptions{Owner: "nobody"}); err != nil {
		t.Fatalf("WriteFile(owner nobody) = %v", err)
	}
	for path, want := range map[string][2]string{"/root/owned": {"nobody", "nogroup"}, "/etc/hostname": {"root", "root"}} {
		if fi, err := c.Stat(ctx, sb.ID, path); err != nil || fi.Owner != want[0] || fi.Group != want[1] {
			t.Errorf("Stat(%s) = owner %q, group %q (%v); want %q, %q", path, fi.Owner, fi.Group, err, want[0], want[1])
		}
	}

	// The guest's /tmp is a tmpfs; the guest kernel's (Debian's 6.1) has
	// no user extended attributes, and then the write says so.
	md := map[string]string{"k": "v"}
	_, err = c.WriteFile(ctx, sb.ID, "/tmp/md", strings.NewReader("x"), client.WriteOptions{Metadata: md})
	var e *client.Error
	switch {
	case err == nil:
		fi, err := c.Stat(ctx, sb.ID, "/tmp/md")
		if err != nil || !cmp.Equal(fi.Metadata, md) {
			t.Errorf("Stat(/tmp/md) = %+v, %v; want metadata %v", fi, err, md)
		}
		t.Logf("the guest's tmpfs holds user extended attributes")
	case !errors.As(err, &e) || e.Code != api.CodeFailedPrecondition || !strings.Contains(e.Message, "extended attributes"):
		t.Errorf("WriteFile(/tmp, metadata) = %v, want failed_precondition saying the file system has no user extended attributes", err)
	}

	// The agent is the guest's PID 1: its inotify instances are there.
	inotify := func() string {
		out, _, _ := execOut(t, c, sb.ID, sh(`ls -l /proc/1/fd | grep -c inotify`))
		return strings.TrimSpace(out)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := c.WatchFiles(wctx, sb.ID, "/root", true)
	if err != nil {
		t.Fatalf("WatchFiles = %v", err)
	}
	if got := inotify(); got != "1" {
		t.Errorf("inotify instances of the agent while watching = %s, want 1", got)
	}
	cancel()
	w.Close()
	testenv.Eventually(t, time.Minute, func() bool { return inotify() == "0" })
}

// testFileOps checks the file routes below dir (made here) of sandbox id.
func testFileOps(t *testing.T, c *client.Client, id, dir string) {
	ctx := t.Context()
	fi, created, err := c.MakeDir(ctx, id, mkdirReq(dir+"/a/b", true))
	if err != nil || !created || fi.Type != "dir" || fi.Path != dir+"/a/b" || fi.Permissions != "drwxr-xr-x" {
		t.Fatalf("MakeDir(parents) = %+v, created %v, %v; want the new directory", fi, created, err)
	}
	if fi, created, err := c.MakeDir(ctx, id, mkdirReq(dir+"/a/b", true)); err != nil || created || fi.Type != "dir" {
		t.Errorf("MakeDir(existing) = %+v, created %v, %v; want the directory, not created", fi, created, err)
	}
	if _, _, err := c.MakeDir(ctx, id, mkdirReq(dir+"/x/y", false)); !client.IsNotFound(err) {
		t.Errorf("MakeDir(missing parent, no parents) = %v, want not found", err)
	}

	md := map[string]string{"Key.One": "v1", "k-2_x": "two words"}
	if _, err := c.WriteFile(ctx, id, dir+"/f", strings.NewReader("hello"), client.WriteOptions{Metadata: md}); err != nil {
		t.Fatalf("WriteFile(metadata) = %v", err)
	}
	want := map[string]string{"key.one": "v1", "k-2_x": "two words"} // header names are case-insensitive
	fi, err = c.Stat(ctx, id, dir+"/f")
	if err != nil {
		t.Fatalf("Stat = %v", err)
	}
	if fi.Path != dir+"/f" || fi.Name != "f" || fi.Type != "file" || fi.Size != 5 || fi.Mode != 0o644 ||
		fi.Permissions != "-rw-r--r--" || fi.Owner == "" || fi.Group == "" || !cmp.Equal(fi.Metadata, want) {
		t.Errorf("Stat(f) = %+v; want a 0644 file of 5 bytes at %s with owner, group and metadata %v", fi, dir+"/f", want)
	}
	if _, _, err := c.MakeDir(ctx, id, mkdirReq(dir+"/f", true)); !client.IsConflict(err) {
		t.Errorf("MakeDir(over a file) = %v, want conflict", err)
	}
	l, err := c.ListFiles(ctx, id, dir)
	if err != nil {
		t.Fatalf("ListFiles = %v", err)
	}
	got := map[string]api.FileInfo{}
	for _, e := range l.Entries {
		got[e.Name] = e
	}
	if e := got["f"]; e.Path != dir+"/f" || !cmp.Equal(e.Metadata, want) || got["a"].Path != dir+"/a" {
		t.Errorf("ListFiles = %+v; want f with its path and metadata, and a", l.Entries)
	}

	moved, err := c.Move(ctx, id, dir+"/f", dir+"/m/n/g")
	if err != nil || moved.Path != dir+"/m/n/g" || moved.Size != 5 || !cmp.Equal(moved.Metadata, want) {
		t.Errorf("Move = %+v, %v; want g of 5 bytes, with the metadata", moved, err)
	}
	if _, err := c.Move(ctx, id, dir+"/f", dir+"/h"); !client.IsNotFound(err) {
		t.Errorf("Move(missing) = %v, want not found", err)
	}
	if _, err := c.Stat(ctx, id, dir+"/h"); !client.IsNotFound(err) {
		t.Errorf("Stat(h) after a failed move = %v, want not found", err)
	}
	execOut(t, c, id, sh("ln -s g "+dir+"/m/n/l"))
	if fi, err := c.Stat(ctx, id, dir+"/m/n/l"); err != nil || fi.Type != "symlink" || fi.Target != "g" || !strings.HasPrefix(fi.Permissions, "l") {
		t.Errorf("Stat(symlink) = %+v, %v; want the symlink to g itself", fi, err)
	}

	t.Run("Watch", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		w, err := c.WatchFiles(wctx, id, dir, true)
		if err != nil {
			t.Fatalf("WatchFiles = %v", err)
		}
		defer w.Close()
		execOut(t, c, id, sh("cd "+dir+" && echo hi > w1 && mkdir a/new && echo x > a/new/deep && mv w1 w2 && chmod 600 w2 && rm w2"))
		type ev struct{ typ, name string }
		wantSeq := []ev{{"create", "w1"}, {"write", "w1"}, {"create", "a/new"}, {"create", "a/new/deep"},
			{"rename", "w1"}, {"create", "w2"}, {"chmod", "w2"}, {"remove", "w2"}}
		var seen []ev
		var newDir *api.FileInfo
		i := 0
		for i < len(wantSeq) {
			e, err := w.Next()
			if err != nil {
				t.Fatalf("Next after %v = %v", seen, err)
			}
			seen = append(seen, ev{string(e.Type), e.Name})
			if e.Path != dir+"/"+e.Name {
				t.Errorf("event %+v: path is not the watched directory's and the name", e)
			}
			if e.Name == "a/new" && e.Type == "create" {
				newDir = e.Entry
			}
			if (ev{string(e.Type), e.Name}) == wantSeq[i] {
				i++
			}
		}
		if newDir == nil || newDir.Type != "dir" || newDir.Path != dir+"/a/new" {
			t.Errorf("create event of a/new has entry %+v, want the directory", newDir)
		}

		gone, err := c.WatchFiles(wctx, id, dir+"/a/b", false)
		if err != nil {
			t.Fatalf("WatchFiles(a/b) = %v", err)
		}
		defer gone.Close()
		execOut(t, c, id, sh("rmdir "+dir+"/a/b"))
		if e, err := gone.Next(); err != nil || e.Type != "remove" || e.Name != "." {
			t.Errorf("Next after rmdir of the watched directory = %+v, %v; want its remove event", e, err)
		}
		if _, err := gone.Next(); err != io.EOF {
			t.Errorf("Next after the watched directory's removal = %v, want io.EOF", err)
		}

		if _, err := c.WatchFiles(wctx, id, dir+"/nope", false); !client.IsNotFound(err) {
			t.Errorf("WatchFiles(missing) = %v, want not found", err)
		}
		if _, err := c.WatchFiles(wctx, id, dir+"/m/n/g", false); !client.IsInvalid(err) {
			t.Errorf("WatchFiles(file) = %v, want invalid", err)
		}
	})
}

func mkdirReq(p string, parents bool) api.MakeDir {
	return api.MakeDir{Path: p, Parents: &parents}
}
