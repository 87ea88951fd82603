package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/testenv"
)

// TestAt checks that At finds the hierarchy at a path given to it: the
// host's own, as Detect does; a cgroup2 file system mounted elsewhere (as
// a container sees the host's, mounted into it); and refuses a directory
// that is neither.
func TestAt(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	h, err := Detect()
	if err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "detect cgroups: "+err.Error())
	}
	var root string
	if h.Version() == 2 {
		root = h.v2
	} else {
		root = filepath.Dir(h.roots[0])
	}
	at, err := At(root)
	if err != nil {
		t.Fatalf("At(%s) = %v", root, err)
	}
	if at.Version() != h.Version() || !slices.Equal(at.Controllers(), h.Controllers()) {
		t.Errorf("At(%s) = v%d %v, want what Detect found: v%d %v", root, at.Version(), at.Controllers(), h.Version(), h.Controllers())
	}
	if got, want := sorted(at.Roots()), sorted(h.Roots()); !slices.Equal(got, want) {
		t.Errorf("At(%s) roots = %v, want what Detect found: %v", root, got, want)
	}

	if _, err := At(t.TempDir()); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("At(a plain directory) = %v, want invalid argument", err)
	}
	if _, err := At("/nonexistent/cgroup"); err == nil {
		t.Errorf("At(a missing directory) succeeded")
	}

	// A cgroup2 file system mounted at a path of our choosing.
	mnt := t.TempDir()
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		testenv.Unavailable(t, testenv.TierNetns, "mount cgroup2: "+err.Error())
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	v2, err := At(mnt)
	if err != nil || v2.Version() != 2 {
		t.Fatalf("At(a cgroup2 mount) = %v, %v; want v2", v2, err)
	}
	g, err := v2.Create("space-at-test/sbx_1", Limits{})
	if err != nil {
		t.Fatalf("Create under the mounted hierarchy = %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "space-at-test", "sbx_1")); err != nil {
		t.Errorf("group not made under the given root: %v", err)
	}
	if err := g.Remove(); err != nil {
		t.Errorf("Remove = %v", err)
	}
	os.Remove(filepath.Join(mnt, "space-at-test"))
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
