// Package chunkloc parses and opens a chunk store's location: a local
// directory or an S3 bucket named by an s3:// URL.
//
// The URL form is
//
//	s3://BUCKET[/PREFIX]?endpoint=HOST[:PORT][&tls=false][&region=REGION]
//
// endpoint is the S3 server (required; no scheme); tls=false talks plain
// http (default https); region is the bucket's region (default: ask the
// server). Credentials never appear in it: a URL with user information is
// refused. A value that starts with "s3:" is such a URL (or an error);
// anything else is a directory.
//
// Open checks an S3 location at once (one listing of at most one key,
// after minio-go's bucket location lookup when no region is given), so a
// wrong endpoint, credentials or bucket fail a process's start rather
// than its first snapshot, and puts a bounded read cache of chunks
// (package chunkcache) in front of it.
package chunkloc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"space/internal/chunkstore"
	"space/internal/chunkstore/chunkcache"
	"space/internal/chunkstore/local"
	"space/internal/chunkstore/s3"
	"space/internal/errkind"
)

// Location is where a chunk store lives: exactly one of Dir and S3 is
// set.
type Location struct {
	Dir string // a local directory, or ""
	S3  *S3    // or nil
}

// S3 is a bucket location parsed from an s3:// URL.
type S3 struct {
	Bucket   string
	Prefix   string // "" = the bucket's root; no leading or trailing '/'
	Endpoint string // host[:port]
	TLS      bool
	Region   string // or "": ask the server
}

// Remote reports whether l is shared object storage rather than a
// directory.
func (l Location) Remote() bool { return l.S3 != nil }

// String returns l as Parse accepts it.
func (l Location) String() string {
	if l.S3 == nil {
		return l.Dir
	}
	u := url.URL{Scheme: "s3", Host: l.S3.Bucket}
	if l.S3.Prefix != "" {
		u.Path = "/" + l.S3.Prefix
	}
	// Parse lets only host[:port] through as the endpoint: no escaping
	// needed, and a readable host:port.
	q := "endpoint=" + l.S3.Endpoint
	if !l.S3.TLS {
		q += "&tls=false"
	}
	if l.S3.Region != "" {
		q += "&region=" + url.QueryEscape(l.S3.Region)
	}
	u.RawQuery = q
	return u.String()
}

// Name names the store l is for workers to compare (a worker's
// Capabilities.ChunkStore): "s3://BUCKET[/PREFIX]?endpoint=HOST[:PORT]"
// for S3, whose workers that name the same share it, or "local" for a
// directory, which no other host shares. TLS and region, which do not
// change which store it is, are left out; credentials are never in it.
func (l Location) Name() string {
	if l.S3 == nil {
		return "local"
	}
	u := url.URL{Scheme: "s3", Host: l.S3.Bucket, RawQuery: "endpoint=" + l.S3.Endpoint}
	if l.S3.Prefix != "" {
		u.Path = "/" + l.S3.Prefix
	}
	return u.String()
}

// Parse parses a --chunks value: an s3:// URL (see the package doc), or
// else a directory. It does no I/O. An empty s, a bad URL, an unknown query key or a
// missing endpoint is an error wrapping errkind.InvalidArgument.
func Parse(s string) (Location, error) {
	if s == "" {
		return Location{}, fmt.Errorf("chunk store location is empty: %w", errkind.InvalidArgument)
	}
	if !strings.HasPrefix(strings.ToLower(s), "s3:") {
		return Location{Dir: s}, nil
	}
	bad := func(why string, args ...any) (Location, error) {
		return Location{}, fmt.Errorf("chunk store URL %q: %s (want s3://BUCKET[/PREFIX]?endpoint=HOST:PORT[&tls=false][&region=R]): %w",
			redact(s), fmt.Sprintf(why, args...), errkind.InvalidArgument)
	}
	u, err := url.Parse(s)
	if err != nil {
		return bad("does not parse")
	}
	if u.User != nil {
		return bad("credentials do not go in the URL: set SPACE_S3_ACCESS_KEY and SPACE_S3_SECRET_KEY")
	}
	if u.Opaque != "" || u.Host == "" {
		return bad("no bucket")
	}
	if u.Fragment != "" {
		return bad("has a fragment")
	}
	loc := S3{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"), TLS: true}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("query does not parse")
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return bad("%s given %d times", k, len(vs))
		}
		v := vs[0]
		switch k {
		case "endpoint":
			if strings.Contains(v, "://") || strings.ContainsAny(v, "/?#@") {
				return bad("endpoint %q: want host[:port], without a scheme (tls=false for http)", v)
			}
			if h, p, err := net.SplitHostPort(v); err == nil {
				if n, err := strconv.ParseUint(p, 10, 16); h == "" || err != nil || n == 0 {
					return bad("endpoint %q: bad host or port", v)
				}
			}
			loc.Endpoint = v
		case "tls":
			if loc.TLS, err = strconv.ParseBool(v); err != nil {
				return bad("tls=%q: want true or false", v)
			}
		case "region":
			loc.Region = v
		default:
			return bad("unknown option %q", k)
		}
	}
	if loc.Endpoint == "" {
		return bad("endpoint is required")
	}
	// s3.New checks the bucket name and the prefix; check them here too,
	// so Parse alone tells a bad URL.
	if _, err := s3.New(loc.config(Credentials{})); err != nil {
		return bad("%v", err)
	}
	return Location{S3: &loc}, nil
}

