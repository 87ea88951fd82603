package worker

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"

	"space/api"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/httpapi"
)

// handleReadFile answers a file's bytes: all of them, or with a Range
// header one range of them (206). The ETag names the file's size and
// modification time, so If-Range resumes a download only of the same
// content.
func handleReadFile(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	fi, err := a.Stat(r.Context(), path)
	if err != nil {
		return err
	}
	if fi.Type != proto.FileRegular {
		return fmt.Errorf("%s is a %s, not a file: %w", path, fi.Type, errkind.InvalidArgument)
	}
	etag := fileETag(fi)
	h := rw.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Space-File-Mode", fmt.Sprintf("%04o", fi.Mode&0o7777))
	h.Set("X-Space-File-Size", strconv.FormatInt(fi.Size, 10))
	h.Set("Accept-Ranges", "bytes")
	h.Set("ETag", etag)
	args := proto.ReadArgs{Path: path}
	status := http.StatusOK
	if rg := r.Header.Get("Range"); rg != "" && ifRange(r, etag) {
		off, n, ok := parseRange(rg, fi.Size)
		switch {
		case !ok:
			// Several ranges or a form we do not serve: the whole file.
		case n == 0:
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", fi.Size))
			return fmt.Errorf("range %.64q is outside the file's %d bytes: %w", rg, fi.Size, httpapi.ErrRangeNotSatisfiable)
		default:
			args.Offset, args.Length = off, n
			status = http.StatusPartialContent
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, off+n-1, fi.Size))
			h.Set("Content-Length", strconv.FormatInt(n, 10))
		}
	}
	sw := &startedWriter{w: rw, status: status}
	got, err := a.ReadFileRange(r.Context(), args, sw)
	if err == nil && args.Length > 0 && got.Size != args.Length {
		err = fmt.Errorf("%s shrank to %d bytes while read", path, got.Size)
	}
	if err != nil {
		if !sw.started {
			return err
		}
		// Mid-body: cut the response so the client sees a short read.
		panic(http.ErrAbortHandler)
	}
	if !sw.started {
		rw.WriteHeader(status)
	}
	return nil
}

// fileETag is a strong validator of a file's content as far as its size
// and modification time tell.
func fileETag(fi proto.FileInfo) string {
	return fmt.Sprintf(`"%x-%x"`, fi.Size, fi.MtimeNS)
}

// ifRange reports whether a Range header applies: there is no If-Range,
// or it names the current ETag.
func ifRange(r *http.Request, etag string) bool {
	v := r.Header.Get("If-Range")
	return v == "" || v == etag
}

// parseRange reads a single byte range ("bytes=a-b", "bytes=a-",
// "bytes=-n") of a file of size bytes. ok is false for a header this
// serves as a whole-file request (several ranges, another unit, a
// malformed one); n is 0 when no byte of the range is in the file.
func parseRange(h string, size int64) (off, n int64, ok bool) {
	spec, found := strings.CutPrefix(h, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, 0, false
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, 0, false
	}
	if first == "" { // the last n bytes
		k, err := strconv.ParseInt(last, 10, 64)
		if err != nil || k < 0 {
			return 0, 0, false
		}
		k = min(k, size)
		return size - k, k, true
	}
	a, err := strconv.ParseInt(first, 10, 64)
	if err != nil || a < 0 {
		return 0, 0, false
	}
	end := size - 1
	if last != "" {
		b, err := strconv.ParseInt(last, 10, 64)
		if err != nil || b < a {
			return 0, 0, false
		}
		end = min(b, size-1)
	}
	if a >= size {
		return a, 0, true
	}
	return a, end - a + 1, true
}

// startedWriter writes status before the first byte and records that
// it did.
type startedWriter struct {
	w       http.ResponseWriter
	status  int
	started bool
}

func (s *startedWriter) Write(p []byte) (int, error) {
	if !s.started {
		s.started = true
		s.w.WriteHeader(s.status)
	}
	return s.w.Write(p)
}

