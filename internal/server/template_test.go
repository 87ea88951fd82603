package server

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/apt"
	"space/internal/cachedir"
	"space/internal/egress/egresstest"
	"space/internal/templatebuild"
	"space/internal/testenv"
)

// buildTplsrv compiles testdata/tplsrv, a static program that serves
// files and stands in for a shell in the test image, into dir.
func buildTplsrv(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "tplsrv")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./testdata/tplsrv")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("setup: build tplsrv: %v\n%s", err, b)
	}
	return out
}

// writeTestImage writes testImage as a docker-archive tarball.
func writeTestImage(t testing.TB, prog, dst string) {
	t.Helper()
	ref, err := name.ParseReference("space.test/tplsrv:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(dst, ref, testImage(t, prog, "")); err != nil {
		t.Fatal(err)
	}
}

// testImage is an image whose one layer holds the program at /bin/tplsrv
// and /srv (holding a file "marker" if marker is not ""), and whose
// config sets an environment variable, /srv as working directory and a
// command that serves /srv on port 8080.
func testImage(t testing.TB, prog, marker string) v1.Image {
	t.Helper()
	bin, err := os.ReadFile(prog)
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	files := map[string][]byte{"bin/tplsrv": bin}
	hdrs := []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "srv/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/tplsrv", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
	}
	if marker != "" {
		files["srv/marker"] = []byte(marker)
		hdrs = append(hdrs, &tar.Header{Name: "srv/marker", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(marker))})
	}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(files[h.Name])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{
		Env:        []string{"PATH=/bin", "GREETING=hello from the image"},
		WorkingDir: "/srv",
		Cmd:        []string{"/bin/tplsrv", "serve", ":8080", "/srv"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// tarDir writes a tar stream of the tree at dir.
func tarDir(t testing.TB, dir string) io.Reader {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
		}
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return &b
}

// build builds the template in the context dir and logs its progress.
func build(t testing.TB, c *client.Client, dir string) (api.Template, api.BuildReport, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	tpl, rep, err := c.BuildTemplate(ctx, tarDir(t, dir), client.BuildOptions{File: "space.yaml"}, func(ev api.BuildEvent) {
		switch ev.Type {
		case "output":
			t.Logf("  | %s", strings.TrimRight(string(ev.Data), "\n"))
		default:
			t.Logf("build: %s %d/%d %s", ev.Type, ev.Step, ev.Steps, ev.Text)
		}
	})
	t.Logf("build took %s: %+v", time.Since(t0).Round(time.Millisecond), rep)
	return tpl, rep, err
}

const templateSpec = `name: web
base:
  oci: ./image.tar
steps:
  - copy: {src: site, dst: /srv/site}
  - run: ["/bin/tplsrv", "write", "/srv/site/built.txt", "STEP2"]
  - env: {MODE: test}
  - user: "1000"
ready:
  tcp: 8080
  timeout: 2m
resources:
  memory_mib: 256
`

// TestTemplateFromOCI builds a template from an OCI tarball made here: a
// copy step, a run step and an env step over the image's config, whose
// command (an HTTP server) is left running and captured warm. A sandbox of
// the template serves the copied and the built files the moment its create
// returns. Building it again executes nothing and starts no VM; changing
// the run step reuses the copy step; a failing step leaves the previous
// version in service; a template in use cannot be deleted.
func TestTemplateFromOCI(t *testing.T) {
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()

	dir := t.TempDir()
	writeTestImage(t, buildTplsrv(t, t.TempDir()), filepath.Join(dir, "image.tar"))
	os.MkdirAll(filepath.Join(dir, "site"), 0o755)
	os.WriteFile(filepath.Join(dir, "site", "index.txt"), []byte("COPIED"), 0o644)
	spec := filepath.Join(dir, "space.yaml")
	os.WriteFile(spec, []byte(templateSpec), 0o644)

	tpl, rep, err := build(t, c, dir)
	if err != nil {
		t.Fatalf("first build: %v", err)
	}
	if tpl.Name != "web" || tpl.Version != 1 || tpl.State != "ready" || rep.Executed != 4 || rep.Cached != 0 || rep.VMStarted != "boot" {
		t.Fatalf("first build: template %+v, report %+v", tpl, rep)
	}
	if tpl.Workdir != "/srv" || tpl.Env["GREETING"] != "hello from the image" || tpl.Env["MODE"] != "test" ||
		strings.Join(tpl.Start, " ") != "/bin/tplsrv serve :8080 /srv" {
		t.Errorf("template does not carry the image config and steps: %+v", tpl)
	}

	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{Template: "web"})
	if err != nil {
		t.Fatalf("create from template: %v", err)
	}
	if sb.Template != "web:1" {
		t.Errorf("sandbox template = %q, want web:1", sb.Template)
	}
	// Serving already: no wait, no retry.
	for path, want := range map[string]string{"site/index.txt": "COPIED", "site/built.txt": "STEP2"} {
		out, errOut, code := execOut(t, c, sb.ID, api.Exec{Command: []string{"/bin/tplsrv", "get", "http://127.0.0.1:8080/" + path}})
		if code != 0 || out != want {
			t.Errorf("get %s in the new sandbox: %q (stderr %q, exit %d), want %q", path, out, errOut, code, want)
		}
	}
	if out, _, _ := execOut(t, c, sb.ID, api.Exec{Command: []string{"/bin/tplsrv", "pwd"}}); out != "/srv" {
		t.Errorf("exec runs in %q, want the template's workdir /srv", out)
	}
	if out, _, _ := execOut(t, c, sb.ID, api.Exec{Command: []string{"/bin/tplsrv", "env", "MODE"}}); out != "test" {
		t.Errorf("MODE = %q in the sandbox, want test", out)
	}
	if out, _, _ := execOut(t, c, sb.ID, api.Exec{Command: []string{"/bin/tplsrv", "uid"}}); out != "1000" {
		t.Errorf("exec runs as uid %q, want the template's user 1000", out)
	}

	// The same spec again: everything cached.
	tpl2, rep, err := build(t, c, dir)
	if err != nil {
		t.Fatalf("second build: %v", err)
	}
	if rep.Executed != 0 || rep.Cached != 4 || rep.VMStarted != "" || rep.Snapshots != 0 || tpl2.Snapshot != tpl.Snapshot {
		t.Errorf("second build was not a cache hit: template %+v, report %+v", tpl2, rep)
	}

	// Step 2 changed: step 1 comes from the cache.
	os.WriteFile(spec, []byte(strings.Replace(templateSpec, "STEP2", "STEP2b", 1)), 0o644)
	tpl3, rep, err := build(t, c, dir)
	if err != nil {
		t.Fatalf("third build: %v", err)
	}
	if rep.Cached != 1 || rep.Executed != 3 || rep.VMStarted != "restore" || tpl3.Version != 3 {
		t.Errorf("third build did not reuse step 1: template %+v, report %+v", tpl3, rep)
	}

	// A failing step: the build stops with its exit code, web:3 stays.
	os.WriteFile(spec, []byte(strings.Replace(templateSpec, `"write", "/srv/site/built.txt", "STEP2"`, `"fail", "7"`, 1)), 0o644)
	_, rep, err = build(t, c, dir)
	if err == nil || !client.IsConflict(err) || rep.FailedStep != 2 || rep.ExitCode == nil || *rep.ExitCode != 7 {
		t.Fatalf("failing build: err %v, report %+v; want step 2 failed with exit code 7", err, rep)
	}
	latest, err := c.CreateSandbox(ctx, api.CreateSandbox{Template: "web"})
	if err != nil {
		t.Fatalf("create after a failed build: %v", err)
	}
	if latest.Template != "web:3" {
		t.Errorf("after a failed build the latest template is %s, want web:3", latest.Template)
	}
	if out, _, _ := execOut(t, c, latest.ID, api.Exec{Command: []string{"/bin/tplsrv", "get", "http://127.0.0.1:8080/site/built.txt"}}); out != "STEP2b" {
		t.Errorf("web:3 serves %q, want STEP2b", out)
	}

	// In use: refused; once its sandbox is gone, deleted.
	if err := c.DeleteTemplate(ctx, "web:1"); !client.IsConflict(err) {
		t.Errorf("delete a template in use = %v, want a conflict", err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, "web:1"); err != nil {
		t.Errorf("delete an unused template: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Template: "web:1"}); !client.IsInvalid(err) {
		t.Errorf("create from a deleted version = %v, want invalid argument", err)
	}
	all, err := c.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tp := range all {
		names = append(names, tp.Name+":"+tp.State)
	}
	t.Logf("templates: %v", names)
	if len(all) == 0 || all[0].Name != "default" || !all[0].Default {
		t.Errorf("template list does not start with the default: %v", names)
	}
}

// TestTemplateFromDebian builds a template from a Debian base with one
// extra package (installed by debootstrap on the host) and a run step that
// uses it; a sandbox of the template has both.
func TestTemplateFromDebian(t *testing.T) {
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	dir := t.TempDir()
	// The host's suite from the host's mirror, as the default template.
	suite, err := apt.Codename()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "space.yaml"), []byte(`name: hello
base:
  debian:
    suite: `+suite+`
    packages: [hello]
steps:
  - run: hello --greeting="built in a step" > /etc/greeting
resources:
  memory_mib: 256
`), 0o644)
	tpl, rep, err := build(t, c, dir)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if rep.Executed != 1 || tpl.State != "ready" {
		t.Fatalf("build: template %+v, report %+v", tpl, rep)
	}
	sb, err := c.CreateSandbox(t.Context(), api.CreateSandbox{Template: "hello"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if out, errOut, code := execOut(t, c, sb.ID, sh("cat /etc/greeting; hello")); code != 0 || out != "built in a step\nHello, world!\n" {
		t.Errorf("in the sandbox: %q (stderr %q, exit %d)", out, errOut, code)
	}
}

// TestTemplateFromRegistry builds a template from an image reference
// pulled from a registry: go-containerregistry's in-process registry on
// loopback, so no network is involved.
func TestTemplateFromRegistry(t *testing.T) {
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://") + "/tests/tplsrv:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, testImage(t, buildTplsrv(t, t.TempDir()), "")); err != nil {
		t.Fatalf("setup: push: %v", err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "space.yaml"), []byte("name: pulled\nbase: {oci: "+ref.String()+"}\nready: {tcp: 8080}\nresources: {memory_mib: 256}\n"), 0o644)
	tpl, rep, err := build(t, c, dir)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if rep.Steps != 0 || tpl.Env["GREETING"] != "hello from the image" {
		t.Errorf("build: template %+v, report %+v", tpl, rep)
	}
	sb, err := c.CreateSandbox(t.Context(), api.CreateSandbox{Template: "pulled"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	// The image's command serves its working directory.
	if out, errOut, code := execOut(t, c, sb.ID, api.Exec{Command: []string{"/bin/tplsrv", "get", "http://127.0.0.1:8080/"}}); code != 0 || !strings.Contains(out, "<pre>") {
		t.Errorf("get / in the sandbox: %q (stderr %q, exit %d)", out, errOut, code)
	}
}

// BenchmarkTemplateBuild measures, in one run, a template build from an
// OCI tarball (its base image already in the host cache), the same build
// again (everything cached: no VM), the build with its last run step
// changed (the steps before it restored from the cache), and a create
// from the template until a first exec.
//
//	go test -run '^$' -bench TemplateBuild -benchtime 1x ./internal/server
func BenchmarkTemplateBuild(b *testing.B) {
	ts := startServerB(b, Config{})
	c := ts.client
	dir := b.TempDir()
	writeTestImage(b, buildTplsrv(b, b.TempDir()), filepath.Join(dir, "image.tar"))
	os.MkdirAll(filepath.Join(dir, "site"), 0o755)
	os.WriteFile(filepath.Join(dir, "site", "index.txt"), []byte("COPIED"), 0o644)
	spec := filepath.Join(dir, "space.yaml")
	timed := func(yaml string) (time.Duration, api.BuildReport) {
		os.WriteFile(spec, []byte(yaml), 0o644)
		t0 := time.Now()
		_, rep, err := build(b, c, dir)
		if err != nil {
			b.Fatalf("build: %v", err)
		}
		return time.Since(t0), rep
	}
	for b.Loop() {
		first, _ := timed(templateSpec)
		cached, rep := timed(templateSpec)
		if rep.Executed != 0 || rep.VMStarted != "" {
			b.Fatalf("rebuild was not a cache hit: %+v", rep)
		}
		changed, _ := timed(strings.Replace(templateSpec, "STEP2", "STEP2c", 1))
		// Until a first exec, as the lifecycle benchmark (the image has
		// no `true`: its one program).
		t0 := time.Now()
		sb, err := c.CreateSandbox(b.Context(), api.CreateSandbox{Template: "web"})
		if err != nil {
			b.Fatal(err)
		}
		if exit, err := c.Exec(b.Context(), sb.ID, api.Exec{Command: []string{"/bin/tplsrv", "pwd"}}, io.Discard, io.Discard); err != nil || exit.Code != 0 {
			b.Fatalf("exec: %+v, %v", exit, err)
		}
		create := time.Since(t0)
		if err := c.DeleteSandbox(b.Context(), sb.ID); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(first.Milliseconds()), "build-ms")
		b.ReportMetric(float64(cached.Milliseconds()), "cached-build-ms")
		b.ReportMetric(float64(cached)/float64(first), "cached/build")
		b.ReportMetric(float64(changed)/float64(first), "step-changed/build")
		b.ReportMetric(float64(create.Milliseconds()), "create-from-template-ms")
	}
}

// TestTemplateOnAnotherWorker builds a template on one worker and starts
// a sandbox of it on another whose host has no copy of its base image
// (removed from the cache): the worker fetches the image, like the
// template's snapshot, from the shared chunk store instead of building
// anything.
func TestTemplateOnAnotherWorker(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	ts, a, b := twoWorkers(t)
	c := ts.client
	ctx := t.Context()
	// An image of its own (a random marker), so that removing it from
	// the cache touches no other test.
	marker := rand.Text()
	dir := t.TempDir()
	ref, _ := name.ParseReference("space.test/tplsrv:marker")
	if err := tarball.WriteToFile(filepath.Join(dir, "image.tar"), ref, testImage(t, buildTplsrv(t, t.TempDir()), marker)); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "space.yaml"), []byte("name: travel\nbase: {oci: ./image.tar}\nready: {tcp: 8080}\nresources: {memory_mib: 256}\n"), 0o644)
	var builtOn string
	tpl, _, err := c.BuildTemplate(ctx, tarDir(t, dir), client.BuildOptions{}, func(ev api.BuildEvent) {})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	snaps, err := c.Snapshots(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range snaps {
		if sn.ID == tpl.Snapshot {
			builtOn = sn.Worker
		}
	}
	other := a.workerID
	if builtOn == a.workerID {
		other = b.workerID
	}
	cache, err := cachedir.Open(guesttest.CacheBase())
	if err != nil {
		t.Fatal(err)
	}
	imgDir := cache.Path(templatebuild.ImageKind, tpl.Image)
	if err := os.RemoveAll(imgDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(imgDir) })
	// A filler takes the whole worker that built it.
	filler, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 1024})
	if err != nil || filler.Worker == other {
		t.Fatalf("CreateSandbox(1 GiB) = %+v, %v; want it on %s", filler, err, builtOn)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{Template: "travel"})
	if err != nil {
		t.Fatalf("create on the other worker: %v", err)
	}
	if sb.Worker != other {
		t.Errorf("sandbox on %s, want %s (the worker that did not build the template)", sb.Worker, other)
	}
	if out, errOut, code := execOut(t, c, sb.ID, api.Exec{Command: []string{"/bin/tplsrv", "get", "http://127.0.0.1:8080/marker"}}); code != 0 || out != marker {
		t.Errorf("get /marker: %q (stderr %q, exit %d), want %q", out, errOut, code, marker)
	}
	if _, err := os.Stat(filepath.Join(imgDir, "rootfs.ext4")); err != nil {
		t.Errorf("the image was not fetched back into the cache: %v", err)
	}
	for _, id := range []string{sb.ID, filler.ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteTemplate(ctx, "travel"); err != nil {
		t.Errorf("delete template: %v", err)
	}
}