// redact drops user information from a URL for an error message.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = url.User("REDACTED")
		return u.String()
	}
	return s
}

func (l S3) config(c Credentials) s3.Config {
	return s3.Config{
		Endpoint: l.Endpoint, TLS: l.TLS, Bucket: l.Bucket, Prefix: l.Prefix, Region: l.Region,
		AccessKey: c.AccessKey, SecretKey: c.SecretKey,
	}
}

// Credentials are an S3 location's static credentials; both "" =
// anonymous requests.
type Credentials struct {
	AccessKey string
	SecretKey string
}

// CredentialsFromEnv returns the credentials in SPACE_S3_ACCESS_KEY and
// SPACE_S3_SECRET_KEY, or else in AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY. getenv is os.Getenv or a test's.
func CredentialsFromEnv(getenv func(string) string) Credentials {
	if c := (Credentials{getenv("SPACE_S3_ACCESS_KEY"), getenv("SPACE_S3_SECRET_KEY")}); c != (Credentials{}) {
		return c
	}
	return Credentials{getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY")}
}

// Options are what Open needs besides the location.
type Options struct {
	// Credentials are for an S3 location.
	Credentials Credentials
	// CacheDir holds the local read cache of an S3 location's chunks
	// (package chunkcache). Required for an S3 location.
	CacheDir string
	// CacheBytes bounds the cache; 0 = DefaultCacheBytes.
	CacheBytes int64
	// CheckTimeout bounds the request Open makes to an S3 location; 0 =
	// 30 seconds.
	CheckTimeout time.Duration
	// Log receives the cache's write failures; nil = discard.
	Log *slog.Logger
}

// DefaultCacheBytes is the cache bound of Options that set none.
const DefaultCacheBytes = 8 << 30

// Open returns the chunk store at l. For a directory it creates it if
// needed. For an S3 bucket it makes one request (a listing of one key),
// so a wrong endpoint, credentials or bucket fail here with an error that
// says which, and puts a chunk cache in opts.CacheDir in front of it.
func Open(ctx context.Context, l Location, opts Options) (*chunkstore.Store, error) {
	var b chunkstore.Backend
	switch {
	case l.S3 != nil:
		rb, err := openS3(ctx, *l.S3, opts)
		if err != nil {
			return nil, err
		}
		if opts.CacheDir == "" {
			return nil, fmt.Errorf("chunk store %s: cache directory not set: %w", l, errkind.InvalidArgument)
		}
		cb, err := chunkcache.New(ctx, chunkcache.Config{
			Remote: rb, Dir: opts.CacheDir, MaxBytes: cmpOr(opts.CacheBytes, DefaultCacheBytes), Log: opts.Log,
		})
		if err != nil {
			return nil, err
		}
		b = cb
	case l.Dir != "":
		lb, err := local.New(l.Dir)
		if err != nil {
			return nil, err
		}
		b = lb
	default:
		return nil, fmt.Errorf("chunk store location is empty: %w", errkind.InvalidArgument)
	}
	return chunkstore.New(chunkstore.Config{Backend: b})
}

func openS3(ctx context.Context, l S3, opts Options) (*s3.Backend, error) {
	c := opts.Credentials
	if (c.AccessKey == "") != (c.SecretKey == "") {
		return nil, fmt.Errorf("chunk store s3://%s: an access key and a secret key go together (SPACE_S3_ACCESS_KEY, SPACE_S3_SECRET_KEY): %w",
			l.Bucket, errkind.InvalidArgument)
	}
	b, err := s3.New(l.config(c))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cmpOr(opts.CheckTimeout, 30*time.Second))
	defer cancel()
	if err := b.Check(ctx); err != nil {
		return nil, fmt.Errorf("chunk store %s: %s: %w", Location{S3: &l}, hint(err), err)
	}
	return b, nil
}

// hint says in words what a failed Check most likely means.
func hint(err error) string {
	switch {
	case errors.Is(err, errkind.FailedPrecondition):
		return "no such bucket (create it first)"
	case errors.Is(err, errkind.PermissionDenied):
		return "access denied (check the credentials and their rights on the bucket)"
	case errors.Is(err, errkind.Unavailable), errors.Is(err, context.DeadlineExceeded):
		return "server unreachable (check the endpoint and tls)"
	}
	return "bucket check failed"
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
