package helmchart

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// repoDir is the repository's root.
func repoDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return dir
}

// parseDir parses the Go files of a directory of the repository, tests
// left out.
func parseDir(t *testing.T, rel string) []*ast.File {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoDir(t), rel, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("setup: no Go files in %s (%v)", rel, err)
	}
	fset := token.NewFileSet()
	var out []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		out = append(out, af)
	}
	return out
}

// cmdFlags returns the names of the flags cmd/space defines: the second
// argument of every pflag XxxVar or XxxVarP call.
func cmdFlags(t *testing.T) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, f := range parseDir(t, filepath.Join("cmd", "space")) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 3 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !(strings.HasSuffix(sel.Sel.Name, "Var") || strings.HasSuffix(sel.Sel.Name, "VarP")) {
				return true
			}
			if lit, ok := call.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if name, err := strconv.Unquote(lit.Value); err == nil {
					flags[name] = true
				}
			}
			return true
		})
	}
	return flags
}

// TestFlagsExist checks every flag the chart passes is one that cmd/space
// defines, for every variant, so a renamed flag fails here rather than in
// a crash-looping pod.
func TestFlagsExist(t *testing.T) {
	defined := cmdFlags(t)
	if !defined["no-worker"] || !defined["data-dir"] {
		t.Fatalf("setup: found no --no-worker or --data-dir in cmd/space (found %v)", defined)
	}
	for name, values := range variants(t) {
		t.Run(name, func(t *testing.T) {
			for _, o := range render(t, values).Objects {
				var spec corev1.PodSpec
				switch o := o.(type) {
				case *appsv1.Deployment:
					spec = o.Spec.Template.Spec
				case *appsv1.DaemonSet:
					spec = o.Spec.Template.Spec
				default:
					continue
				}
				for _, c := range spec.Containers {
					for _, a := range c.Args[1:] {
						f, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
						if !strings.HasPrefix(a, "--") || !defined[f] {
							t.Errorf("container %s passes %q: cmd/space defines no such flag", c.Name, a)
						}
					}
				}
			}
		})
	}
}

// TestVMMEnum checks the schema's choice of vmm is the drivers that
// internal/server knows (its VMM* constants), so a new driver shows up
// here to be offered by the chart.
func TestVMMEnum(t *testing.T) {
	var drivers []string
	for _, f := range parseDir(t, filepath.Join("internal", "server")) {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "VMM") || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						drivers = append(drivers, v)
					}
				}
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(chartDir(t), "values.schema.json"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var schema struct {
		Properties struct {
			VMM struct {
				Enum []string `json:"enum"`
			} `json:"vmm"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatalf("setup: values.schema.json: %v", err)
	}
	slices.Sort(drivers)
	enum := slices.Sorted(slices.Values(schema.Properties.VMM.Enum))
	if diff := cmp.Diff(drivers, enum); diff != "" {
		t.Errorf("schema's vmm choices differ from internal/server's VMM* drivers (-server +schema):\n%s", diff)
	}
}
