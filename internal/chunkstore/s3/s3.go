// Package s3 is a chunkstore.Backend on an S3-compatible object store
// (AWS S3, MinIO, SeaweedFS, ...), through minio-go.
//
// Objects live in one existing bucket, under an optional key prefix, so
// several stores can share a bucket. S3 PUTs are atomic and, on current
// S3 and the compatible servers we test, reads and listings are strongly
// consistent, as chunkstore.Backend requires.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"space/internal/chunkstore"
	"space/internal/errkind"
)

var _ chunkstore.Backend = (*Backend)(nil)

// Config says where the objects go.
type Config struct {
	// Endpoint is the server's host[:port], without a scheme. Required.
	Endpoint string
	// TLS selects https (else http).
	TLS bool
	// Bucket is the bucket, which must exist. Required.
	Bucket string
	// Prefix is prepended, with a '/', to every key, e.g. "space/prod";
	// "" = the bucket's root.
	Prefix string
	// AccessKey and SecretKey are static credentials; both "" =
	// anonymous requests.
	AccessKey string
	SecretKey string
	// Region is the bucket's region; "" = ask the server.
	Region string
	// Transport carries the requests; nil = minio-go's default.
	Transport http.RoundTripper
}

// Backend stores objects in an S3 bucket. It is safe for concurrent use.
type Backend struct {
	c      *minio.Client
	bucket string
	prefix string // "" or ending in '/'
}

// New returns a Backend for cfg. It does no I/O: a wrong endpoint,
// credentials or bucket show up as errors of the first request (call
// Check to find out at once).
func New(cfg Config) (*Backend, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, fmt.Errorf("s3 chunk backend: endpoint and bucket are required: %w", errkind.InvalidArgument)
	}
	if (cfg.AccessKey == "") != (cfg.SecretKey == "") {
		return nil, fmt.Errorf("s3 chunk backend: access key and secret key go together: %w", errkind.InvalidArgument)
	}
	if err := s3utils.CheckValidBucketName(cfg.Bucket); err != nil {
		return nil, fmt.Errorf("s3 chunk backend: %v: %w", err, errkind.InvalidArgument)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		if err := chunkstore.CheckKey(prefix); err != nil {
			return nil, fmt.Errorf("s3 chunk backend: prefix: %w", err)
		}
		prefix += "/"
	}
	opts := &minio.Options{Secure: cfg.TLS, Region: cfg.Region, Transport: cfg.Transport}
	if cfg.AccessKey != "" {
		opts.Creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	}
	c, err := minio.New(cfg.Endpoint, opts)
	if err != nil {
		return nil, fmt.Errorf("s3 chunk backend: %v: %w", err, errkind.InvalidArgument)
	}
	return &Backend{c: c, bucket: cfg.Bucket, prefix: prefix}, nil
}

func (b *Backend) name(key string) (string, error) {
	if err := chunkstore.CheckKey(key); err != nil {
		return "", err
	}
	return b.prefix + key, nil
}

// Put implements chunkstore.ObjectWriter.
func (b *Backend) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	name, err := b.name(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("s3 put %s: negative size: %w", key, errkind.InvalidArgument)
	}
	if rs, ok := r.(io.ReadSeeker); ok {
		// Check the length up front and keep the seeker, so minio-go can
		// hash the body without copying it.
		cur, err := rs.Seek(0, io.SeekCurrent)
		if err != nil {
			return fmt.Errorf("s3 put %s: %w", key, err)
		}
		end, err := rs.Seek(0, io.SeekEnd)
		if err != nil {
			return fmt.Errorf("s3 put %s: %w", key, err)
		}
		if _, err := rs.Seek(cur, io.SeekStart); err != nil {
			return fmt.Errorf("s3 put %s: %w", key, err)
		}
		if end-cur != size {
			return fmt.Errorf("s3 put %s: reader has %d bytes, want %d: %w", key, end-cur, size, errkind.InvalidArgument)
		}
	} else {
		r = &exactReader{r: r, left: size}
	}
	info, err := b.c.PutObject(ctx, b.bucket, name, r, size, minio.PutObjectOptions{
		ContentType:      "application/octet-stream",
		DisableMultipart: size <= 64<<20,
	})
	if err != nil {
		return wrap("s3 put", key, err)
	}
	if info.Size != size {
		return fmt.Errorf("s3 put %s: server stored %d bytes, want %d", key, info.Size, size)
	}
	return nil
}

