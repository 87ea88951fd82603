package cgroup

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name string
		l    Limits
		ok   bool
	}{
		{"zero", Limits{}, true},
		{"all", Limits{CPUs: 1.5, MemoryBytes: 1 << 30, Pids: 100}, true},
		{"smallest cpus", Limits{CPUs: 0.01}, true},
		{"cpus below the minimum", Limits{CPUs: 0.009}, false},
		{"negative cpus", Limits{CPUs: -1}, false},
		{"nan cpus", Limits{CPUs: math.NaN()}, false},
		{"infinite cpus", Limits{CPUs: math.Inf(1)}, false},
		{"negative memory", Limits{MemoryBytes: -1}, false},
		{"negative pids", Limits{Pids: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.validate()
			if tt.ok && err != nil {
				t.Errorf("%+v.validate() = %v, want nil", tt.l, err)
			}
			if !tt.ok && !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("%+v.validate() = %v, want InvalidArgument", tt.l, err)
			}
		})
	}
}

func TestLimitFormat(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"cpuMax(0)", cpuMax(0), "max 100000"},
		{"cpuMax(1.5)", cpuMax(1.5), "150000 100000"},
		{"cpuMax(0.01)", cpuMax(0.01), "1000 100000"},
		{"cpuMax(1/3)", cpuMax(1.0 / 3), "33333 100000"},
		{"maxValue(0)", maxValue(0), "max"},
		{"maxValue(64)", maxValue(64), "64"},
		{"v1Value(0)", v1Value(0), "-1"},
		{"v1Value(256MiB)", v1Value(256 << 20), "268435456"},
		{"swapMax(0)", swapMax(0), "max"},
		{"swapMax(1GiB)", swapMax(1 << 30), "0"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %q, want %q", tt.name, tt.got, tt.want)
		}
	}
	for cpus, want := range map[float64]int64{0: -1, 2: 200000, 0.25: 25000} {
		if got := cpuQuota(cpus); got != want {
			t.Errorf("cpuQuota(%g) = %d, want %d", cpus, got, want)
		}
	}
}

func TestCheckControllers(t *testing.T) {
	h := &Hierarchy{version: 2, controllers: []Controller{CPU}}
	tests := []struct {
		name string
		l    Limits
		want error
	}{
		{"none asked", Limits{}, nil},
		{"cpu present", Limits{CPUs: 1}, nil},
		{"memory missing", Limits{MemoryBytes: 1 << 20}, ErrNoController},
		{"pids missing", Limits{Pids: 10}, ErrNoController},
		{"invalid first", Limits{Pids: -1}, errkind.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := h.check(tt.l); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("check(%+v) = %v, want %v", tt.l, err, tt.want)
			}
		})
	}
	if err := h.check(Limits{MemoryBytes: 1}); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("check(memory) = %v, want FailedPrecondition", err)
	}
}

// TestApplyV2Files runs Create against a fake v2 tree: regular files in a
// temporary directory stand in for the kernel's, so the v2 limit files are
// checked on hosts whose controllers are bound to v1.
func TestApplyV2Files(t *testing.T) {
	tests := []struct {
		name string
		swap bool // memory.swap.max exists
		want map[string]string
	}{
		{
			name: "swap accounted",
			swap: true,
			want: map[string]string{
				"cgroup.subtree_control":   "+memory +pids", // cpu was on already
				"w/cgroup.subtree_control": "+cpu +memory +pids",
				"w/g/cpu.max":              "250000 100000",
				"w/g/memory.max":           "1073741824",
				"w/g/memory.swap.max":      "0",
				"w/g/pids.max":             "max",
			},
		},
		{
			name: "no swap accounting",
			want: map[string]string{
				"cgroup.subtree_control":   "+memory +pids",
				"w/cgroup.subtree_control": "+cpu +memory +pids",
				"w/g/cpu.max":              "250000 100000",
				"w/g/memory.max":           "1073741824",
				"w/g/pids.max":             "max",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			files := map[string]string{"cgroup.subtree_control": "cpu"}
			for f := range tt.want {
				if _, ok := files[f]; !ok {
					files[f] = ""
				}
			}
			for f, content := range files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatalf("setup: %v", err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			h := &Hierarchy{version: 2, v2: root, roots: []string{root}, controllers: v2Controllers}
			if _, err := h.Create("w/g", Limits{CPUs: 2.5, MemoryBytes: 1 << 30}); err != nil {
				t.Fatalf("Create = %v", err)
			}
			got := map[string]string{}
			err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				b, err := os.ReadFile(p)
				rel, _ := filepath.Rel(root, p)
				got[rel] = string(b)
				return err
			})
			if err != nil {
				t.Fatalf("read back: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("files after Create mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
