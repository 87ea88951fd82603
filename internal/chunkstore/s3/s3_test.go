package s3

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkstoretest"
	"space/internal/errkind"
	"space/internal/testenv/weedtest"
)

// newBackend returns a backend on a new bucket of the shared SeaweedFS
// server.
func newBackend(t *testing.T, prefix string) *Backend {
	t.Helper()
	srv := weedtest.Start(t)
	b, err := New(Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Prefix: prefix, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatalf("setup: New = %v", err)
	}
	return b
}

// TestConformanceSeaweedFS runs the suite against a real SeaweedFS S3
// gateway.
func TestConformanceSeaweedFS(t *testing.T) {
	weedtest.Start(t) // one server for all subtests
	chunkstoretest.Run(t, func(t *testing.T) chunkstore.Backend { return newBackend(t, "space/store") })
}

func TestPrefixesIsolate(t *testing.T) {
	srv := weedtest.Start(t)
	ctx := t.Context()
	mk := func(prefix string) *Backend {
		b, err := New(Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Prefix: prefix, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
		if err != nil {
			t.Fatalf("setup: New = %v", err)
		}
		return b
	}
	a, b, root := mk("a"), mk("/b/"), mk("")
	if err := a.Put(ctx, "k", strings.NewReader("from a"), 6); err != nil {
		t.Fatalf("Put = %v", err)
	}
	if _, err := b.Stat(ctx, "k"); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Stat(k) under another prefix = %v, want NotFound", err)
	}
	var keys []string
	root.List(ctx, "", func(o chunkstore.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	if len(keys) != 1 || keys[0] != "a/k" {
		t.Errorf("List at the bucket root = %q, want [a/k]", keys)
	}
}

func TestErrorKinds(t *testing.T) {
	srv := weedtest.Start(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		cfg  Config
		want error
	}{
		{"wrong secret", Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, AccessKey: srv.AccessKey, SecretKey: "wrong"}, errkind.PermissionDenied},
		{"missing bucket", Config{Endpoint: srv.Endpoint, Bucket: "no-such-bucket", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}, errkind.FailedPrecondition},
	} {
		b, err := New(tc.cfg)
		if err != nil {
			t.Fatalf("New(%s) = %v", tc.name, err)
		}
		if err := b.Put(ctx, "k", strings.NewReader("x"), 1); !errors.Is(err, tc.want) {
			t.Errorf("Put with %s = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestUnreachableIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	b, err := New(Config{Endpoint: addr, Bucket: "bucket", AccessKey: "k", SecretKey: "s", Region: "us-east-1"})
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	if _, err := b.Stat(t.Context(), "k"); !errors.Is(err, errkind.Unavailable) {
		t.Errorf("Stat on a closed port = %v, want Unavailable", err)
	}
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no endpoint", Config{Bucket: "b"}},
		{"no bucket", Config{Endpoint: "localhost:1"}},
		{"bad bucket", Config{Endpoint: "localhost:1", Bucket: "B"}},
		{"half credentials", Config{Endpoint: "localhost:1", Bucket: "bucket", AccessKey: "k"}},
		{"bad prefix", Config{Endpoint: "localhost:1", Bucket: "bucket", Prefix: "a/../b"}},
	} {
		if _, err := New(tc.cfg); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(%s) = %v, want InvalidArgument", tc.name, err)
		}
	}
}

func TestExactReader(t *testing.T) {
	for _, tc := range []struct {
		in      string
		size    int64
		wantErr bool
	}{
		{"abc", 3, false},
		{"", 0, false},
		{"ab", 3, true},
		{"abcd", 3, true},
	} {
		got, err := io.ReadAll(&exactReader{r: io.MultiReader(strings.NewReader(tc.in)), left: tc.size})
		if (err != nil) != tc.wantErr || (!tc.wantErr && !bytes.Equal(got, []byte(tc.in))) {
			t.Errorf("exactReader(%q, %d) = %q, %v; want error %v", tc.in, tc.size, got, err, tc.wantErr)
		}
	}
}
