package templatespec

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

// TestDocExamples parses every YAML example of docs/templates.md, so the
// documentation cannot drift from the format.
func TestDocExamples(t *testing.T) {
	b, err := os.ReadFile("../../docs/templates.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	if len(blocks) < 3 {
		t.Fatalf("found %d yaml examples in docs/templates.md, want at least 3", len(blocks))
	}
	for i, m := range blocks {
		if _, err := Parse(strings.NewReader(m[1])); err != nil {
			t.Errorf("example %d: %v\n%s", i, err, m[1])
		}
	}
}

func TestParse(t *testing.T) {
	s, err := Parse(strings.NewReader(`
name: web
base: {oci: ./img.tar}
steps:
  - run: echo hi
  - run: [make, -j2]
  - copy: {src: app, dst: /srv/app}
  - env: {A: "1"}
  - workdir: /srv
  - user: app
start: [./serve]
ready: {tcp: 8080, timeout: 90s}
resources: {vcpus: 2, memory_mib: 1024}
network: {allow: [example.com, "*.example.org"]}
`))
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	want := &Spec{
		Name: "web",
		Base: Base{OCI: "./img.tar"},
		Steps: []Step{
			{Run: &Command{Shell: "echo hi"}},
			{Run: &Command{Argv: []string{"make", "-j2"}}},
			{Copy: &Copy{Src: "app", Dst: "/srv/app"}},
			{Env: map[string]string{"A": "1"}},
			{Workdir: "/srv"},
			{User: "app"},
		},
		Start:     &Command{Argv: []string{"./serve"}},
		Ready:     &Ready{TCP: 8080, Timeout: Duration(90 * time.Second)},
		Resources: Resources{VCPUs: 2, MemoryMiB: 1024},
		Network:   Network{Allow: []string{"example.com", "*.example.org"}},
	}
	if diff := cmp.Diff(want, s); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	if got := s.ReadyTimeout(); got != 90*time.Second {
		t.Errorf("ReadyTimeout = %v", got)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, field string
	}{
		{"empty", ``, ""},
		{"unknown field", "base: {dir: r}\nbuild: x\n", ""},
		{"two documents", "base: {dir: r}\n---\nbase: {dir: r}\n", ""},
		{"no base", "steps: [{run: x}]\n", "base"},
		{"two bases", "base: {dir: r, oci: x}\n", "base"},
		{"bad suite", "base: {debian: {suite: Bookworm}}\n", "base.debian.suite"},
		{"bad package", "base: {debian: {suite: bookworm, packages: [python3, 'rm -rf']}}\n", "base.debian.packages[1]"},
		{"dir escapes", "base: {dir: ../../etc}\n", "base.dir"},
		{"absolute dir", "base: {dir: /etc}\n", "base.dir"},
		{"local oci escapes", "base: {oci: ../x.tar}\n", "base.oci"},
		{"bad ref", "base: {oci: 'a b'}\n", "base.oci"},
		{"bad name", "name: Web_1\nbase: {dir: r}\n", "name"},
		{"empty step", "base: {dir: r}\nsteps: [{}]\n", "steps[0]"},
		{"two kinds", "base: {dir: r}\nsteps: [{run: x, workdir: /a}]\n", "steps[0]"},
		{"copy escapes", "base: {dir: r}\nsteps: [{run: x}, {copy: {src: ../s, dst: /d}}]\n", "steps[1].copy.src"},
		{"copy relative dst", "base: {dir: r}\nsteps: [{copy: {src: s, dst: d}}]\n", "steps[0].copy.dst"},
		{"relative workdir", "base: {dir: r}\nsteps: [{workdir: w}]\n", "steps[0].workdir"},
		{"bad env", "base: {dir: r}\nsteps: [{env: {'A=B': x}}]\n", "steps[0].env"},
		{"bad user", "base: {dir: r}\nsteps: [{user: 'root;x'}]\n", "steps[0].user"},
		{"empty run", "base: {dir: r}\nsteps: [{run: ''}]\n", "steps[0].run"},
		{"command map", "base: {dir: r}\nstart: {a: b}\n", ""},
		{"ready both", "base: {dir: r}\nstart: x\nready: {tcp: 1, command: y}\n", "ready"},
		{"ready nothing started", "base: {dir: r}\nready: {tcp: 80}\n", "ready"},
		{"ready bad port", "base: {dir: r}\nstart: x\nready: {tcp: 70000}\n", "ready.tcp"},
		{"ready long", "base: {dir: r}\nstart: x\nready: {tcp: 80, timeout: 1h}\n", "ready.timeout"},
		{"bad duration", "base: {dir: r}\nstart: x\nready: {tcp: 80, timeout: soon}\n", ""},
		{"memory", "base: {dir: r}\nresources: {memory_mib: 64}\n", "resources.memory_mib"},
		{"host", "base: {dir: r}\nnetwork: {allow: ['Example.com']}\n", "network.allow[0]"},
		{"host wildcard inside", "base: {dir: r}\nnetwork: {allow: ['a.*.com']}\n", "network.allow[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(strings.NewReader(tc.yaml))
			var se *Error
			if !errors.As(err, &se) || !errors.Is(err, errkind.InvalidArgument) {
				t.Fatalf("Parse = %+v, %v; want a spec error", s, err)
			}
			if se.Field != tc.field {
				t.Errorf("Parse error field = %q (%v), want %q", se.Field, err, tc.field)
			}
		})
	}
	if _, err := Parse(strings.NewReader("base: {dir: r}\n# " + strings.Repeat("x", MaxSize))); err == nil {
		t.Errorf("Parse of a file over MaxSize succeeded")
	}
}