// maxFileMode is the largest mode bits a file write may set.
const maxFileMode = 0o7777

// writeArgs reads a file write's mode and mkdir parameters and its
// metadata headers.
func writeArgs(r *http.Request, path string) (proto.WriteArgs, error) {
	args := proto.WriteArgs{Path: path, Mode: 0o644}
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > maxFileMode {
			return args, httpapi.Invalid("mode", "want octal permission bits, got %.20q", m)
		}
		args.Mode = uint32(v)
	}
	var err error
	if args.Xattrs, err = metadataHeaders(r.Header); err != nil {
		return args, err
	}
	args.MkdirAll, err = boolParam(r, "mkdir")
	return args, err
}

// metadataHeaders reads the X-Space-Metadata-<key> headers. Header names
// are case-insensitive, so keys are lower case.
func metadataHeaders(h http.Header) (map[string]string, error) {
	var md map[string]string
	for name, vs := range h {
		key, ok := strings.CutPrefix(strings.ToLower(name), strings.ToLower(api.MetadataHeader))
		if !ok {
			continue
		}
		if len(vs) != 1 {
			return nil, httpapi.Invalid(name, "give one value, not %d", len(vs))
		}
		if err := proto.CheckXattr(key, vs[0]); err != nil {
			return nil, httpapi.Invalid(name, "want a key of letters, digits, '.', '_' or '-' (at most %d bytes) and a value of at most %d bytes", proto.MaxXattrKey, proto.MaxXattrValue)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vs[0]
	}
	if len(md) > proto.MaxXattrs {
		return nil, httpapi.Invalid(api.MetadataHeader+"*", "%d metadata headers, want at most %d", len(md), proto.MaxXattrs)
	}
	return md, nil
}

// handleWriteFile replaces a file with the request body, atomically; with
// an upload parameter it takes a part of a resumable upload instead
// (writeUpload).
func handleWriteFile(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	args, err := writeArgs(r, path)
	if err != nil {
		return err
	}
	if owner := r.URL.Query().Get("owner"); owner != "" {
		u, err := lookupUser(r.Context(), a, owner)
		if err != nil {
			return err
		}
		args.UID, args.GID = &u.uid, &u.gid
	}
	if r.URL.Query().Has("upload") {
		return writeUpload(rw, r, a, args)
	}
	res, err := a.WriteFile(r.Context(), args, r.Body)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, api.FileWritten{Path: path, Size: res.Size})
	return nil
}

// uploadRef returns the upload named in the request and the partial file
// beside the target that holds its bytes until it is complete.
func uploadRef(r *http.Request, target string) (id, partial string, err error) {
	id = r.URL.Query().Get("upload")
	if !uploadIDPattern.MatchString(id) {
		return "", "", httpapi.Invalid("upload", "want 8 to 64 letters, digits, - or _, got %.80q", id)
	}
	if target == "/" || strings.HasSuffix(target, "/") {
		return "", "", httpapi.Invalid("path", "want a file path, got %.100q", target)
	}
	dir, base := path.Split(path.Clean(target))
	return id, dir + "." + base + ".space-upload-" + id, nil
}

var uploadIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{8,64}$`)

// writeUpload appends the body to a resumable upload at the offset the
// request names, which must be where the upload stands (else 409: ask GET
// files/upload and go on from there). A body cut short keeps what
// arrived. With final=true the finished file replaces the target
// atomically.
func writeUpload(rw http.ResponseWriter, r *http.Request, a *client.Client, args proto.WriteArgs) error {
	id, partial, err := uploadRef(r, args.Path)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	offset, err := strconv.ParseInt(q.Get("offset"), 10, 64)
	if err != nil || offset < 0 {
		return httpapi.Invalid("offset", "want the upload's byte offset, got %.20q", q.Get("offset"))
	}
	final, err := boolParam(r, "final")
	if err != nil {
		return err
	}
	target := args.Path
	args.Path, args.At = partial, &offset
	res, err := a.WriteFile(r.Context(), args, r.Body)
	if err != nil {
		if errors.Is(err, errkind.NotFound) && offset > 0 {
			return fmt.Errorf("upload %s of %s: none under way (start at offset 0): %w", id, target, errkind.NotFound)
		}
		if errors.Is(err, errkind.FailedPrecondition) {
			if fi, serr := a.StatSettled(r.Context(), partial); serr == nil && fi.Size != offset {
				return fmt.Errorf("upload %s holds %d bytes, not %d: resume from there: %w", id, fi.Size, offset, errkind.Conflict)
			}
			if offset > 0 {
				return fmt.Errorf("upload %s of %s: no such upload under way (start at offset 0): %w", id, target, errkind.NotFound)
			}
		}
		return err
	}
	if final {
		if err := a.Rename(r.Context(), partial, target); err != nil {
			return err
		}
	}
	httpapi.WriteJSON(rw, http.StatusOK, api.FileUpload{Path: target, Upload: id, Offset: res.EndSize, Complete: final})
	return nil
}

// handleUploadState answers where a resumable upload stands.
func handleUploadState(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	target, err := guestPath(r)
	if err != nil {
		return err
	}
	id, partial, err := uploadRef(r, target)
	if err != nil {
		return err
	}
	fi, err := a.StatSettled(r.Context(), partial)
	if errors.Is(err, errkind.NotFound) {
		return fmt.Errorf("upload %s of %s: none under way (it completed, was aborted, or never began): %w", id, target, errkind.NotFound)
	}
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, api.FileUpload{Path: target, Upload: id, Offset: fi.Size})
	return nil
}

// handleUploadAbort removes an unfinished upload's bytes.
func handleUploadAbort(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	target, err := guestPath(r)
	if err != nil {
		return err
	}
	_, partial, err := uploadRef(r, target)
	if err != nil {
		return err
	}
	if err := a.Remove(r.Context(), partial, false); err != nil {
		return err
	}
	rw.WriteHeader(http.StatusNoContent)
	return nil
}

// handleReadTar answers a directory as a tar archive.
func handleReadTar(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	rw.Header().Set("Content-Type", "application/x-tar")
	sw := &startedWriter{w: rw, status: http.StatusOK}
	if _, err := a.TarRead(r.Context(), path, sw); err != nil {
		if !sw.started {
			return err
		}
		panic(http.ErrAbortHandler) // mid-body: the client sees a short read
	}
	if !sw.started {
		rw.WriteHeader(http.StatusOK)
	}
	return nil
}

// handleWriteTar unpacks a tar archive body into a directory. Its entries
// go in only once the whole archive arrived: a cut or malformed body
// changes nothing.
func handleWriteTar(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	mkdir, err := boolParam(r, "mkdir")
	if err != nil {
		return err
	}
	res, err := a.TarWrite(r.Context(), proto.TarWriteArgs{Path: path, MkdirAll: mkdir}, r.Body)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, api.TarWritten{Path: path, Entries: res.Entries, Bytes: res.Bytes})
	return nil
}

func handleRemoveFile(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		return err
	}
	if err := a.Remove(r.Context(), path, recursive); err != nil {
		return err
	}
	rw.WriteHeader(http.StatusNoContent)
	return nil
}

// maxListEntries bounds one directory listing.
const maxListEntries = 10000

func handleListFiles(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	p, err := guestPath(r)
	if err != nil {
		return err
	}
	entries, err := a.List(r.Context(), p, maxListEntries)
	if err != nil {
		return err
	}
	dir := path.Clean(p)
	out := api.FileList{Path: p, Entries: make([]api.FileInfo, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, fileInfo(path.Join(dir, e.Name), e))
	}
	httpapi.WriteJSON(rw, http.StatusOK, out)
	return nil
}
