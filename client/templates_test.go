package client

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

// templateServer plays the template routes. A build answers by the
// template name asked for: "fail" fails step 2 with exit code 7, "cut"
// ends the stream early, "bad" is refused before the stream, anything
// else succeeds.
type templateServer struct {
	c *Client

	mu sync.Mutex
	// +checklocks:mu
	query string // of the last build
	// +checklocks:mu
	contentType string
	// +checklocks:mu
	entries []string // of the last build's tar: "name type"
}

func newTemplateServer(t *testing.T) *templateServer {
	t.Helper()
	ts := &templateServer{}
	mux := http.NewServeMux()
	tmpl := api.Template{Name: "py", Version: 2, State: "ready", Snapshot: "sn-1", CreatedAt: t0}
	mux.HandleFunc("POST /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		var entries []string
		tr := tar.NewReader(r.Body)
		for {
			hdr, err := tr.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "not a tar stream: "+err.Error(), "context")
					return
				}
				break
			}
			entries = append(entries, hdr.Name+" "+string(hdr.Typeflag))
		}
		ts.mu.Lock()
		ts.query, ts.contentType, ts.entries = r.URL.RawQuery, r.Header.Get("Content-Type"), entries
		ts.mu.Unlock()
		name := r.URL.Query().Get("name")
		if name == "bad" {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "bad is not allowed", "name")
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range buildEvents {
			enc.Encode(ev)
		}
		switch name {
		case "cut":
		case "fail":
			code := 7
			enc.Encode(api.BuildEvent{Type: "error", Error: &api.ErrorBody{Code: api.CodeFailedPrecondition, Message: "step 2 failed: exit code 7"},
				Report: &api.BuildReport{Steps: 2, Executed: 1, Cached: 1, VMStarted: "restore", FailedStep: 2, ExitCode: &code}})
		default:
			tmpl := tmpl
			tmpl.Report = &api.BuildReport{Steps: 2, Executed: 1, Cached: 1, VMStarted: "restore", Snapshots: 1, DurationMS: 1500}
			enc.Encode(api.BuildEvent{Type: "done", Template: &tmpl, Report: tmpl.Report})
		}
	})
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.TemplateList{Templates: []api.Template{{Name: "default", State: "ready", Default: true}, tmpl}})
	})
	mux.HandleFunc("GET /v1/templates/{ref}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("ref") != "py:2" {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "template "+r.PathValue("ref")+" not found", "")
			return
		}
		writeJSON(w, http.StatusOK, api.TemplateList{Templates: []api.Template{tmpl}})
	})
	mux.HandleFunc("DELETE /v1/templates/{ref}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("ref") == "busy" {
			writeError(w, http.StatusConflict, api.CodeConflict, "template busy:1 is in use by sandbox sb-1", "")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, testKey)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	ts.c = c
	return ts
}

// buildEvents are what every streamed build sends before its last event.
var buildEvents = []api.BuildEvent{
	{Type: "phase", Text: "base image debian bookworm"},
	{Type: "cached", Step: 1, Steps: 2, Text: "copy app /srv/app"},
	{Type: "step", Step: 2, Steps: 2, Text: "run make"},
	{Type: "output", Step: 2, Stream: "stdout", Data: []byte("building\n")},
}

