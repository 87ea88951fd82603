package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"space/api"
)

// FileModeHeader carries a file's permission bits (octal) in the reply of
// GET /v1/sandboxes/{id}/files.
const FileModeHeader = "X-Space-File-Mode"

// ReadFile copies the file at path (absolute) in sandbox id to w and
// returns its permission bits (0 when the server did not send them).
// When the connection breaks mid-file, ReadFile asks for the rest (a
// Range request that holds only while the file is unchanged) up to
// maxResumes times; a file that changed meanwhile, or a reply cut short
// for good, is an error.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (fs.FileMode, error) {
	var (
		got  int64
		etag string
		mode fs.FileMode
	)
	for attempt := 0; ; attempt++ {
		r := request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files"), query: url.Values{"path": {path}},
			accept: "application/octet-stream", want: []int{http.StatusOK}}
		if got > 0 {
			r.header = http.Header{"Range": {fmt.Sprintf("bytes=%d-", got)}, "If-Range": {etag}}
			r.want = []int{http.StatusOK, http.StatusPartialContent, http.StatusRequestedRangeNotSatisfiable}
		}
		resp, err := c.do(ctx, r)
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", path, err)
		}
		if got == 0 {
			etag = resp.Header.Get("ETag")
			if mode, err = modeHeader(resp.Header); err != nil {
				resp.Body.Close()
				return 0, fmt.Errorf("read %s: %w", path, err)
			}
		}
		if got > 0 && resp.StatusCode == http.StatusOK {
			resp.Body.Close()
			return 0, fmt.Errorf("read %s: the file changed while it was read (after %d bytes); read it again", path, got)
		}
		if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
			// The cut came after the last byte: the file was whole.
			resp.Body.Close()
			return mode, nil
		}
		body := &bodyReader{r: resp.Body}
		n, err := io.Copy(w, body)
		resp.Body.Close()
		got += n
		if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
			err = fmt.Errorf("got %d of %d bytes: %w", n, resp.ContentLength, io.ErrUnexpectedEOF)
			body.err = err
		}
		if err == nil {
			return mode, nil
		}
		if body.err == nil || ctx.Err() != nil || etag == "" || attempt == maxResumes {
			return 0, fmt.Errorf("read %s: %w", path, err)
		}
	}
}

// maxResumes is how often one transfer goes on after a broken connection.
const maxResumes = 3

// bodyReader records whether a copy failed reading the reply (worth
// resuming) rather than writing it out (not).
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// modeHeader reads a file's permission bits from FileModeHeader; 0 when
// it is absent.
func modeHeader(h http.Header) (fs.FileMode, error) {
	s := h.Get(FileModeHeader)
	if s == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("bad %s header %q", FileModeHeader, s)
	}
	return fs.FileMode(m) & fs.ModePerm, nil
}

// WriteOptions tunes WriteFile.
type WriteOptions struct {
	Mode  fs.FileMode // permission bits; 0 = the server's default (0644)
	Mkdir bool        // create missing parent directories
	// Owner is the user (a name of the sandbox's /etc/passwd, with its
	// group, or a numeric uid, with the same gid) who owns the file; ""
	// = root.
	Owner string
	// Metadata are set as the file's user extended attributes: keys of
	// letters, digits, '.', '_' and '-' (case-insensitive, stored in
	// lower case), values of at most 4 KiB, at most 32 of them. A file
	// system without them answers failed_precondition.
	Metadata map[string]string
}

// metadataHeader is opts.Metadata as request headers, or nil.
func metadataHeader(opts WriteOptions) http.Header {
	if len(opts.Metadata) == 0 {
		return nil
	}
	h := http.Header{}
	for k, v := range opts.Metadata {
		h.Set(api.MetadataHeader+k, v)
	}
	return h
}

// resumableAbove is the size from which WriteFile uploads a file that it
// can read again (an *os.File of a regular file, a *bytes.Reader, a
// *strings.Reader) in resumable parts of uploadPart bytes.
const (
	resumableAbove = 64 << 20
	uploadPart     = 256 << 20
)

