package main

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
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

var builtTemplate = api.Template{Name: "py", Version: 3, State: "ready", Snapshot: "sn-1", VCPUs: 1, MemoryMiB: 1024,
	Start: []string{"/bin/sh", "-c", "serve"}, CreatedAt: t0,
	Report: &api.BuildReport{Steps: 2, Executed: 1, Cached: 1, VMStarted: "restore", Snapshots: 1, DurationMS: 1500}}

// templateAPI plays the template routes. A build streams buildEvents,
// then fails step 2 with exit code 7 when the template is named "fail",
// else succeeds with builtTemplate.
type templateAPI struct {
	url string

	mu sync.Mutex
	// +checklocks:mu
	query string // of the last build
	// +checklocks:mu
	entries []string // names in the last build's context
	// +checklocks:mu
	deleted []string
}

var buildEvents = []api.BuildEvent{
	{Type: "phase", Text: "base image debian bookworm"},
	{Type: "cached", Step: 1, Steps: 2, Text: "copy app /srv/app"},
	{Type: "step", Step: 2, Steps: 2, Text: "run make"},
	{Type: "output", Step: 2, Stream: "stdout", Data: []byte("building")},
	{Type: "output", Step: 2, Stream: "stderr", Data: []byte("warning\n")},
	{Type: "phase", Text: "capturing the template"},
}

func newTemplateAPI(t *testing.T) *templateAPI {
	t.Helper()
	f := &templateAPI{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		var names []string
		tr := tar.NewReader(r.Body)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeJSON(w, http.StatusBadRequest, api.Error{Error: api.ErrorBody{Code: api.CodeInvalidArgument, Message: err.Error()}})
				return
			}
			names = append(names, hdr.Name)
		}
		f.mu.Lock()
		f.query, f.entries = r.URL.RawQuery, names
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range buildEvents {
			enc.Encode(ev)
		}
		if r.URL.Query().Get("name") == "fail" {
			code := 7
			enc.Encode(api.BuildEvent{Type: "error", Error: &api.ErrorBody{Code: api.CodeFailedPrecondition, Message: "step 2 failed: exit code 7"},
				Report: &api.BuildReport{Steps: 2, Executed: 0, Cached: 1, VMStarted: "restore", FailedStep: 2, ExitCode: &code}})
			return
		}
		enc.Encode(api.BuildEvent{Type: "done", Template: &builtTemplate, Report: builtTemplate.Report})
	})
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.TemplateList{Templates: []api.Template{
			{Name: "default", State: "ready", Default: true, VCPUs: 1, MemoryMiB: 512}, builtTemplate}})
	})
	mux.HandleFunc("GET /v1/templates/{ref}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.TemplateList{Templates: []api.Template{builtTemplate}})
	})
	mux.HandleFunc("DELETE /v1/templates/{ref}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.deleted = append(f.deleted, r.PathValue("ref"))
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *templateAPI) env() map[string]string {
	return map[string]string{"SPACE_API_URL": f.url, "SPACE_API_KEY": "sk-test"}
}

// specDir makes a build context with a spec that copies app.
func specDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"space.yaml":  "name: py\nbase: {debian: {suite: bookworm}}\nsteps:\n  - copy: {src: app, dst: /srv/app}\n  - run: make\n",
		"app/main.py": "print(1)\n",
		"unrelated":   "not sent\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return dir
}

func TestTemplateBuild(t *testing.T) {
	f := newTemplateAPI(t)
	dir := specDir(t)
	g, stdout, stderr := newTestGlobals(t, f.env())
	if code := execute(t.Context(), g, []string{"template", "build", dir, "--name", "py2"}); code != 0 {
		t.Fatalf("template build exited %d, stderr %q", code, stderr)
	}
	want := "=> base image debian bookworm\n" +
		"[1/2] cached copy app /srv/app\n" +
		"[2/2] run make\n" +
		"building\n" +
		"=> capturing the template\n" +
		"built py:3 in 1.5s: 1 step run, 1 cached; VM restored from the cache\n"
	if diff := cmp.Diff(want, stdout.String()); diff != "" {
		t.Errorf("template build stdout differs (-want +got):\n%s", diff)
	}
	if got, want := stderr.String(), "warning\n"; got != want {
		t.Errorf("template build stderr = %q, want %q", got, want)
	}
	f.mu.Lock()
	query, entries := f.query, f.entries
	f.mu.Unlock()
	if want := "file=space.yaml&name=py2"; query != want {
		t.Errorf("template build query = %q, want %q", query, want)
	}
	if diff := cmp.Diff([]string{"space.yaml", "app/", "app/main.py"}, entries); diff != "" {
		t.Errorf("template build context differs (-want +got):\n%s", diff)
	}
}

func TestTemplateBuildFails(t *testing.T) {
	f := newTemplateAPI(t)
	dir := specDir(t)
	g, _, stderr := newTestGlobals(t, f.env())
	if code := execute(t.Context(), g, []string{"template", "build", filepath.Join(dir, "space.yaml"), "--name", "fail"}); code != exitFailure {
		t.Errorf("failed template build exited %d, want %d", code, exitFailure)
	}
	want := "warning\n" +
		"failed step [2/2] run make: exit code 7\n" +
		"space: build template: step 2 failed: exit code 7 (failed_precondition)\n"
	if diff := cmp.Diff(want, stderr.String()); diff != "" {
		t.Errorf("failed template build stderr differs (-want +got):\n%s", diff)
	}
}

