package server

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/testenv"
)

// TestFileRangesUploadsTar drives the bulk file routes through the API
// against a real VM: byte ranges, a download resumed after a cut, a
// resumable upload resumed after a cut and one that fails for good, and
// directory trees as tar both ways, including a cut archive.
func TestFileRangesUploadsTar(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	data := make([]byte, 3<<20+7)
	rand.Read(data)
	if _, err := c.WriteFile(ctx, sb.ID, "/root/r", bytes.NewReader(data), client.WriteOptions{}); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	t.Run("Range", func(t *testing.T) { testRangeRequests(t, ts, sb.ID, "/root/r", data) })
	t.Run("DownloadResumes", func(t *testing.T) { testDownloadResumes(t, ts, sb.ID, "/root/r", data) })
	t.Run("UploadResumes", func(t *testing.T) { testUploadResumes(t, ts, sb.ID) })
	t.Run("Tar", func(t *testing.T) { testTarRoutes(t, ts, sb.ID) })
}

// fileRequest sends a GET of the file with extra headers, straight to the
// API, and returns the reply with its body read.
func fileRequest(t *testing.T, ts *testServer, id, path string, h http.Header) (*http.Response, []byte) {
	t.Helper()
	u := ts.url + "/v1/sandboxes/" + id + "/files?path=" + url.QueryEscape(path)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+ts.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", path, err)
	}
	return resp, b
}

func testRangeRequests(t *testing.T, ts *testServer, id, path string, data []byte) {
	size := len(data)
	full, _ := fileRequest(t, ts, id, path, nil)
	etag := full.Header.Get("ETag")
	if full.StatusCode != http.StatusOK || etag == "" || full.Header.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("GET = %d, ETag %q, Accept-Ranges %q; want 200 with both", full.StatusCode, etag, full.Header.Get("Accept-Ranges"))
	}
	tests := []struct {
		name, rng, ifRange string
		status             int
		want               []byte
		contentRange       string
	}{
		{"middle", "bytes=100-199", "", 206, data[100:200], fmt.Sprintf("bytes 100-199/%d", size)},
		{"open end", fmt.Sprintf("bytes=%d-", size-5), "", 206, data[size-5:], fmt.Sprintf("bytes %d-%d/%d", size-5, size-1, size)},
		{"suffix", "bytes=-10", "", 206, data[size-10:], fmt.Sprintf("bytes %d-%d/%d", size-10, size-1, size)},
		{"end past the file", fmt.Sprintf("bytes=%d-%d", size-3, size+100), "", 206, data[size-3:], fmt.Sprintf("bytes %d-%d/%d", size-3, size-1, size)},
		{"matching If-Range", "bytes=0-9", etag, 206, data[:10], fmt.Sprintf("bytes 0-9/%d", size)},
		{"stale If-Range", "bytes=0-9", `"0-0"`, 200, data, ""},
		{"several ranges", "bytes=0-1,5-6", "", 200, data, ""},
		{"outside", fmt.Sprintf("bytes=%d-", size), "", 416, nil, fmt.Sprintf("bytes */%d", size)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Range": {tt.rng}}
			if tt.ifRange != "" {
				h.Set("If-Range", tt.ifRange)
			}
			resp, body := fileRequest(t, ts, id, path, h)
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Range") != tt.contentRange {
				t.Fatalf("Range %s: %d, Content-Range %q; want %d, %q (body %.200s)", tt.rng, resp.StatusCode, resp.Header.Get("Content-Range"), tt.status, tt.contentRange, body)
			}
			if tt.want != nil && !bytes.Equal(body, tt.want) {
				t.Errorf("Range %s: %d bytes, want %d exact", tt.rng, len(body), len(tt.want))
			}
		})
	}
}

// cutTransport breaks exchanges that match: a reply body after cutAfter
// bytes, or a request body after cutAfter bytes, the first cuts times.
type cutTransport struct {
	match    func(*http.Request) bool
	reply    bool // cut the reply, else the request body
	cutAfter int64
	cuts     atomic.Int32
	onCut    func()
	mu       sync.Mutex
	// +checklocks:mu
	requests []string
}

// seen returns the requests that went through.
func (ct *cutTransport) seen() []string {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return append([]string(nil), ct.requests...)
}

