package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"space/api"
)

// FileModeHeader carries a file's permission bits (octal) in the reply of
// GET /v1/sandboxes/{id}/files.
const FileModeHeader = "X-Space-File-Mode"

// ReadFile copies the file at path (absolute) in sandbox id to w and
// returns its permission bits (0 when the server did not send them).
// A reply cut short is an error.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (fs.FileMode, error) {
	r := request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files"), query: url.Values{"path": {path}},
		accept: "application/octet-stream"}
	resp, err := c.do(ctx, r)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	defer resp.Body.Close()
	var mode fs.FileMode
	if s := resp.Header.Get(FileModeHeader); s != "" {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil {
			return 0, fmt.Errorf("read %s: bad %s header %q", path, FileModeHeader, s)
		}
		mode = fs.FileMode(m) & fs.ModePerm
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return 0, fmt.Errorf("read %s: got %d of %d bytes: %w", path, n, resp.ContentLength, io.ErrUnexpectedEOF)
	}
	return mode, nil
}

// WriteOptions tunes WriteFile.
type WriteOptions struct {
	Mode  fs.FileMode // permission bits; 0 = the server's default (0644)
	Mkdir bool        // create missing parent directories
}

// WriteFile creates or replaces the file at path (absolute) in sandbox id
// with the bytes of r. When r is an *os.File of a regular file, its size
// is sent up front.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, opts WriteOptions) (api.FileWritten, error) {
	q := url.Values{"path": {path}}
	if opts.Mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", uint32(opts.Mode.Perm())))
	}
	if opts.Mkdir {
		q.Set("mkdir", "true")
	}
	req := request{method: http.MethodPut, sandbox: id, path: sandboxPath(id, "/files"), query: q,
		body: r, contentType: "application/octet-stream"}
	if f, ok := r.(*os.File); ok {
		req.contentLength = remaining(f)
	}
	var fw api.FileWritten
	if err := c.call(ctx, req, &fw); err != nil {
		return fw, fmt.Errorf("write %s: %w", path, err)
	}
	return fw, nil
}

// remaining returns how many bytes are left to read from f, or 0 when
// that is not known (a pipe, a terminal).
func remaining(f *os.File) int64 {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return 0
	}
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil || off > fi.Size() {
		return 0
	}
	return fi.Size() - off
}

// RemoveOptions tunes RemoveFile.
type RemoveOptions struct {
	Recursive bool // remove a directory and everything in it
}

// RemoveFile removes the file or directory at path in sandbox id.
func (c *Client) RemoveFile(ctx context.Context, id, path string, opts RemoveOptions) error {
	q := url.Values{"path": {path}}
	if opts.Recursive {
		q.Set("recursive", "true")
	}
	err := c.call(ctx, request{method: http.MethodDelete, sandbox: id, path: sandboxPath(id, "/files"), query: q,
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
	if err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// ListFiles lists the directory at path in sandbox id.
func (c *Client) ListFiles(ctx context.Context, id, path string) (api.FileList, error) {
	var l api.FileList
	err := c.call(ctx, request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files/list"),
		query: url.Values{"path": {path}}}, &l)
	return l, err
}