// TestCrashDuringTemplateBuild kills the server once a build has cached
// its first step: after the restart the version is failed (not left
// building), its build sandbox is gone, and building again starts from
// the step the crash did not lose.
func TestCrashDuringTemplateBuild(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	dataDir, workerID := newDataDir(t), newWorkerID(t)
	ctx := t.Context()
	dir := t.TempDir()
	writeTestImage(t, buildTplsrv(t, t.TempDir()), filepath.Join(dir, "image.tar"))
	os.MkdirAll(filepath.Join(dir, "site"), 0o755)
	os.WriteFile(filepath.Join(dir, "site", "index.txt"), []byte("COPIED"), 0o644)
	os.WriteFile(filepath.Join(dir, "space.yaml"), []byte(templateSpec), 0o644)

	c := startChild(t, dataDir, workerID, templateStep)
	if _, _, err := build(t, c.client, dir); err == nil {
		t.Fatalf("build succeeded, want the server to die at %s", templateStep)
	}
	c.waitExit(t)
	c = startChild(t, dataDir, workerID, "")
	versions, err := c.client.Template(ctx, "web")
	if err != nil || len(versions) != 1 || versions[0].State != "failed" || !strings.Contains(versions[0].Error, "interrupted") {
		t.Fatalf("after the restart web = %+v, %v; want version 1 failed as interrupted", versions, err)
	}
	if sbs, err := c.client.Sandboxes(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Errorf("after the restart sandboxes = %+v, %v; want the build sandbox gone", sbs, err)
	}
	tpl, rep, err := build(t, c.client, dir)
	if err != nil || tpl.Version != 2 || rep.Cached != 1 || rep.VMStarted != "restore" {
		t.Fatalf("build after the restart: %+v, %+v, %v; want version 2 from the cached step 1", tpl, rep, err)
	}
	if err := c.client.DeleteTemplate(ctx, "web"); err != nil {
		t.Errorf("delete template: %v", err)
	}
	c.kill(t, syscall.SIGTERM)
}

