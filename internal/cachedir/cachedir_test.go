package cachedir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

func TestEnsureBuildsOnce(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	var builds atomic.Int32
	var wg sync.WaitGroup
	paths := make([]string, 8)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := d.Ensure(t.Context(), "thing", "key1", func(ctx context.Context, tmp string) error {
				builds.Add(1)
				return os.WriteFile(tmp, []byte("content"), 0o644)
			})
			if err != nil {
				t.Errorf("Ensure = %v", err)
			}
			paths[i] = p
		}()
	}
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Errorf("built %d times by 8 concurrent callers, want 1", n)
	}
	for _, p := range paths {
		if b, err := os.ReadFile(p); err != nil || string(b) != "content" {
			t.Errorf("entry %s = %q, %v", p, b, err)
		}
	}
}

func TestEnsureFailedBuildLeavesNothing(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	boom := errors.New("boom")
	_, err = d.Ensure(t.Context(), "thing", "k", func(ctx context.Context, tmp string) error {
		os.WriteFile(tmp, []byte("half"), 0o644)
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Ensure(failing build) = %v, want boom", err)
	}
	if _, err := os.Stat(d.Path("thing", "k")); !os.IsNotExist(err) {
		t.Errorf("entry after failed build: %v, want none", err)
	}
	left, _ := os.ReadDir(filepath.Join(d.Root(), "tmp"))
	if len(left) != 0 {
		t.Errorf("scratch left behind: %v", left)
	}
}

func TestEnsureRejectsBadNames(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	for _, name := range []string{"", ".", "..", "a/b", "x\x00"} {
		if _, err := d.Ensure(t.Context(), "kind", name, func(context.Context, string) error { return nil }); err == nil {
			t.Errorf("Ensure(key %q) = nil error, want one", name)
		}
	}
}