func TestBuildTemplate(t *testing.T) {
	ts := newTemplateServer(t)
	exitCode := 7
	tests := []struct {
		name       string
		wantT      api.Template
		wantReport api.BuildReport
		check      func(error) bool // nil: want no error
		wantErr    string
	}{
		{name: "done", wantT: api.Template{Name: "py", Version: 2, State: "ready", Snapshot: "sn-1", CreatedAt: t0,
			Report: &api.BuildReport{Steps: 2, Executed: 1, Cached: 1, VMStarted: "restore", Snapshots: 1, DurationMS: 1500}},
			wantReport: api.BuildReport{Steps: 2, Executed: 1, Cached: 1, VMStarted: "restore", Snapshots: 1, DurationMS: 1500}},
		{name: "fail", wantReport: api.BuildReport{Steps: 2, Executed: 1, Cached: 1, VMStarted: "restore", FailedStep: 2, ExitCode: &exitCode},
			check: func(err error) bool {
				var e *Error
				return IsConflict(err) && errors.As(err, &e) && e.Message == "step 2 failed: exit code 7" && e.Status == 0
			}, wantErr: "an *Error failed_precondition"},
		{name: "cut", check: func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }, wantErr: "io.ErrUnexpectedEOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []api.BuildEvent
			tmpl, rep, err := ts.c.BuildTemplate(t.Context(), strings.NewReader(""), BuildOptions{File: "specs/a.yaml", Name: tt.name},
				func(ev api.BuildEvent) { got = append(got, ev) })
			switch {
			case tt.check == nil && err != nil:
				t.Fatalf("BuildTemplate = %v, want no error", err)
			case tt.check != nil && !tt.check(err):
				t.Errorf("BuildTemplate = %v, want %s", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantT, tmpl); diff != "" {
				t.Errorf("BuildTemplate template differs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantReport, rep); diff != "" {
				t.Errorf("BuildTemplate report differs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(buildEvents, got); diff != "" {
				t.Errorf("BuildTemplate progress differs (-want +got):\n%s", diff)
			}
		})
	}
	ts.mu.Lock()
	query, ct := ts.query, ts.contentType
	ts.mu.Unlock()
	if want := "file=specs%2Fa.yaml&name=cut"; query != want {
		t.Errorf("BuildTemplate query = %q, want %q", query, want)
	}
	if ct != "application/x-tar" {
		t.Errorf("BuildTemplate Content-Type = %q, want application/x-tar", ct)
	}

	_, _, err := ts.c.BuildTemplate(t.Context(), strings.NewReader(""), BuildOptions{Name: "bad"}, nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Field != "name" {
		t.Errorf("BuildTemplate(refused) = %v, want an *Error with HTTP 400 on field name", err)
	}
}

func TestTemplateRoutes(t *testing.T) {
	ts := newTemplateServer(t)
	ctx := t.Context()
	tmpl := api.Template{Name: "py", Version: 2, State: "ready", Snapshot: "sn-1", CreatedAt: t0}
	l, err := ts.c.Templates(ctx)
	if err != nil {
		t.Fatalf("Templates = %v", err)
	}
	if diff := cmp.Diff([]api.Template{{Name: "default", State: "ready", Default: true}, tmpl}, l); diff != "" {
		t.Errorf("Templates differs (-want +got):\n%s", diff)
	}
	l, err = ts.c.Template(ctx, "py:2")
	if err != nil {
		t.Fatalf("Template(py:2) = %v", err)
	}
	if diff := cmp.Diff([]api.Template{tmpl}, l); diff != "" {
		t.Errorf("Template(py:2) differs (-want +got):\n%s", diff)
	}
	if _, err := ts.c.Template(ctx, "nope"); !IsNotFound(err) {
		t.Errorf("Template(nope) = %v, want not found", err)
	}
	if err := ts.c.DeleteTemplate(ctx, "py:2"); err != nil {
		t.Errorf("DeleteTemplate(py:2) = %v", err)
	}
	if err := ts.c.DeleteTemplate(ctx, "busy"); !IsConflict(err) {
		t.Errorf("DeleteTemplate(busy) = %v, want a conflict", err)
	}
}

// entry is a tar entry as the tests compare them.
type entry struct {
	Name string
	Type byte
	Link string
	Mode int64
	Body string
}

func readTar(t *testing.T, r io.Reader) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read build context: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read build context: %s: %v", hdr.Name, err)
		}
		if hdr.Uid != os.Getuid() || hdr.Gid != os.Getgid() {
			t.Errorf("entry %s is owned by %d:%d, want %d:%d", hdr.Name, hdr.Uid, hdr.Gid, os.Getuid(), os.Getgid())
		}
		out = append(out, entry{hdr.Name, hdr.Typeflag, hdr.Linkname, hdr.Mode, string(b)})
	}
}

// writeTree makes files under dir: a path ending in "/" is a directory,
// "-> target" a symbolic link, else a file with that content; mode 0644
// for files (0755 under bin/), 0755 for directories.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
		var err error
		switch {
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(content, "-> "):
			err = os.Symlink(strings.TrimPrefix(content, "-> "), p)
		default:
			mode := os.FileMode(0o644)
			if strings.Contains(name, "bin/") {
				mode = 0o755
			}
			if err = os.WriteFile(p, []byte(content), mode); err == nil {
				err = os.Chmod(p, mode)
			}
		}
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	// Directories get their mode after their content is made.
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
}