func (ct *cutTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ct.mu.Lock()
	ct.requests = append(ct.requests, req.Method+" "+req.URL.Path+" "+req.Header.Get("Range")+" "+req.URL.Query().Get("offset"))
	ct.mu.Unlock()
	cut := ct.match(req) && ct.cuts.Add(-1) >= 0
	if cut && !ct.reply && req.Body != nil {
		req.Body = io.NopCloser(&failingReader{r: req.Body, left: ct.cutAfter, onCut: ct.onCut})
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && cut && ct.reply {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{&failingReader{r: resp.Body, left: ct.cutAfter, onCut: ct.onCut}, resp.Body}
	}
	return resp, err
}

// failingReader reads left bytes of r, then fails.
type failingReader struct {
	r     io.Reader
	left  int64
	onCut func()
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.left <= 0 {
		if f.onCut != nil {
			f.onCut()
			f.onCut = nil
		}
		return 0, errors.New("connection cut by the test")
	}
	n, err := f.r.Read(p[:min(int64(len(p)), f.left)])
	f.left -= int64(n)
	return n, err
}

// cutClient returns a client of ts whose exchanges go through ct.
func cutClient(t *testing.T, ts *testServer, ct *cutTransport) *client.Client {
	c, err := client.New(ts.url, ts.key, client.WithHTTPClient(&http.Client{Transport: ct}))
	if err != nil {
		t.Fatalf("client.New = %v", err)
	}
	return c
}

func isFileGet(req *http.Request) bool {
	return req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/files")
}

func testDownloadResumes(t *testing.T, ts *testServer, id, path string, data []byte) {
	ct := &cutTransport{match: isFileGet, reply: true, cutAfter: 1 << 20}
	ct.cuts.Store(2)
	var got bytes.Buffer
	if _, err := cutClient(t, ts, ct).ReadFile(t.Context(), id, path, &got); err != nil {
		t.Fatalf("ReadFile through two cuts = %v (requests %q)", err, ct.seen())
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("ReadFile through two cuts: %d bytes, want %d exact", got.Len(), len(data))
	}
	// A file that changes between the cut and the resume is not stitched
	// together from two versions.
	changed := bytes.Repeat([]byte("y"), len(data))
	ct = &cutTransport{match: isFileGet, reply: true, cutAfter: 1 << 20, onCut: func() {
		if _, err := ts.client.WriteFile(t.Context(), id, path, bytes.NewReader(changed), client.WriteOptions{}); err != nil {
			t.Errorf("WriteFile(change) = %v", err)
		}
	}}
	ct.cuts.Store(1)
	got.Reset()
	_, err := cutClient(t, ts, ct).ReadFile(t.Context(), id, path, &got)
	if err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("ReadFile of a file changed after a cut = %v, want an error saying it changed", err)
	}
	if _, err := ts.client.WriteFile(t.Context(), id, path, bytes.NewReader(data), client.WriteOptions{}); err != nil {
		t.Fatalf("WriteFile(restore) = %v", err)
	}
}

func testUploadResumes(t *testing.T, ts *testServer, id string) {
	ctx := t.Context()
	const size = 80 << 20 // over the resumable threshold
	data := make([]byte, size)
	rand.Read(data)
	isPart := func(req *http.Request) bool { return req.Method == http.MethodPut && req.URL.Query().Has("upload") }
	ct := &cutTransport{match: isPart, cutAfter: 30 << 20}
	ct.cuts.Store(1)
	fw, err := cutClient(t, ts, ct).WriteFile(ctx, id, "/root/up", bytes.NewReader(data), client.WriteOptions{Mode: 0o640})
	if err != nil || fw.Size != size {
		t.Fatalf("WriteFile(80 MiB, cut at 30) = %+v, %v (requests %q)", fw, err, ct.seen())
	}
	var back bytes.Buffer
	mode, err := ts.client.ReadFile(ctx, id, "/root/up", &back)
	if err != nil || !bytes.Equal(back.Bytes(), data) || mode != 0o640 {
		t.Fatalf("resumed upload: %d bytes, mode %o, %v; want %d exact, mode 0640", back.Len(), mode, err, size)
	}
	resumed := false
	for _, r := range ct.seen() {
		if strings.HasPrefix(r, "GET ") && strings.Contains(r, "/files/upload") {
			resumed = true
		}
	}
	if !resumed {
		t.Errorf("the upload never asked where it stood after the cut: requests %q", ct.seen())
	}

	// A source that breaks for good: the upload gives up, removes its
	// partial file, and the old file stays.
	broken := io.NewSectionReader(&brokenAt{data: data, at: 20 << 20}, 0, size)
	if _, err := ts.client.Upload(ctx, id, "/root/up", broken, size, client.WriteOptions{}); err == nil {
		t.Fatalf("Upload from a broken source = nil error")
	}
	out, _, _ := execOut(t, ts.client, id, sh("ls -a /root | grep -c space-upload; stat -c %s /root/up"))
	if out != fmt.Sprintf("0\n%d\n", size) {
		t.Errorf("after a failed upload: partial files and old size = %q, want none and %d", out, size)
	}

	// A part at the wrong offset is a conflict; an unknown upload is not
	// found.
	put := func(q string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, ts.url+"/v1/sandboxes/"+id+"/files?path=/root/x&"+q, strings.NewReader("abc"))
		req.Header.Set("Authorization", "Bearer "+ts.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("PUT: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := put("upload=abcdefgh&offset=0"); got != http.StatusOK {
		t.Errorf("PUT first part = %d, want 200", got)
	}
	if got := put("upload=abcdefgh&offset=10"); got != http.StatusConflict {
		t.Errorf("PUT part at a wrong offset = %d, want 409", got)
	}
	if got := put("upload=zzzzzzzz&offset=5"); got != http.StatusNotFound {
		t.Errorf("PUT part of an unknown upload = %d, want 404", got)
	}
	if got := put("upload=bad/id&offset=0"); got != http.StatusBadRequest {
		t.Errorf("PUT with a bad upload ID = %d, want 400", got)
	}
	if err := ts.client.AbortUpload(ctx, id, "/root/x", "abcdefgh"); err != nil {
		t.Errorf("AbortUpload = %v", err)
	}
	if _, err := ts.client.UploadState(ctx, id, "/root/x", "abcdefgh"); !client.IsNotFound(err) {
		t.Errorf("UploadState after abort = %v, want not found", err)
	}
}

// brokenAt reads data and fails at every read that reaches at.
type brokenAt struct {
	data []byte
	at   int64
}

func (b *brokenAt) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > b.at {
		return 0, errors.New("disk read error (test)")
	}
	return copy(p, b.data[off:]), nil
}

