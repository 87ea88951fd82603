package chunkloc

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/chunkstore"
	"space/internal/errkind"
	"space/internal/testenv/weedtest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, in string
		want     Location
		wantName string // Name()
	}{
		{"directory", "/var/lib/space-chunks", Location{Dir: "/var/lib/space-chunks"}, "local"},
		{"relative directory", "chunks", Location{Dir: "chunks"}, "local"},
		{"bucket", "s3://snaps?endpoint=s3.example.com", Location{S3: &S3{Bucket: "snaps", Endpoint: "s3.example.com", TLS: true}},
			"s3://snaps?endpoint=s3.example.com"},
		{"prefix and options", "s3://snaps/space/prod/?endpoint=10.0.0.5:8333&tls=false&region=eu-west-1",
			Location{S3: &S3{Bucket: "snaps", Prefix: "space/prod", Endpoint: "10.0.0.5:8333", Region: "eu-west-1"}},
			"s3://snaps/space/prod?endpoint=10.0.0.5:8333"},
		{"tls spelled out", "s3://snaps?endpoint=s3.example.com:443&tls=true",
			Location{S3: &S3{Bucket: "snaps", Endpoint: "s3.example.com:443", TLS: true}}, "s3://snaps?endpoint=s3.example.com:443"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse(%q) = %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Parse(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			again, err := Parse(got.String())
			if err != nil || !cmp.Equal(again, got) {
				t.Errorf("Parse(%q.String() = %q) = %+v, %v, want %+v", tt.in, got.String(), again, err, got)
			}
			if got.Remote() != (tt.want.S3 != nil) {
				t.Errorf("Parse(%q).Remote() = %v", tt.in, got.Remote())
			}
			if n := got.Name(); n != tt.wantName {
				t.Errorf("Parse(%q).Name() = %q, want %q", tt.in, n, tt.wantName)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name, in, says string
	}{
		{"empty", "", "empty"},
		{"no endpoint", "s3://snaps", "endpoint is required"},
		{"no bucket", "s3:///prefix?endpoint=h:1", "no bucket"},
		{"opaque", "s3:snaps?endpoint=h:1", "no bucket"},
		{"credentials", "s3://AKIA:secret@snaps?endpoint=h:1", "credentials do not go in the URL"},
		{"scheme in endpoint", "s3://snaps?endpoint=http://h:1", "without a scheme"},
		{"bad port", "s3://snaps?endpoint=h:99999", "bad host or port"},
		{"no host", "s3://snaps?endpoint=:8333", "bad host or port"},
		{"bad tls", "s3://snaps?endpoint=h:1&tls=maybe", "tls="},
		{"unknown option", "s3://snaps?endpoint=h:1&secure=0", `unknown option "secure"`},
		{"repeated option", "s3://snaps?endpoint=h:1&endpoint=h:2", "endpoint given 2 times"},
		{"bad bucket name", "s3://ab?endpoint=h:1", "ucket name"},
		{"bad prefix", "s3://snaps/a/../b?endpoint=h:1", "prefix"},
		{"fragment", "s3://snaps?endpoint=h:1#x", "fragment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want an error", tt.in, got)
			}
			if !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Parse(%q) = %v, want InvalidArgument", tt.in, err)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Parse(%q) = %q, want it to say %q", tt.in, err, tt.says)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("Parse(%q) = %q: the error shows the secret", tt.in, err)
			}
		})
	}
}

func TestCredentialsFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name string
		env  map[string]string
		want Credentials
	}{
		{"none", nil, Credentials{}},
		{"space", map[string]string{"SPACE_S3_ACCESS_KEY": "a", "SPACE_S3_SECRET_KEY": "s"}, Credentials{"a", "s"}},
		{"aws", map[string]string{"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"}, Credentials{"a", "s"}},
		{"space wins", map[string]string{"SPACE_S3_ACCESS_KEY": "a", "SPACE_S3_SECRET_KEY": "s", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}, Credentials{"a", "s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CredentialsFromEnv(env(tt.env)); got != tt.want {
				t.Errorf("CredentialsFromEnv(%v) = %+v, want %+v", tt.env, got, tt.want)
			}
		})
	}
}

func TestOpenDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "chunks")
	if _, err := Open(t.Context(), Location{Dir: dir}, Options{}); err != nil {
		t.Fatalf("Open(%s) = %v", dir, err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Errorf("Open(%s) made no directory: %v", dir, err)
	}
}