// Get implements chunkstore.ObjectReader.
func (b *Backend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	name, err := b.name(key)
	if err != nil {
		return nil, err
	}
	obj, err := b.c.GetObject(ctx, b.bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return nil, wrap("s3 get", key, err)
	}
	// GetObject is lazy; Stat sends the request, so a missing object is
	// reported here rather than by the first Read.
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		return nil, wrap("s3 get", key, err)
	}
	return obj, nil
}

// Stat implements chunkstore.ObjectReader.
func (b *Backend) Stat(ctx context.Context, key string) (chunkstore.ObjectInfo, error) {
	name, err := b.name(key)
	if err != nil {
		return chunkstore.ObjectInfo{}, err
	}
	o, err := b.c.StatObject(ctx, b.bucket, name, minio.StatObjectOptions{})
	if err != nil {
		return chunkstore.ObjectInfo{}, wrap("s3 stat", key, err)
	}
	return chunkstore.ObjectInfo{Key: key, Size: o.Size, ModTime: o.LastModified}, nil
}

// Delete implements chunkstore.ObjectWriter.
func (b *Backend) Delete(ctx context.Context, key string) error {
	name, err := b.name(key)
	if err != nil {
		return err
	}
	if err := b.c.RemoveObject(ctx, b.bucket, name, minio.RemoveObjectOptions{}); err != nil {
		if errors.Is(kind(err), errkind.NotFound) {
			return nil
		}
		return wrap("s3 delete", key, err)
	}
	return nil
}

// List implements chunkstore.ObjectLister.
func (b *Backend) List(ctx context.Context, prefix string, fn func(chunkstore.ObjectInfo) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops minio-go's listing goroutine if fn fails
	for o := range b.c.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: b.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return wrap("s3 list", prefix, o.Err)
		}
		key := strings.TrimPrefix(o.Key, b.prefix)
		if chunkstore.CheckKey(key) != nil {
			continue // not one of ours
		}
		if err := fn(chunkstore.ObjectInfo{Key: key, Size: o.Size, ModTime: o.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Check makes one request, a listing of at most one key under the
// prefix, so that a wrong endpoint, credentials or bucket fail now rather
// than the first snapshot. A missing bucket is errkind.FailedPrecondition;
// refused credentials, errkind.PermissionDenied; an unreachable server,
// errkind.Unavailable (or ctx's error once it ends: minio-go retries).
func (b *Backend) Check(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops minio-go's listing after the first page
	for o := range b.c.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: b.prefix, Recursive: true, MaxKeys: 1}) {
		if o.Err != nil {
			return wrap("s3 check bucket", b.bucket, o.Err)
		}
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("s3 check bucket %s: %w", b.bucket, err)
	}
	return nil
}

// wrap adds op and key to err and the error kind it maps to.
func wrap(op, key string, err error) error {
	if k := kind(err); k != nil {
		return fmt.Errorf("%s %s: %w", op, key, &kindError{err: err, kind: k})
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

// kind maps an S3 or transport error to an errkind, or nil.
func kind(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil // the caller's own doing; keep the ctx error alone
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		switch {
		case resp.Code == "NoSuchKey" || resp.Code == "NotFound":
			return errkind.NotFound
		case resp.Code == "NoSuchBucket":
			return errkind.FailedPrecondition
		case resp.StatusCode == http.StatusNotFound:
			return errkind.NotFound
		case resp.StatusCode == http.StatusForbidden || resp.Code == "AccessDenied" ||
			resp.Code == "InvalidAccessKeyId" || resp.Code == "SignatureDoesNotMatch":
			return errkind.PermissionDenied
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
			return errkind.Unavailable
		}
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return errkind.Unavailable
	}
	return nil
}

// kindError is an S3 error that also wraps the errkind it maps to.
type kindError struct {
	err  error
	kind error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.err, e.kind} }

// exactReader yields r's first left bytes and fails if r has more or fewer.
type exactReader struct {
	r    io.Reader
	left int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if e.left > 0 {
		if err == io.EOF {
			return n, fmt.Errorf("reader ended %d bytes short: %w", e.left, io.ErrUnexpectedEOF)
		}
		return n, err
	}
	// The last bytes: make sure nothing follows before handing them over.
	var one [1]byte
	if m, _ := io.ReadFull(e.r, one[:]); m > 0 {
		return 0, fmt.Errorf("reader has more bytes than the size given: %w", errkind.InvalidArgument)
	}
	return n, nil
}
