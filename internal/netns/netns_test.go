package netns

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"space/internal/testenv"
)

// TestCreateEnsureRemove: a namespace made by Create holds only a loopback
// device, down; Ensure keeps a pinned namespace and replaces a leftover
// file with one; Remove unpins it, and removing again is no error.
func TestCreateEnsureRemove(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	path := filepath.Join(t.TempDir(), "ns")
	if err := Create(path); err != nil {
		t.Fatalf("Create = %v", err)
	}
	defer Remove(path)
	if err := Create(path); err == nil {
		t.Errorf("Create over a pinned namespace = nil error")
	}
	err := Do(path, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		if len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp != 0 {
			t.Errorf("a new namespace has %v, want lo alone, down", ifs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var before, after unix.Stat_t
	unix.Stat(path, &before)
	if err := Ensure(path); err != nil {
		t.Fatalf("Ensure(pinned) = %v", err)
	}
	unix.Stat(path, &after)
	if before.Ino != after.Ino {
		t.Errorf("Ensure replaced a pinned namespace")
	}
	if err := Remove(path); err != nil {
		t.Fatalf("Remove = %v", err)
	}
	if err := Remove(path); err != nil {
		t.Errorf("Remove again = %v", err)
	}

	// A crash between the file and the pin leaves a plain file.
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(path); err != nil {
		t.Fatalf("Ensure(leftover file) = %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		t.Errorf("after Ensure, %s is not a namespace (%v)", path, err)
	}
	if err := Remove(path); err != nil {
		t.Errorf("Remove = %v", err)
	}
}
