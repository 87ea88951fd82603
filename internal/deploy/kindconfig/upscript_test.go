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

// TestScriptsParse checks up.sh and down.sh are valid bash (bash -n) and
// keep the habits that make a failing step stop them: an env bash
// shebang, `set -euo pipefail` before any command, no `local x=$(...)`
// (local hides the command's status), no backquotes; and that they are
// executable (make runs them) and run what they are for.
func TestScriptsParse(t *testing.T) {
	for _, tc := range []struct {
		script string
		runs   []string
	}{
		{"up.sh", []string{
			"kind create cluster --config deploy/kind/cluster.yaml",
			"kind load image-archive",
			"--values deploy/kind/values.yaml",
			"make images",
		}},
		{"down.sh", []string{"helm uninstall", "kind delete cluster"}},
	} {
		t.Run(tc.script, func(t *testing.T) {
			checkScript(t, repoPath(t, "deploy", "kind", tc.script), tc.runs)
		})
	}
}

func checkScript(t *testing.T, path string, runs []string) {
	t.Helper()
	name := filepath.Base(path)
	if _, stderr, err := bash(t, "bash -n "+path); err != nil {
		t.Fatalf("bash -n %s: %v\n%s", name, err, stderr)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	lines := strings.Split(string(raw), "\n")
	if got, want := lines[0], "#!/usr/bin/env bash"; got != want {
		t.Errorf("%s line 1 = %q, want %q", name, got, want)
	}
	for _, l := range lines[1:] {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if l != "set -euo pipefail" {
			t.Errorf("%s's first command = %q, want set -euo pipefail", name, l)
		}
		break
	}
	localSubst := regexp.MustCompile(`^\s*local\s+[A-Za-z_][A-Za-z0-9_]*=\$\(`)
	for i, l := range lines {
		if localSubst.MatchString(l) {
			t.Errorf("%s:%d: %q: local hides the status of the command substitution", name, i+1, l)
		}
		if strings.Contains(l, "`") && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			t.Errorf("%s:%d: %q: backquotes; use $(...)", name, i+1, l)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if fi.Mode()&0o111 != 0o111 {
		t.Errorf("%s mode = %v, want executable", name, fi.Mode())
	}
	for _, s := range runs {
		if !strings.Contains(string(raw), s) {
			t.Errorf("%s does not run %q", name, s)
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

// fakeTools writes stand-ins for docker, kind, kubectl, helm and make
// into a directory and returns it: each appends its name and arguments to
// the file log, one call a line; `kind get clusters` prints clusters, and
// `helm status` exits with $HELM_STATUS_RC (default 0: installed).
func fakeTools(t *testing.T, log, clusters string) string {
	t.Helper()
	dir := t.TempDir()
	for _, tool := range []string{"docker", "kind", "kubectl", "helm", "make"} {
		script := "#!/bin/sh\necho \"" + tool + " $*\" >>" + log + "\n"
		switch tool {
		case "kind":
			script += "[ \"$1 $2\" = \"get clusters\" ] && printf '%s' '" + clusters + "'\nexit 0\n"
		case "helm":
			script += "[ \"$1\" = status ] && exit \"${HELM_STATUS_RC:-0}\"\nexit 0\n"
		}
		if err := os.WriteFile(filepath.Join(dir, tool), []byte(script), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return dir
}

// TestUpScriptStepsWithFakeTools runs up.sh's main with fake docker,
// kind, kubectl, helm and make (this machine has no Docker daemon, kind
// or helm) and the host check left out (it needs /dev/kvm), and checks
// the commands it runs, in order: a new cluster is created, an existing
// one reused, and the chart installed with the worker image's tag.
func TestUpScriptStepsWithFakeTools(t *testing.T) {
	for _, tc := range []struct {
		name     string
		clusters string
		create   bool
	}{
		{"new cluster", "other\n", true},
		{"existing cluster", "other\nspace\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			images := filepath.Join(root, "dist", "images")
			if err := os.MkdirAll(images, 0o755); err != nil {
				t.Fatalf("setup: %v", err)
			}
			writeIndex(t, images, builtImages, builtImages[0].Archive, builtImages[1].Archive)
			log := filepath.Join(root, "calls")
			tools := fakeTools(t, log, tc.clusters)

			script := "source " + upScript(t) + " && check_host() { :; } && repo=" + root + " && main"
			stdout, stderr, err := bash(t, "PATH="+tools+":$PATH; "+script)
			if err != nil {
				t.Fatalf("up.sh: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
			}
			raw, err := os.ReadFile(log)
			if err != nil {
				t.Fatalf("read calls: %v", err)
			}
			want := []string{
				"docker info",
				"make images",
				"kind get clusters",
			}
			if tc.create {
				want = append(want, "kind create cluster --config deploy/kind/cluster.yaml --name space")
			}
			want = append(want,
				"kind load image-archive dist/images/"+builtImages[0].Archive+" --name space",
				"kind load image-archive dist/images/"+builtImages[1].Archive+" --name space",
				"kubectl --context kind-space label nodes --overwrite --selector !node-role.kubernetes.io/control-plane space/vm-host=true",
				"helm upgrade --install space deploy/helm/space --kube-context kind-space --namespace space --create-namespace"+
					" --values deploy/kind/values.yaml --set-string image.repository=localhost/space-worker --set-string image.tag=sha-81e78ab2b2f3"+
					" --wait --timeout 30m",
			)
			if diff := cmp.Diff(want, strings.Split(strings.TrimSpace(string(raw)), "\n")); diff != "" {
				t.Errorf("up.sh commands (-want +got):\n%s", diff)
			}
			for _, s := range []string{"port-forward svc/space-server 7070", "exec deploy/space-server -- cat /var/lib/space/admin.key", "bin/space sandbox create"} {
				if !strings.Contains(stdout, s) {
					t.Errorf("up.sh printed no %q:\n%s", s, stdout)
				}
			}
		})
	}
}

// TestUpScriptNamesMissingTool checks a missing tool stops up.sh with its
// name and what to install.
func TestUpScriptNamesMissingTool(t *testing.T) {
	_, stderr, err := bash(t, "source "+upScript(t)+" && need_tool space-no-such-tool 'install it'")
	if err == nil {
		t.Fatalf("need_tool of a missing tool succeeded")
	}
	if want := "kind-up: space-no-such-tool not found on PATH: install it\n"; stderr != want {
		t.Errorf("need_tool stderr = %q, want %q", stderr, want)
	}
}

// TestDownScriptStepsWithFakeTools runs down.sh with fake kind and helm
// (this machine has neither) and checks it uninstalls the release (its
// purge Jobs clean the nodes) before it deletes the cluster, skips what
// is not there, and leaves no cluster it was not asked about.
func TestDownScriptStepsWithFakeTools(t *testing.T) {
	const status = "helm status space --kube-context kind-space --namespace space"
	for _, tc := range []struct {
		name     string
		clusters string
		helmRC   string
		want     []string
	}{
		{"installed", "space\n", "0", []string{
			"kind get clusters", status,
			"helm uninstall space --kube-context kind-space --namespace space --wait --timeout 10m",
			"kind delete cluster --name space",
		}},
		{"not installed", "space\n", "1", []string{"kind get clusters", status, "kind delete cluster --name space"}},
		{"no cluster", "other\n", "0", []string{"kind get clusters"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			log := filepath.Join(root, "calls")
			tools := fakeTools(t, log, tc.clusters)
			down := repoPath(t, "deploy", "kind", "down.sh")
			stdout, stderr, err := bash(t, "PATH="+tools+":$PATH HELM_STATUS_RC="+tc.helmRC+" "+down)
			if err != nil {
				t.Fatalf("down.sh: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
			}
			raw, err := os.ReadFile(log)
			if err != nil {
				t.Fatalf("read calls: %v", err)
			}
			if diff := cmp.Diff(tc.want, strings.Split(strings.TrimSpace(string(raw)), "\n")); diff != "" {
				t.Errorf("down.sh commands (-want +got):\n%s", diff)
			}
		})
	}
}