func TestTemplateBuildJSON(t *testing.T) {
	f := newTemplateAPI(t)
	dir := specDir(t)
	for _, name := range []string{"py", "fail"} {
		t.Run(name, func(t *testing.T) {
			g, stdout, _ := newTestGlobals(t, f.env())
			execute(t.Context(), g, []string{"template", "build", dir, "-o", "json", "--name", name})
			lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
			if len(lines) != len(buildEvents)+1 {
				t.Fatalf("template build -o json printed %d lines, want %d: %q", len(lines), len(buildEvents)+1, stdout)
			}
			var got []api.BuildEvent
			for _, l := range lines[:len(buildEvents)] {
				var ev api.BuildEvent
				if err := json.Unmarshal([]byte(l), &ev); err != nil {
					t.Fatalf("line %q: %v", l, err)
				}
				got = append(got, ev)
			}
			if diff := cmp.Diff(buildEvents, got); diff != "" {
				t.Errorf("template build -o json events differ (-want +got):\n%s", diff)
			}
			last := []byte(lines[len(lines)-1])
			if name == "fail" {
				var ev api.BuildEvent
				if err := json.Unmarshal(last, &ev); err != nil || ev.Type != "error" || ev.Report == nil || ev.Report.FailedStep != 2 {
					t.Errorf("last line %q (%v), want an error event for step 2", last, err)
				}
				return
			}
			var tmpl api.Template
			if err := json.Unmarshal(last, &tmpl); err != nil {
				t.Fatalf("last line %q: %v", last, err)
			}
			if diff := cmp.Diff(builtTemplate, tmpl); diff != "" {
				t.Errorf("template build -o json template differs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTemplateVerbs(t *testing.T) {
	f := newTemplateAPI(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"template", "ls"}, "NAME     VERSION  STATE  DEFAULT  VCPUS  MEMORY   CREATED\n" +
			"default           ready  yes      1      512MiB   \n" +
			"py       3        ready           1      1024MiB  1m ago\n"},
		{[]string{"template", "get", "py:3"}, "name      py\n" +
			"version   3\n" +
			"state     ready\n" +
			"snapshot  sn-1\n" +
			"vcpus     1\n" +
			"memory    1024 MiB\n" +
			"start     /bin/sh -c serve\n" +
			"build     1.5s: 1 step run, 1 cached; VM restored from the cache\n" +
			"created   1m ago\n"},
		{[]string{"template", "rm", "py:3", "old"}, ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:2], " "), func(t *testing.T) {
			g, stdout, _ := newTestGlobals(t, f.env())
			g.now = func() time.Time { return t0.Add(time.Minute) }
			if _, err := run(t.Context(), g, tt.args); err != nil {
				t.Fatalf("run(%q) = %v", tt.args, err)
			}
			if diff := cmp.Diff(tt.want, stdout.String()); diff != "" {
				t.Errorf("run(%q) output differs (-want +got):\n%s", tt.args, diff)
			}
		})
	}
	f.mu.Lock()
	deleted := f.deleted
	f.mu.Unlock()
	if diff := cmp.Diff([]string{"py:3", "old"}, deleted); diff != "" {
		t.Errorf("template rm deleted differs (-want +got):\n%s", diff)
	}

	g, stdout, _ := newTestGlobals(t, f.env())
	if _, err := run(t.Context(), g, []string{"template", "ls", "-o", "json"}); err != nil {
		t.Fatalf("run(template ls -o json) = %v", err)
	}
	var l api.TemplateList
	if err := json.Unmarshal(stdout.Bytes(), &l); err != nil || len(l.Templates) != 2 {
		t.Errorf("template ls -o json printed %q (%v), want a list of 2", stdout, err)
	}
}

func TestTemplateUsage(t *testing.T) {
	for _, args := range [][]string{
		{"template"},
		{"template", "bogus"},
		{"template", "build"},
		{"template", "build", "a.yaml", "b.yaml"},
		{"template", "build", "a.yaml", "-o", "yaml"},
		{"template", "get"},
		{"template", "rm"},
	} {
		g, _, _ := newTestGlobals(t, nil)
		var ue usageError
		if _, err := run(t.Context(), g, args); !errors.As(err, &ue) {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
	}
	for _, args := range [][]string{{"template", "--help"}, {"template", "build", "--help"}} {
		g, stdout, _ := newTestGlobals(t, nil)
		if _, err := run(t.Context(), g, args); err != nil || !strings.Contains(stdout.String(), "Usage:") {
			t.Errorf("run(%q) = %v, printed %q; want a usage text", args, err, stdout)
		}
	}
	g, stdout, _ := newTestGlobals(t, nil)
	if _, err := run(t.Context(), g, []string{"sandbox", "create", "--help"}); err != nil ||
		!strings.Contains(stdout.String(), `"name" (its latest ready version) or "name:version"`) {
		t.Errorf("sandbox create --help = %v, printed %q; want --template to take name or name:version", err, stdout)
	}
}