// TestCacheKeys checks that keys follow the base, the steps and the
// copied files: the same inputs give the same keys; a change at step k
// changes keys k and after only.
func TestCacheKeys(t *testing.T) {
	ctx := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(ctx, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rootfs/etc/hostname", "x")
	write("app/main.py", "print(1)")
	write("app/lib/util.py", "X = 1")
	spec := func(step2 string) *Spec {
		s, err := Parse(strings.NewReader(`
base: {dir: rootfs}
steps:
  - run: apt-get install -y curl
  - copy: {src: app, dst: /app}
  - run: ` + step2 + `
  - env: {A: "1"}
`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	keys := func(s *Spec) Keys {
		k, err := CacheKeys(s, ctx)
		if err != nil {
			t.Fatalf("CacheKeys = %v", err)
		}
		return k
	}
	a := keys(spec("make"))
	if len(a.Steps) != 4 || a.Base == "" {
		t.Fatalf("CacheKeys = %+v", a)
	}
	if b := keys(spec("make")); !cmp.Equal(a, b) {
		t.Errorf("same inputs, different keys: %+v, %+v", a, b)
	}
	same := func(x, y Keys) int { // how many leading step keys agree
		n := 0
		for n < len(x.Steps) && x.Steps[n] == y.Steps[n] {
			n++
		}
		return n
	}
	if b := keys(spec("make test")); b.Base != a.Base || same(a, b) != 2 {
		t.Errorf("changing step 3 kept %d step keys, want 2", same(a, b))
	}
	write("app/lib/util.py", "X = 2")
	if b := keys(spec("make")); b.Base != a.Base || same(a, b) != 1 {
		t.Errorf("changing a copied file kept %d step keys, want 1", same(a, b))
	}
	write("rootfs/etc/hostname", "y")
	if b := keys(spec("make")); b.Base == a.Base || same(a, b) != 0 {
		t.Errorf("changing the base dir kept the base key or %d step keys", same(a, b))
	}
	// A symlink out of the context is refused.
	if err := os.Symlink("/etc", filepath.Join(ctx, "out")); err != nil {
		t.Fatal(err)
	}
	s := spec("make")
	s.Steps[1].Copy.Src = "out"
	if _, err := CacheKeys(s, ctx); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("CacheKeys with a copy through a symlink out of the context = %v, want invalid", err)
	}
	s.Steps[1].Copy.Src = "missing"
	if _, err := CacheKeys(s, ctx); err == nil {
		t.Errorf("CacheKeys with a missing copy source succeeded")
	}
}
