package chunkstore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"space/internal/chunkstore"
	"space/internal/chunkstore/local"
	"space/internal/errkind"
)

func newStore(t *testing.T) (*chunkstore.Store, *local.Backend) {
	t.Helper()
	b, err := local.New(t.TempDir())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	s, err := chunkstore.New(chunkstore.Config{Backend: b})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return s, b
}

func keys(t *testing.T, b chunkstore.Backend, prefix string) []string {
	t.Helper()
	var out []string
	if err := b.List(t.Context(), prefix, func(o chunkstore.ObjectInfo) error { out = append(out, o.Key); return nil }); err != nil {
		t.Fatalf("List = %v", err)
	}
	return out
}

func TestNewValidates(t *testing.T) {
	if _, err := chunkstore.New(chunkstore.Config{}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("New(no backend) = %v, want InvalidArgument", err)
	}
	b, _ := local.New(t.TempDir())
	if _, err := chunkstore.New(chunkstore.Config{Backend: b, LeaseTTL: -1}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("New(negative TTL) = %v, want InvalidArgument", err)
	}
}

func TestPutRejectsUnreadableFiles(t *testing.T) {
	s, b := newStore(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		path string
		want error
	}{
		{"missing file", filepath.Join(dir, "nope"), os.ErrNotExist},
		{"directory", dir, errkind.InvalidArgument},
	} {
		_, _, err := s.Put(t.Context(), "s", []chunkstore.File{{Name: "f", Path: tc.path}}, chunkstore.PutOptions{Domain: "test"})
		if !errors.Is(err, tc.want) {
			t.Errorf("Put(%s) = %v, want %v", tc.name, err, tc.want)
		}
	}
	if k := keys(t, b, ""); len(k) != 0 {
		t.Errorf("failed Puts wrote %q", k)
	}
}

func TestPutCancelledCommitsNothing(t *testing.T) {
	s, b := newStore(t)
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("some data"), 0o600)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := s.Put(ctx, "s", []chunkstore.File{{Name: "f", Path: p}}, chunkstore.PutOptions{Domain: "test"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Put(cancelled) = %v, want context.Canceled", err)
	}
	if k := keys(t, b, "manifests/"); len(k) != 0 {
		t.Errorf("cancelled Put wrote manifest %q", k)
	}
	if k := keys(t, b, "leases/"); len(k) != 0 {
		t.Errorf("cancelled Put left lease %q", k)
	}
}

// TestReplacedParent: a parent deleted and re-created under the same ID
// (other content) must not lend its chunks.
func TestReplacedParent(t *testing.T) {
	s, _ := newStore(t)
	ctx := t.Context()
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("first content"), 0o600)
	files := []chunkstore.File{{Name: "f", Path: p}}
	parent, _, err := s.Put(ctx, "p", files, chunkstore.PutOptions{Domain: "test"})
	if err != nil {
		t.Fatalf("Put(p) = %v", err)
	}
	if err := s.Delete(ctx, "p"); err != nil {
		t.Fatalf("Delete(p) = %v", err)
	}
	os.WriteFile(p, []byte("other content"), 0o600)
	if _, _, err := s.Put(ctx, "p", files, chunkstore.PutOptions{Domain: "test"}); err != nil {
		t.Fatalf("Put(p again) = %v", err)
	}
	_, _, err = s.Put(ctx, "c", files, chunkstore.PutOptions{Domain: "test", Parent: &parent, Dirty: map[string][]chunkstore.Range{"f": nil}})
	if !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Put with a replaced parent = %v, want FailedPrecondition", err)
	}
}