// WriteFile creates or replaces the file at path (absolute) in sandbox id
// with the bytes of r; the file appears whole or not at all. When r is an
// *os.File of a regular file, its size is sent up front. A source larger
// than 64 MiB that can be read again goes as a resumable upload (Upload),
// so a broken connection costs a retry from where it broke, not the
// whole transfer.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, opts WriteOptions) (api.FileWritten, error) {
	if src, size, ok := rereadable(r); ok && size > resumableAbove {
		st, err := c.Upload(ctx, id, path, src, size, opts)
		if err != nil {
			return api.FileWritten{}, err
		}
		r.(io.Seeker).Seek(0, io.SeekEnd) // consumed, as a plain write would
		return api.FileWritten{Path: path, Size: st.Offset}, nil
	}
	q := writeQuery(path, opts)
	req := request{method: http.MethodPut, sandbox: id, path: sandboxPath(id, "/files"), query: q,
		body: r, contentType: "application/octet-stream", header: metadataHeader(opts)}
	if f, ok := r.(*os.File); ok {
		req.contentLength = remaining(f)
	}
	var fw api.FileWritten
	if err := c.call(ctx, req, &fw); err != nil {
		return fw, fmt.Errorf("write %s: %w", path, err)
	}
	return fw, nil
}

func writeQuery(path string, opts WriteOptions) url.Values {
	q := url.Values{"path": {path}}
	if opts.Mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", uint32(opts.Mode.Perm())))
	}
	if opts.Mkdir {
		q.Set("mkdir", "true")
	}
	if opts.Owner != "" {
		q.Set("owner", opts.Owner)
	}
	return q
}

// rereadable returns a section of r from its current offset to its end
// when r can be read again at any offset. r stays where it was.
func rereadable(r io.Reader) (*io.SectionReader, int64, bool) {
	ra, ok := r.(interface {
		io.ReaderAt
		io.Seeker
	})
	if !ok {
		return nil, 0, false
	}
	if f, ok := r.(*os.File); ok {
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			return nil, 0, false
		}
	}
	off, err := ra.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, 0, false
	}
	end, err := ra.Seek(0, io.SeekEnd)
	if _, serr := ra.Seek(off, io.SeekStart); err != nil || serr != nil || end < off {
		return nil, 0, false
	}
	return io.NewSectionReader(ra, off, end-off), end - off, true
}

// Upload writes size bytes of src to the file at path (absolute) in
// sandbox id as a resumable upload: parts of at most 256 MiB, each
// appended to a hidden partial file beside path, the last one moving the
// file into place. A part that fails on the way (a broken connection, an
// unavailable server) is retried from where the sandbox says the upload
// stands, up to maxResumes times in a row. On failure the partial file
// is removed, so path keeps its old content and nothing half-written
// stays.
func (c *Client) Upload(ctx context.Context, id, path string, src io.ReaderAt, size int64, opts WriteOptions) (api.FileUpload, error) {
	var b [12]byte
	rand.Read(b[:])
	upload := hex.EncodeToString(b[:])
	var st api.FileUpload
	fails := 0
	for {
		n := min(size-st.Offset, uploadPart)
		final := st.Offset+n == size
		next, err := c.uploadPart(ctx, id, path, upload, io.NewSectionReader(src, st.Offset, n), st.Offset, n, final, opts)
		if err == nil {
			if final {
				return next, nil
			}
			st, fails = next, 0
			continue
		}
		if fails++; fails > maxResumes || ctx.Err() != nil || !resumable(err) {
			c.abortUpload(id, path, upload)
			return st, fmt.Errorf("write %s: %w", path, err)
		}
		cur, serr := c.UploadState(ctx, id, path, upload)
		switch {
		case serr == nil:
			st = cur
		case final && IsNotFound(serr):
			// The last part may have landed and its reply been lost:
			// the upload is then complete, with the partial file gone.
			if c.hasSize(ctx, id, path, size) {
				return api.FileUpload{Path: path, Upload: upload, Offset: size, Complete: true}, nil
			}
			return st, fmt.Errorf("write %s: %w", path, err)
		case IsNotFound(serr):
			st.Offset = 0 // nothing arrived: start again
		default:
			c.abortUpload(id, path, upload)
			return st, fmt.Errorf("write %s: %w (and asking where the upload stands: %v)", path, err, serr)
		}
	}
}