// TestTemplateBuildNetwork gives a build the network its spec allows: a
// step fetches from the allowed name (an HTTPS upstream in a namespace of
// the test's own), and a build whose step fetches another name fails.
func TestTemplateBuildNetwork(t *testing.T) {
	nsPath := egresstest.Start(t).Netns
	ts := startServerWith(t, Config{Egress: Egress{Netns: nsPath, Hosts: map[string][]netip.Addr{
		"api.test": {egresstest.Addr}, "other.test": {egresstest.Addr}}}})
	ts.deleteAllOnCleanup(t)
	dir := t.TempDir()
	writeTestImage(t, buildTplsrv(t, t.TempDir()), filepath.Join(dir, "image.tar"))
	spec := func(host string) string {
		return "name: fetch\nbase: {oci: ./image.tar}\nsteps:\n  - run: [/bin/tplsrv, get, \"http://" + host +
			"/\"]\nnetwork: {allow: [api.test]}\nready: {tcp: 8080}\nresources: {memory_mib: 256}\n"
	}
	os.WriteFile(filepath.Join(dir, "space.yaml"), []byte(spec("api.test")), 0o644)
	var out strings.Builder
	_, rep, err := ts.client.BuildTemplate(t.Context(), tarDir(t, dir), client.BuildOptions{}, func(ev api.BuildEvent) {
		if ev.Type == "output" {
			out.Write(ev.Data)
		}
	})
	if err != nil || rep.Executed != 1 || !strings.Contains(out.String(), "hello api.test") {
		t.Fatalf("build fetching the allowed name: %v, %+v, output %q", err, rep, out.String())
	}
	// The other name does not even resolve: the gateway answers NXDOMAIN.
	os.WriteFile(filepath.Join(dir, "space.yaml"), []byte(spec("other.test")), 0o644)
	out.Reset()
	_, rep, err = ts.client.BuildTemplate(t.Context(), tarDir(t, dir), client.BuildOptions{}, func(ev api.BuildEvent) {
		if ev.Type == "output" {
			out.Write(ev.Data)
		}
	})
	if err == nil || rep.FailedStep != 1 || !strings.Contains(out.String(), "no such host") {
		t.Errorf("build fetching a name its spec does not allow: %v, %+v, output %q; want step 1 failed on the lookup", err, rep, out.String())
	}
}