// TestOpenS3 opens a real SeaweedFS bucket, and fails to with a wrong
// endpoint, credentials or bucket: the error says which, and no cache
// directory is made.
func TestOpenS3(t *testing.T) {
	srv := weedtest.Start(t)
	good := S3{Bucket: srv.Bucket, Prefix: "space", Endpoint: srv.Endpoint}
	creds := Credentials{srv.AccessKey, srv.SecretKey}
	t.Run("ok", func(t *testing.T) {
		cache := filepath.Join(t.TempDir(), "chunk-cache")
		if _, err := Open(t.Context(), Location{S3: &good}, Options{Credentials: creds, CacheDir: cache}); err != nil {
			t.Fatalf("Open(%s) = %v", Location{S3: &good}, err)
		}
		if _, err := os.Stat(cache); err != nil {
			t.Errorf("cache directory: %v", err)
		}
	})
	closed := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("setup: listen: %v", err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}()
	tests := []struct {
		name  string
		loc   S3
		creds Credentials
		kind  error
		says  string
	}{
		{"wrong endpoint", S3{Bucket: srv.Bucket, Endpoint: closed}, creds, errkind.Unavailable, "server unreachable"},
		{"wrong secret", good, Credentials{srv.AccessKey, "not-the-secret"}, errkind.PermissionDenied, "access denied"},
		{"unknown access key", good, Credentials{"nobody", "not-the-secret"}, errkind.PermissionDenied, "access denied"},
		{"missing bucket", S3{Bucket: srv.Bucket + "-missing", Endpoint: srv.Endpoint}, creds, errkind.FailedPrecondition, "no such bucket"},
		{"half the credentials", good, Credentials{AccessKey: srv.AccessKey}, errkind.InvalidArgument, "go together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "chunk-cache")
			t0 := time.Now()
			_, err := Open(t.Context(), Location{S3: &tt.loc}, Options{Credentials: tt.creds, CacheDir: cache, CheckTimeout: 20 * time.Second})
			t.Logf("Open failed after %s: %v", time.Since(t0).Round(time.Millisecond), err)
			if !errors.Is(err, tt.kind) || !strings.Contains(fmtErr(err), tt.says) {
				t.Errorf("Open(%s) = %v, want %v saying %q", Location{S3: &tt.loc}, err, tt.kind, tt.says)
			}
			if err != nil && strings.Contains(err.Error(), "not-the-secret") {
				t.Errorf("Open error shows the secret: %v", err)
			}
			if _, serr := os.Stat(cache); !os.IsNotExist(serr) {
				t.Errorf("failed Open left a cache directory: Stat = %v", serr)
			}
		})
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestS3RestoreThroughCache stores a file in a real S3 bucket through an
// opened store and restores it twice through another store on the same
// bucket: the first restore fills the second store's chunk cache, and
// both restores are right.
func TestS3RestoreThroughCache(t *testing.T) {
	srv := weedtest.Start(t)
	loc := Location{S3: &S3{Bucket: srv.Bucket, Endpoint: srv.Endpoint}}
	creds := Credentials{srv.AccessKey, srv.SecretKey}
	open := func(cache string) *chunkstore.Store {
		s, err := Open(t.Context(), loc, Options{Credentials: creds, CacheDir: cache})
		if err != nil {
			t.Fatalf("setup: Open = %v", err)
		}
		return s
	}
	data := make([]byte, 8<<20)
	rand.Read(data)
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	m, _, err := open(t.TempDir()).Put(t.Context(), "s", []chunkstore.File{{Name: "f", Path: src}}, chunkstore.PutOptions{Domain: "test"})
	if err != nil {
		t.Fatalf("Put = %v", err)
	}
	cache := t.TempDir()
	other := open(cache)
	dst := filepath.Join(t.TempDir(), "out")
	for _, what := range []string{"cold", "warm"} {
		t0 := time.Now()
		if err := other.Restore(t.Context(), m, "f", dst); err != nil {
			t.Fatalf("Restore (%s cache) = %v", what, err)
		}
		t.Logf("restore of 8 MiB, %s cache: %v", what, time.Since(t0).Round(time.Millisecond))
		if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("Restore (%s cache) wrote %d bytes (%v), want the file", what, len(got), err)
		}
		var n int64
		filepath.WalkDir(filepath.Join(cache, "chunks"), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					n += fi.Size()
				}
			}
			return nil
		})
		if n < int64(len(data)) {
			t.Errorf("after a %s restore the cache holds %d bytes, want the file's %d at least", what, n, len(data))
		}
	}
}