const testSpec = `name: t
base: {dir: rootfs}
steps:
  - copy: {src: app, dst: /srv/app}
  - copy: {src: ./conf/app.conf, dst: /etc/app.conf}
  - copy: {src: lib/x, dst: /x}
  - run: make
`

func TestPackContext(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "ctx")
	writeTree(t, dir, map[string]string{
		"space.yaml":        testSpec,
		"rootfs/bin/sh":     "sh",
		"app/main.py":       "print(1)",
		"app/link":          "-> ../secret",
		"conf/app.conf":     "conf",
		"conf/other":        "not packed",
		"vendor/lib/x/file": "x",
		"vendor/lib/y":      "not packed",
		"secret":            "not packed",
	})
	// An absolute link on the way to a copied path is packed as a
	// relative one.
	if err := os.Symlink(filepath.Join(dir, "vendor/lib"), filepath.Join(dir, "lib")); err != nil {
		t.Fatalf("setup: %v", err)
	}
	rc, opts, err := PackContext(filepath.Join(dir, "space.yaml"))
	if err != nil {
		t.Fatalf("PackContext = %v", err)
	}
	got := readTar(t, rc)
	if err := rc.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if diff := cmp.Diff(BuildOptions{File: "space.yaml"}, opts); diff != "" {
		t.Errorf("PackContext options differ (-want +got):\n%s", diff)
	}
	want := []entry{
		{"space.yaml", tar.TypeReg, "", 0o644, testSpec},
		{"lib", tar.TypeSymlink, "vendor/lib", 0o777, ""},
		{"rootfs/", tar.TypeDir, "", 0o755, ""},
		{"rootfs/bin/", tar.TypeDir, "", 0o755, ""},
		{"rootfs/bin/sh", tar.TypeReg, "", 0o755, "sh"},
		{"app/", tar.TypeDir, "", 0o755, ""},
		{"app/link", tar.TypeSymlink, "../secret", 0o777, ""},
		{"app/main.py", tar.TypeReg, "", 0o644, "print(1)"},
		{"conf/app.conf", tar.TypeReg, "", 0o644, "conf"},
		{"vendor/lib/x/", tar.TypeDir, "", 0o755, ""},
		{"vendor/lib/x/file", tar.TypeReg, "", 0o644, "x"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PackContext entries differ (-want +got):\n%s", diff)
	}
}

func TestPackContextRefuses(t *testing.T) {
	copies := func(src string) string {
		return "base: {oci: ./img.tar}\nsteps:\n  - copy: {src: " + src + ", dst: /app}\n"
	}
	tests := []struct {
		name    string
		files   map[string]string
		wantErr string
	}{
		{"a link out of the context", map[string]string{"space.yaml": copies("app"), "app": "-> ../outside/app"},
			"app leads outside the build context"},
		{"a link on the way out", map[string]string{"space.yaml": copies("lib/app"), "lib": "-> ../outside"},
			"lib/app leads outside the build context"},
		{"a missing path", map[string]string{"space.yaml": copies("conf/missing"), "conf/": ""},
			"no such file or directory"},
		{"a bad spec", map[string]string{"space.yaml": "base: {dir: ../outside}\n"}, "base.dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			top := t.TempDir()
			writeTree(t, top, map[string]string{"outside/app/f": "secret", "ctx/img.tar": "image"})
			dir := filepath.Join(top, "ctx")
			writeTree(t, dir, tt.files)
			rc, _, err := PackContext(filepath.Join(dir, "space.yaml"))
			if err == nil {
				rc.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("PackContext = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestPackContextFailsUpload checks that a file that cannot be packed
// fails the build's upload with the reason.
func TestPackContextFailsUpload(t *testing.T) {
	ts := newTemplateServer(t)
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"space.yaml": "base: {dir: rootfs}\n", "rootfs/a": "a"})
	if err := syscall.Mkfifo(filepath.Join(dir, "rootfs/fifo"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	rc, opts, err := PackContext(filepath.Join(dir, "space.yaml"))
	if err != nil {
		t.Fatalf("PackContext = %v", err)
	}
	defer rc.Close()
	_, _, err = ts.c.BuildTemplate(t.Context(), rc, opts, nil)
	if err == nil || !strings.Contains(err.Error(), "rootfs/fifo: a p--------- file cannot be in a build context") {
		t.Errorf("BuildTemplate(context with a fifo) = %v, want the packing error", err)
	}
}
