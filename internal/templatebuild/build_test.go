package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"space/api"
	"space/internal/cachedir"
	"space/internal/errkind"
	"space/internal/templatespec"
)

// fakeSandboxes records what a build asks of its sandboxes: the cache
// and step logic is tested here, the real sandboxes in internal/server.
type fakeSandboxes struct {
	log   []string
	snaps int
	fail  string // a run step whose shell is this exits 3
}

func (f *fakeSandboxes) Boot(_ context.Context, image string, res templatespec.Resources, allow []string) (Sandbox, error) {
	f.log = append(f.log, fmt.Sprintf("boot %d MiB", res.MemoryMiB)+strings.Join(append([]string{""}, allow...), " allow "))
	return &fakeSandbox{f: f}, nil
}

func (f *fakeSandboxes) Restore(_ context.Context, id string, _ []string) (Sandbox, error) {
	f.log = append(f.log, "restore "+id)
	return &fakeSandbox{f: f}, nil
}

type fakeSandbox struct{ f *fakeSandboxes }

func (s *fakeSandbox) Exec(_ context.Context, req api.Exec, stdout, _ io.Writer) (api.Exit, error) {
	s.f.log = append(s.f.log, fmt.Sprintf("exec %s cwd=%s user=%s A=%s", req.Shell, req.Cwd, req.User, req.Env["A"]))
	if req.Shell == s.f.fail {
		return api.Exit{Code: 3}, nil
	}
	fmt.Fprintln(stdout, "ran", req.Shell)
	return api.Exit{}, nil
}

func (s *fakeSandbox) Start(_ context.Context, req api.Exec) error {
	s.f.log = append(s.f.log, "start "+strings.Join(req.Command, " "))
	return nil
}

func (s *fakeSandbox) WriteFile(_ context.Context, p string, r io.Reader, _ fs.FileMode) error {
	b, _ := io.ReadAll(r)
	s.f.log = append(s.f.log, fmt.Sprintf("write %s %q", p, b))
	return nil
}

func (s *fakeSandbox) RemoveFile(_ context.Context, p string) error {
	s.f.log = append(s.f.log, "remove "+p)
	return nil
}

func (s *fakeSandbox) PortOpen(context.Context, int) (bool, error) { return true, nil }

func (s *fakeSandbox) Snapshot(_ context.Context, name string) (string, error) {
	s.f.snaps++
	id := fmt.Sprintf("snap%d", s.f.snaps)
	s.f.log = append(s.f.log, "snapshot "+id+" "+strings.SplitN(name, ".", 2)[0])
	return id, nil
}

func (s *fakeSandbox) Delete(context.Context) error {
	s.f.log = append(s.f.log, "delete")
	return nil
}

type mapCache map[string]string

func (m mapCache) Get(_ context.Context, k string) (string, error) { return m[k], nil }
func (m mapCache) Put(_ context.Context, k, id string) error       { m[k] = id; return nil }

