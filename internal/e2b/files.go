package e2b

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"space/client"
)

// envd's /files: GET a file's bytes, POST files (multipart, or one
// octet-stream body), both authorized by the access token or by a
// signature the SDK made with it.

// checkSignature checks a signed /files URL: the signature is "v1_" and
// the unpadded base64 of SHA-256("path:operation:user:token[:expiration]"),
// and an expiration (Unix seconds) must not have passed.
func (s *Server) checkSignature(r *http.Request, id string) error {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + s.accessToken(id)
	if exp := q.Get("signature_expiration"); exp != "" {
		t, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return fmt.Errorf("signature_expiration %.20q is not a Unix time", exp)
		}
		if time.Now().Unix() > t {
			return errors.New("signature is already expired") // envd's words, which E2B's tests compare
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return errors.New("the signature does not match")
	}
	return nil
}

// filesError answers a /files request as envd does: JSON {code, message}.
func filesError(w http.ResponseWriter, err error, p string) {
	status := http.StatusInternalServerError
	var ce *client.Error
	switch {
	case client.IsNotFound(err):
		status, err = http.StatusNotFound, fmt.Errorf("path not found: %s", p)
	case client.IsInvalid(err):
		status = http.StatusBadRequest
	case errors.As(err, &ce) && ce.Status != 0:
		status = ce.Status
	}
	var se *statusError
	if errors.As(err, &se) {
		status = se.status
	}
	msg := err.Error()
	if ce != nil && status != http.StatusNotFound {
		msg = ce.Message
	}
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// lazyBody sends the response headers at the first byte of the file, so
// a read that fails before it can still be answered with an error.
type lazyBody struct {
	w       http.ResponseWriter
	name    string
	gz      *gzip.Writer
	started bool
}

func (b *lazyBody) start() {
	if b.started {
		return
	}
	b.started = true
	h := b.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": b.name}))
	if b.gz != nil {
		h.Set("Content-Encoding", "gzip")
	}
	b.w.WriteHeader(http.StatusOK)
}

func (b *lazyBody) Write(p []byte) (int, error) {
	b.start()
	if b.gz != nil {
		return b.gz.Write(p)
	}
	return b.w.Write(p)
}

func acceptsGzip(r *http.Request) bool {
	for part := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		enc, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(enc, "gzip") {
			return true
		}
	}
	return false
}

func (s *Server) filesGet(w http.ResponseWriter, r *http.Request, c *envdCall) {
	p, err := c.absPath(r.Context(), r.URL.Query().Get("path"))
	if err != nil {
		filesError(w, badRequest("%v", err), "")
		return
	}
	body := &lazyBody{w: w, name: path.Base(p)}
	if acceptsGzip(r) {
		body.gz = gzip.NewWriter(w)
	}
	if _, err := c.sandbox.ReadFile(r.Context(), c.id, p, body); err != nil {
		if !body.started {
			if client.IsConflict(err) || client.IsInvalid(err) {
				err = badRequest("path %s is not a file", p)
			}
			filesError(w, err, p)
			return
		}
		// Mid-file: cut the response so the client sees it broken.
		panic(http.ErrAbortHandler)
	}
	body.start()
	if body.gz != nil {
		body.gz.Close()
	}
}

// entry is one element of the reply to POST /files.
type entry struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataPrefix starts the request headers whose values become the
// written files' metadata (extended attributes).
const metadataPrefix = "X-Metadata-"

// metadataKey prefixes E2B's metadata keys in SPACE's: envd keeps key k
// in the extended attribute user.e2b.k, and SPACE's metadata names the
// user.* attributes without their "user.".
const metadataKey = "e2b."

// toSpaceMetadata returns E2B metadata as SPACE's.
func toSpaceMetadata(meta map[string]string) map[string]string {
	if len(meta) == 0 {
		return nil
	}
	out := make(map[string]string, len(meta))
	for k, v := range meta {
		out[metadataKey+k] = v
	}
	return out
}

// fromSpaceMetadata returns the E2B metadata among SPACE's, or nil.
func fromSpaceMetadata(meta map[string]string) map[string]string {
	var out map[string]string
	for k, v := range meta {
		if name, ok := strings.CutPrefix(k, metadataKey); ok && name != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = v
		}
	}
	return out
}

func (s *Server) filesPost(w http.ResponseWriter, r *http.Request, c *envdCall) {
	user, _ := c.userAndHome(r.Context())
	meta := map[string]string{}
	for k, vs := range r.Header {
		if name, ok := strings.CutPrefix(http.CanonicalHeaderKey(k), metadataPrefix); ok && len(vs) > 0 {
			meta[strings.ToLower(name)] = vs[0]
		}
	}
	if len(meta) == 0 {
		meta = nil
	}
	write := func(target string, src io.Reader) (entry, error) {
		p, err := c.absPath(r.Context(), target)
		if err != nil {
			return entry{}, badRequest("%v", err)
		}
		opts := client.WriteOptions{Mkdir: true, Owner: user, Metadata: toSpaceMetadata(meta)}
		if _, err := c.sandbox.WriteFile(r.Context(), c.id, p, src, opts); err != nil {
			return entry{}, err
		}
		return entry{Name: path.Base(p), Type: "file", Path: p, Metadata: meta}, nil
	}
	target := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var body io.Reader = r.Body
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			filesError(w, badRequest("gzip body: %v", err), target)
			return
		}
		defer gz.Close()
		body = gz
	}
	var out []entry
	if ct != "multipart/form-data" {
		if target == "" {
			filesError(w, badRequest("path is required for an octet-stream upload"), "")
			return
		}
		e, err := write(target, body)
		if err != nil {
			filesError(w, err, target)
			return
		}
		writeJSON(w, http.StatusOK, []entry{e})
		return
	}
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			filesError(w, badRequest("multipart body: %v", err), target)
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		// The part's file name is its path when the query names none
		// (several files in one request).
		// (Part.FileName keeps only the base name.)
		dest := target
		if dest == "" {
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			dest = dp["filename"]
		}
		if dest == "" {
			filesError(w, badRequest("a part names no path (filename) and the request has no path parameter"), "")
			return
		}
		e, err := write(dest, part)
		part.Close()
		if err != nil {
			filesError(w, err, dest)
			return
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		filesError(w, badRequest("the multipart body has no part named file"), target)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
