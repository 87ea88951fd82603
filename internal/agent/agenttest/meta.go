package agenttest

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
)

// testFileMeta checks what a stat and a listing tell beyond size and
// mode: owner and group by ID and name, a symlink's target, and the user
// extended attributes a write set.
func testFileMeta(t *testing.T, c *client.Client, opts Options) {
	dir := opts.Scratch + "/meta"
	if err := c.Mkdir(ctx(t, time.Minute), dir, 0, true); err != nil {
		t.Fatalf("Mkdir = %v", err)
	}
	xattrs := map[string]string{"a.b": "1", "K-2_x": "two words", "empty": ""}
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: dir + "/f", Xattrs: xattrs}, strings.NewReader("data")); err != nil {
		t.Fatalf("WriteFile(xattrs) = %v", err)
	}
	Output(t, c, "ln -s f "+dir+"/link")
	st, err := c.Stat(ctx(t, time.Minute), dir+"/f")
	if err != nil {
		t.Fatalf("Stat = %v", err)
	}
	if diff := cmp.Diff(xattrs, st.Xattrs); diff != "" {
		t.Errorf("Stat(f).Xattrs differ (-want +got):\n%s", diff)
	}
	if !opts.Unprivileged && (st.UID != 0 || st.GID != 0 || st.Owner != "root" || st.Group != "root") {
		t.Errorf("Stat(f) owner = %d (%q), group %d (%q); want 0 (root), 0 (root)", st.UID, st.Owner, st.GID, st.Group)
	}
	link, err := c.Stat(ctx(t, time.Minute), dir+"/link")
	if err != nil || link.Type != proto.FileSymlink || link.Target != "f" {
		t.Errorf("Stat(link) = %+v, %v; want a symlink to f, not followed", link, err)
	}
	entries, err := c.List(ctx(t, time.Minute), dir, 0)
	if err != nil {
		t.Fatalf("List = %v", err)
	}
	got := map[string]map[string]string{}
	for _, e := range entries {
		got[e.Name] = e.Xattrs
	}
	if diff := cmp.Diff(map[string]map[string]string{"f": xattrs, "link": nil}, got); diff != "" {
		t.Errorf("List xattrs differ (-want +got):\n%s", diff)
	}
	// A resumable upload's part sets them on the partial file.
	at := int64(0)
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: dir + "/part", At: &at, Xattrs: map[string]string{"k": "v"}}, strings.NewReader("x")); err != nil {
		t.Fatalf("WriteFile(at 0, xattrs) = %v", err)
	}
	if st, err := c.Stat(ctx(t, time.Minute), dir+"/part"); err != nil || st.Xattrs["k"] != "v" {
		t.Errorf("Stat(part) = %+v, %v; want xattr k=v", st, err)
	}
	if !opts.Unprivileged {
		uid := uint32(43210) // in no /etc/passwd
		if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: dir + "/nobody", UID: &uid, GID: &uid}, strings.NewReader("")); err != nil {
			t.Fatalf("WriteFile(uid) = %v", err)
		}
		if st, err := c.Stat(ctx(t, time.Minute), dir+"/nobody"); err != nil || st.UID != uid || st.Owner != "" || st.Group != "" {
			t.Errorf("Stat(nobody's) = %+v, %v; want uid %d without names", st, err, uid)
		}
	}
	for _, bad := range []map[string]string{{"no/slash": "x"}, {"": "x"}, {"big": strings.Repeat("x", proto.MaxXattrValue+1)}} {
		_, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: dir + "/bad", Xattrs: bad}, strings.NewReader(""))
		if !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("WriteFile(xattrs %.40v) = %v, want InvalidArgument", bad, err)
		}
	}
}

// eventKey is what a test compares of an event.
type eventKey struct {
	Op   proto.WatchOp
	Path string
}

// collect reads events from w until want holds for what it read, or ctx
// (of w) ends.
func collect(t *testing.T, w *client.Watcher, want func([]proto.WatchEvent) bool) []proto.WatchEvent {
	t.Helper()
	var got []proto.WatchEvent
	for !want(got) {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("Next after %v = %v", keys(got), err)
		}
		got = append(got, ev)
	}
	return got
}

func keys(evs []proto.WatchEvent) []eventKey {
	out := make([]eventKey, 0, len(evs))
	for _, ev := range evs {
		out = append(out, eventKey{ev.Op, ev.Path})
	}
	return out
}

