package kindconfig

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/hostimage"
)

// upScript is deploy/kind/up.sh.
func upScript(t *testing.T) string {
	t.Helper()
	return repoPath(t, "deploy", "kind", "up.sh")
}

// bash runs script with bash, in a fresh environment but PATH.
func bash(t *testing.T, script string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), "bash", "-c", script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// TestUpScriptParses checks up.sh is valid bash (bash -n) and keeps the
// habits that make a failing step stop it: an env bash shebang, `set -euo
// pipefail` before any command, no `local x=$(...)` (local hides the
// command's status), no backquotes, and it is executable.
func TestUpScriptParses(t *testing.T) {
	path := upScript(t)
	if _, stderr, err := bash(t, "bash -n "+path); err != nil {
		t.Fatalf("bash -n up.sh: %v\n%s", err, stderr)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	lines := strings.Split(string(raw), "\n")
	if got, want := lines[0], "#!/usr/bin/env bash"; got != want {
		t.Errorf("up.sh line 1 = %q, want %q", got, want)
	}
	for _, l := range lines[1:] {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if l != "set -euo pipefail" {
			t.Errorf("up.sh's first command = %q, want set -euo pipefail", l)
		}
		break
	}
	localSubst := regexp.MustCompile(`^\s*local\s+[A-Za-z_][A-Za-z0-9_]*=\$\(`)
	for i, l := range lines {
		if localSubst.MatchString(l) {
			t.Errorf("up.sh:%d: %q: local hides the status of the command substitution", i+1, l)
		}
		if strings.Contains(l, "`") && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			t.Errorf("up.sh:%d: %q: backquotes; use $(...)", i+1, l)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if fi.Mode()&0o111 != 0o111 {
		t.Errorf("up.sh mode = %v, want executable (make kind-up runs it)", fi.Mode())
	}
	for _, s := range []string{
		"kind create cluster --config deploy/kind/cluster.yaml",
		"kind load image-archive",
		"--values deploy/kind/values.yaml",
		"make images",
	} {
		if !strings.Contains(string(raw), s) {
			t.Errorf("up.sh does not run %q", s)
		}
	}
}

// writeIndex writes dir/images.json as space-images writes it (indented
// JSON of []hostimage.Image), with empty archives for names in present.
func writeIndex(t *testing.T, dir string, images []hostimage.Image, present ...string) {
	t.Helper()
	b, err := json.MarshalIndent(images, "", "  ")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, hostimage.IndexFile), append(b, '\n'), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, p := range present {
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
}

// builtImages are the two images of `make images`, as hostimage names them.
var builtImages = []hostimage.Image{
	{Name: "space-controlplane", Tag: "sha-336d3eedceb1", Reference: hostimage.DefaultRepository + "space-controlplane:sha-336d3eedceb1",
		Digest: "sha256:336d3eedceb1", Archive: "space-controlplane-sha-336d3eedceb1.tar", Size: 10, Version: "0.1.0"},
	{Name: "space-worker", Tag: "sha-81e78ab2b2f3", Reference: hostimage.DefaultRepository + "space-worker:sha-81e78ab2b2f3",
		Digest: "sha256:81e78ab2b2f3", Archive: "space-worker-sha-81e78ab2b2f3.tar", Size: 20, Version: "0.1.0", Revision: "abc"},
}

// TestUpScriptReadsIndex checks up.sh's worker_image and archives
// functions read the image and the archives out of images.json, and fail
// with what to do when it or an archive is missing.
func TestUpScriptReadsIndex(t *testing.T) {
	call := func(dir, fn string) (string, string, error) {
		return bash(t, "source "+upScript(t)+" && "+fn+" "+dir)
	}

	t.Run("both images", func(t *testing.T) {
		dir := t.TempDir()
		writeIndex(t, dir, builtImages, builtImages[0].Archive, builtImages[1].Archive)
		out, stderr, err := call(dir, "worker_image")
		if err != nil {
			t.Fatalf("worker_image: %v\n%s", err, stderr)
		}
		if got, want := out, "localhost/space-worker sha-81e78ab2b2f3\n"; got != want {
			t.Errorf("worker_image = %q, want %q", got, want)
		}
		out, stderr, err = call(dir, "archives")
		if err != nil {
			t.Fatalf("archives: %v\n%s", err, stderr)
		}
		want := []string{filepath.Join(dir, builtImages[0].Archive), filepath.Join(dir, builtImages[1].Archive)}
		if diff := cmp.Diff(want, strings.Fields(out)); diff != "" {
			t.Errorf("archives (-want +got):\n%s", diff)
		}
	})

	for _, tc := range []struct {
		name    string
		images  []hostimage.Image
		present []string
		fn      string
		want    string
	}{
		{"no index", nil, nil, "worker_image", "images.json not found: run make images"},
		{"no index for archives", nil, nil, "archives", "images.json not found: run make images"},
		{"no worker image", builtImages[:1], []string{builtImages[0].Archive}, "worker_image", "names no single space-worker image"},
		{"archive missing", builtImages, []string{builtImages[0].Archive}, "archives", builtImages[1].Archive + " (in "},
		{"no archives", []hostimage.Image{}, nil, "archives", "names no image archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.images != nil {
				writeIndex(t, dir, tc.images, tc.present...)
			}
			// Command substitution, as main calls them: the failure must
			// reach the caller.
			_, stderr, err := bash(t, "source "+upScript(t)+" && x=$("+tc.fn+" "+dir+") && echo \"$x\"")
			if err == nil {
				t.Fatalf("%s with %s: succeeded, want a failure", tc.fn, tc.name)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("%s stderr = %q, want it to contain %q", tc.fn, stderr, tc.want)
			}
		})
	}
}