// uploadPart sends n bytes of body as the part of upload at offset.
func (c *Client) uploadPart(ctx context.Context, id, path, upload string, body io.Reader, offset, n int64, final bool, opts WriteOptions) (api.FileUpload, error) {
	q := writeQuery(path, opts)
	q.Set("upload", upload)
	q.Set("offset", strconv.FormatInt(offset, 10))
	req := request{method: http.MethodPut, sandbox: id, path: sandboxPath(id, "/files"), query: q,
		body: body, contentType: "application/octet-stream", contentLength: n}
	if final {
		q.Set("final", "true")
		req.header = metadataHeader(opts) // on the file that moves into place
	}
	var st api.FileUpload
	err := c.call(ctx, req, &st)
	return st, err
}

// UploadState tells where a resumable upload of path stands: the bytes
// the sandbox holds. An upload that completed, was aborted or never began
// is not found.
func (c *Client) UploadState(ctx context.Context, id, path, upload string) (api.FileUpload, error) {
	var st api.FileUpload
	err := c.call(ctx, request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files/upload"),
		query: url.Values{"path": {path}, "upload": {upload}}}, &st)
	return st, err
}

// AbortUpload removes the bytes of an unfinished upload.
func (c *Client) AbortUpload(ctx context.Context, id, path, upload string) error {
	return c.call(ctx, request{method: http.MethodDelete, sandbox: id, path: sandboxPath(id, "/files/upload"),
		query: url.Values{"path": {path}, "upload": {upload}}, want: []int{http.StatusNoContent}}, nil)
}

// abortUpload removes a failed upload's partial file, as well as it can:
// the caller's context may be the reason it failed.
func (c *Client) abortUpload(id, path, upload string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.AbortUpload(ctx, id, path, upload)
}

// hasSize reports whether the file at path is size bytes long.
func (c *Client) hasSize(ctx context.Context, id, path string, size int64) bool {
	resp, err := c.do(ctx, request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files"),
		query: url.Values{"path": {path}}, header: http.Header{"Range": {"bytes=0-0"}},
		accept: "application/octet-stream", want: []int{http.StatusOK, http.StatusPartialContent, http.StatusRequestedRangeNotSatisfiable}})
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.Header.Get("X-Space-File-Size") == strconv.FormatInt(size, 10)
}

// resumable reports whether a failed upload part is worth resuming: the
// connection broke, or the server was unavailable or saw another offset.
func resumable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return true // transport: the request or its reply was cut
	}
	return e.Status >= 500 || e.Status == http.StatusConflict || e.Status == http.StatusTooManyRequests
}

// ReadTar writes the directory at path in sandbox id to w as a tar
// archive. A reply cut short is an error.
func (c *Client) ReadTar(ctx context.Context, id, path string, w io.Writer) error {
	resp, err := c.do(ctx, request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files/tar"),
		query: url.Values{"path": {path}}, accept: "application/x-tar"})
	if err != nil {
		return fmt.Errorf("tar %s: %w", path, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("tar %s: %w", path, err)
	}
	return nil
}

// WriteTar unpacks the tar archive r into the directory at path in
// sandbox id (created when missing; its parents too with mkdir). Entries
// replace what the directory holds under their names. The archive is
// unpacked beside the directory and moved in only once whole, so a
// failed call changes nothing.
func (c *Client) WriteTar(ctx context.Context, id, path string, r io.Reader, mkdir bool) (api.TarWritten, error) {
	q := url.Values{"path": {path}}
	if mkdir {
		q.Set("mkdir", "true")
	}
	var tw api.TarWritten
	err := c.call(ctx, request{method: http.MethodPut, sandbox: id, path: sandboxPath(id, "/files/tar"), query: q,
		body: r, contentType: "application/x-tar"}, &tw)
	if err != nil {
		return tw, fmt.Errorf("untar into %s: %w", path, err)
	}
	return tw, nil
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

// Stat describes the file at path in sandbox id; a symlink is described
// itself, with its target.
func (c *Client) Stat(ctx context.Context, id, path string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files/stat"),
		query: url.Values{"path": {path}}}, &fi)
	return fi, err
}