func parse(t *testing.T, yaml string) *templatespec.Spec {
	t.Helper()
	s, err := templatespec.Parse(strings.NewReader(yaml))
	if err == nil {
		err = s.Check()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const spec = `base: {dir: root}
steps:
  - env: {A: one}
  - copy: {src: f.txt, dst: /w/}
  - workdir: /w
  - run: step4
  - env: {A: two}
  - run: step6
  - user: app
start: [server, --port, "80"]
ready: {tcp: 80}
`

// TestBuildCache runs the build logic against fake sandboxes (the
// real ones are in internal/server's template tests): which steps run,
// where snapshots are taken and cached, and what a rebuild reuses.
func TestBuildCache(t *testing.T) {
	if _, err := os.Stat("/sbin/mkfs.ext4"); err != nil {
		t.Fatalf("mkfs.ext4 is missing (make deps installs e2fsprogs): %v", err)
	}
	cache, err := cachedir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctxDir := t.TempDir()
	os.MkdirAll(filepath.Join(ctxDir, "root", "bin"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "f.txt"), []byte("F"), 0o644)
	bc := mapCache{}
	team := "team1"
	run := func(yaml string, fail string) (*fakeSandboxes, Result, error) {
		f := &fakeSandboxes{fail: fail}
		res, err := Build(t.Context(), Request{
			Spec: parse(t, yaml), ContextDir: ctxDir, Name: "t", Team: team, Images: &Images{Cache: cache}, Sandboxes: f, Cache: bc,
			Defaults: templatespec.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 1024},
		})
		t.Logf("log: %q\nreport: %+v", f.log, res.Report)
		return f, res, err
	}

	f, res, err := run(spec, "")
	if err != nil {
		t.Fatal(err)
	}
	firstImage := res.Image.Name
	// A snapshot after every step that changes files and is followed by
	// another (or is the last of them), the template's after the start.
	want := []string{
		"boot 512 MiB",
		`write /w/f.txt "F"`, "snapshot snap1 build",
		`write /w/.space-workdir ""`, "remove /w/.space-workdir", "snapshot snap2 build",
		"exec step4 cwd=/w user= A=one", "snapshot snap3 build",
		"exec step6 cwd=/w user= A=two", "snapshot snap4 build",
		"start server --port 80", "snapshot snap5 template",
		"delete",
	}
	if strings.Join(f.log, "\n") != strings.Join(want, "\n") {
		t.Errorf("first build did\n%q\nwant\n%q", f.log, want)
	}
	if res.Report.Executed != 7 || res.Report.Cached != 0 || res.Report.VMStarted != "boot" || res.User != "app" || res.Env["A"] != "two" || res.Workdir != "/w" {
		t.Errorf("first build: %+v", res)
	}

	// Unchanged: nothing starts.
	f, res, err = run(spec, "")
	if err != nil || len(f.log) != 0 || res.Report.Cached != 7 || res.Report.Executed != 0 || res.SnapshotID == "" {
		t.Errorf("rebuild: err %v, log %q, report %+v", err, f.log, res.Report)
	}

	// Step 6 changed: the build restores the snapshot after step 4 (the
	// one cached for step 5 too: an env step changes no file) and runs
	// steps 6 and 7.
	f, res, err = run(strings.Replace(spec, "step6", "step6b", 1), "")
	if err != nil || res.Report.Cached != 5 || res.Report.Executed != 2 || f.log[0] != "restore snap3" {
		t.Errorf("partial rebuild: err %v, log %q, report %+v", err, f.log, res.Report)
	}
	if !strings.Contains(strings.Join(f.log, "\n"), "exec step6b cwd=/w user= A=two") {
		t.Errorf("partial rebuild ran step 6 without the state of steps 1-5: %q", f.log)
	}

	// Other resources: nothing is reused.
	f, res, err = run(spec+"resources: {memory_mib: 256}\n", "")
	if err != nil || res.Report.Cached != 0 || f.log[0] != "boot 256 MiB" {
		t.Errorf("resized build: err %v, log %q, report %+v", err, f.log, res.Report)
	}

	// A failing step: its number and exit code, and the sandbox goes.
	f, res, err = run(strings.Replace(spec, "step6", "boom", 1), "boom")
	var se *StepError
	if !errors.As(err, &se) || se.Step != 6 || se.Exit.Code != 3 || !errors.Is(err, errkind.FailedPrecondition) ||
		res.Report.FailedStep != 6 || *res.Report.ExitCode != 3 || f.log[len(f.log)-1] != "delete" {
		t.Errorf("failing build: err %v, log %q, report %+v", err, f.log, res.Report)
	}

	// The build sandbox gets the spec's network (which is not in the
	// cache keys: the same steps are reused).
	f, _, err = run(strings.Replace(spec, "step6", "step6n", 1)+"network: {allow: [example.com]}\n", "")
	if err != nil || len(f.log) == 0 || f.log[0] != "restore snap3" {
		t.Errorf("build with network: %v, log %q", err, f.log)
	}
	f, _, err = run(spec+"resources: {memory_mib: 128}\nnetwork: {allow: [example.com]}\n", "")
	if err != nil || f.log[0] != "boot 128 MiB allow example.com" {
		t.Errorf("build with network: %v, log %q; want a boot with the network", err, f.log)
	}

	// A base from the build context is the team's own: the same bytes
	// built for another team are another image (made again, not found),
	// and the same team finds its own again.
	if _, res, err = run(spec, ""); err != nil || res.Image.Name != firstImage {
		t.Errorf("rebuild for %s: image %s, %v; want its first one %s", team, res.Image.Name, err, firstImage)
	}
	team = "team2"
	if _, res, err = run(spec, ""); err != nil || res.Image.Name == firstImage {
		t.Errorf("build of team1's local base for team2: image %s, %v; want another image than team1's %s", res.Image.Name, err, firstImage)
	}
	team = ""
	if _, _, err = run(spec, ""); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("build of a local base for no team = %v, want InvalidArgument", err)
	}
}