func testTarRoutes(t *testing.T, ts *testServer, id string) {
	ctx := t.Context()
	c := ts.client
	if _, _, code := execOut(t, c, id, sh("set -e; mkdir -p /root/t/a/b /root/t/empty; echo hi > /root/t/a/hi; "+
		"head -c 5000000 /dev/urandom > /root/t/a/b/big; ln -s a/hi /root/t/link; ln /root/t/a/hi /root/t/hard; chmod 4750 /root/t/a/hi")); code != 0 {
		t.Fatalf("setup: exit %d", code)
	}
	var archive bytes.Buffer
	if err := c.ReadTar(ctx, id, "/root/t", &archive); err != nil {
		t.Fatalf("ReadTar = %v", err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(archive.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("archive: %v", err)
		}
		names = append(names, fmt.Sprintf("%s:%c", h.Name, h.Typeflag))
	}
	for _, want := range []string{"a/:5", "a/b/big:0", "a/hi:0", "empty/:5", "link:2"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("archive entries %q lack %q", names, want)
		}
	}
	tw, err := c.WriteTar(ctx, id, "/root/copy/t", bytes.NewReader(archive.Bytes()), true)
	if err != nil || tw.Bytes != 5000003 {
		t.Fatalf("WriteTar = %+v, %v; want 5000003 file bytes", tw, err)
	}
	same := "cd /root/t && find . -printf '%p %y %m %s %l\\n' | sort | md5sum; cd /root/copy/t && find . -printf '%p %y %m %s %l\\n' | sort | md5sum; " +
		"cmp /root/t/a/b/big /root/copy/t/a/b/big && stat -c %h /root/copy/t/hard"
	out, _, code := execOut(t, c, id, sh(same))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || lines[0] != lines[1] || lines[2] != "2" {
		t.Errorf("the unpacked tree differs from the source: %q, exit %d", out, code)
	}
	// A cut archive and one escaping its directory change nothing.
	cut := io.MultiReader(bytes.NewReader(archive.Bytes()[:archive.Len()/2]), &failingReader{})
	if _, err := c.WriteTar(ctx, id, "/root/cut", cut, false); err == nil {
		t.Errorf("WriteTar(cut archive) = nil error")
	}
	var evil bytes.Buffer
	w := tar.NewWriter(&evil)
	w.WriteHeader(&tar.Header{Name: "fine", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	w.Write([]byte("x"))
	w.WriteHeader(&tar.Header{Name: "../../etc/evil", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	w.Write([]byte("x"))
	w.Close()
	if _, err := c.WriteTar(ctx, id, "/root/copy/t", &evil, false); err == nil {
		t.Errorf("WriteTar(escaping archive) = nil error")
	}
	// The agent removes a cut archive's staging directory once it sees
	// the cut, which may come after the client's error.
	testenv.Eventually(t, 30*time.Second, func() bool {
		out, _, _ = execOut(t, c, id, sh("ls -a /root /root/copy | grep -c space-untar; ls /root/cut /root/copy/t/fine /etc/evil 2>&1 | grep -c 'No such'"))
		return out == "0\n3\n"
	})
}