// has reports whether evs holds every one of want, in that order (with
// others between).
func has(evs []proto.WatchEvent, want ...eventKey) bool {
	i := 0
	for _, ev := range evs {
		if i < len(want) && (eventKey{ev.Op, ev.Path}) == want[i] {
			i++
		}
	}
	return i == len(want)
}

func testWatch(t *testing.T, c *client.Client, opts Options) {
	dir := opts.Scratch + "/watch"
	if err := c.Mkdir(ctx(t, time.Minute), dir, 0, true); err != nil {
		t.Fatalf("Mkdir = %v", err)
	}
	t.Run("Recursive", func(t *testing.T) {
		w, err := c.Watch(ctx(t, time.Minute), proto.WatchArgs{Path: dir, Recursive: true})
		if err != nil {
			t.Fatalf("Watch = %v", err)
		}
		defer w.Close()
		Output(t, c, "cd "+dir+" && echo hi > f && echo more >> f && chmod 600 f && mv f g && mkdir -p sub/deep && echo x > sub/deep/h && rm g")
		want := []eventKey{
			{proto.WatchCreate, dir + "/f"}, {proto.WatchWrite, dir + "/f"}, {proto.WatchChmod, dir + "/f"},
			{proto.WatchRename, dir + "/f"}, {proto.WatchCreate, dir + "/g"}, {proto.WatchCreate, dir + "/sub"},
			{proto.WatchRemove, dir + "/g"},
		}
		deep := []eventKey{{proto.WatchCreate, dir + "/sub/deep"}, {proto.WatchCreate, dir + "/sub/deep/h"}}
		got := collect(t, w, func(evs []proto.WatchEvent) bool { return has(evs, want...) && has(evs, deep...) })
		// A later change deep down comes from the watch added for it.
		Output(t, c, "echo y >> "+dir+"/sub/deep/h")
		got = collect(t, w, func(evs []proto.WatchEvent) bool {
			return has(evs, eventKey{proto.WatchWrite, dir + "/sub/deep/h"})
		})
		if info := got[len(got)-1].Info; info == nil || info.Name != "h" || info.Type != proto.FileRegular {
			t.Errorf("write event info = %+v, want file h", info)
		}
	})
	t.Run("NotRecursive", func(t *testing.T) {
		w, err := c.Watch(ctx(t, time.Minute), proto.WatchArgs{Path: dir})
		if err != nil {
			t.Fatalf("Watch = %v", err)
		}
		defer w.Close()
		Output(t, c, "cd "+dir+" && echo z > sub/ignored && echo s > sentinel")
		got := collect(t, w, func(evs []proto.WatchEvent) bool {
			return has(evs, eventKey{proto.WatchCreate, dir + "/sentinel"})
		})
		for _, ev := range got {
			if strings.HasPrefix(ev.Path, dir+"/sub/") {
				t.Errorf("non-recursive watch reported %v", eventKey{ev.Op, ev.Path})
			}
		}
		if info := got[len(got)-1].Info; info == nil || info.Name != "sentinel" {
			t.Errorf("create event info = %+v, want sentinel's", info)
		}
	})
	t.Run("RootRemoved", func(t *testing.T) {
		root := dir + "/gone"
		if err := c.Mkdir(ctx(t, time.Minute), root, 0, false); err != nil {
			t.Fatalf("Mkdir = %v", err)
		}
		w, err := c.Watch(ctx(t, time.Minute), proto.WatchArgs{Path: root})
		if err != nil {
			t.Fatalf("Watch = %v", err)
		}
		defer w.Close()
		Output(t, c, "rmdir "+root)
		got := collect(t, w, func(evs []proto.WatchEvent) bool { return has(evs, eventKey{proto.WatchRemove, root}) })
		if ev, err := w.Next(); err != io.EOF {
			t.Errorf("Next after the root's removal (%v) = %+v, %v; want io.EOF", keys(got), ev, err)
		}
	})
	t.Run("Errors", func(t *testing.T) {
		tests := []struct {
			name string
			path string
			kind error
		}{
			{"missing", dir + "/nope", errkind.NotFound},
			{"file", dir + "/sentinel", errkind.FailedPrecondition},
			{"relative", "watch", errkind.InvalidArgument},
		}
		for _, tt := range tests {
			w, err := c.Watch(ctx(t, time.Minute), proto.WatchArgs{Path: tt.path})
			if err == nil {
				w.Close()
			}
			if !errors.Is(err, tt.kind) {
				t.Errorf("Watch(%s) = %v, want %v", tt.name, err, tt.kind)
			}
		}
	})
}