// MakeDir makes the directory req.Path in sandbox id (its missing parents
// too unless req.Parents is false; owned by req.Owner) and describes it.
// created is false when it was a directory already; another kind of file
// in its place is a conflict (IsConflict).
func (c *Client) MakeDir(ctx context.Context, id string, req api.MakeDir) (fi api.FileInfo, created bool, err error) {
	path := req.Path
	body, err := jsonBody(req)
	if err != nil {
		return fi, false, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, sandbox: id, path: sandboxPath(id, "/files/mkdir"), body: body,
		want: []int{http.StatusOK, http.StatusCreated}})
	if err != nil {
		return fi, false, fmt.Errorf("mkdir %s: %w", path, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&fi); err != nil {
		return fi, false, fmt.Errorf("mkdir %s: decode reply: %w", path, err)
	}
	return fi, resp.StatusCode == http.StatusCreated, nil
}

// Move renames from to to in sandbox id, making to's missing parents, and
// describes to. A missing from is not found (IsNotFound).
func (c *Client) Move(ctx context.Context, id, from, to string) (api.FileInfo, error) {
	body, err := jsonBody(api.Move{From: from, To: to})
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	if err := c.call(ctx, request{method: http.MethodPost, sandbox: id, path: sandboxPath(id, "/files/move"), body: body}, &fi); err != nil {
		return fi, fmt.Errorf("move %s to %s: %w", from, to, err)
	}
	return fi, nil
}

// ErrWatchCut is returned by FileWatch.Next when the stream ended
// without the watched directory going: the connection broke or the
// server went away. Watch again (and list the directory: changes
// meanwhile are not reported).
var ErrWatchCut = errors.New("file watch stream ended")

// FileWatch is a watch of a directory in a sandbox (WatchFiles). It is
// not safe for concurrent use; Close it when done.
type FileWatch struct {
	ctx  context.Context
	body io.ReadCloser
	dec  *json.Decoder
	err  error // once set, what Next returns
}

// WatchFiles watches the directory at path in sandbox id (with recursive,
// the directories below it too, including ones made later) and returns
// once it is watched: every change after the call is reported by Next.
// A missing path is not found, a file invalid. The watch ends with
// Close or ctx.
func (c *Client) WatchFiles(ctx context.Context, id, path string, recursive bool) (*FileWatch, error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/files/watch"), query: q,
		accept: "application/x-ndjson"})
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w := &FileWatch{ctx: ctx, body: resp.Body, dec: json.NewDecoder(resp.Body)}
	ev, err := w.read()
	if err == nil && ev.Type != api.FileEventStart {
		err = fmt.Errorf("first event is %q, want start", ev.Type)
	}
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	return w, nil
}

// Next returns the next change, waiting for it. After the watched
// directory's own remove or rename event (Name "."), it returns io.EOF.
// An error event comes back as an *Error, a stream cut short as
// ErrWatchCut, and the end of the watch's ctx as its cause.
func (w *FileWatch) Next() (api.FileEvent, error) {
	if w.err != nil {
		return api.FileEvent{}, w.err
	}
	ev, err := w.read()
	switch {
	case err != nil:
		w.err = err
	case ev.Type == api.FileEventError:
		w.err = eventError(ev.Error)
	case ev.Name == "." && (ev.Type == api.FileEventRemove || ev.Type == api.FileEventRename):
		w.err = io.EOF
		return ev, nil
	default:
		return ev, nil
	}
	return api.FileEvent{}, w.err
}

// read decodes the next line.
func (w *FileWatch) read() (api.FileEvent, error) {
	var ev api.FileEvent
	if err := w.dec.Decode(&ev); err != nil {
		switch {
		case w.ctx.Err() != nil:
			return ev, context.Cause(w.ctx)
		case errors.Is(err, io.EOF):
			return ev, ErrWatchCut
		}
		return ev, fmt.Errorf("%w: %w", ErrWatchCut, err)
	}
	return ev, nil
}

// Close ends the watch.
func (w *FileWatch) Close() error {
	if w.err == nil {
		w.err = errors.New("file watch closed")
	}
	return w.body.Close()
}
