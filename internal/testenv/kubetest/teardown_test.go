package kubetest

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUnquote(t *testing.T) {
	tests := []struct {
		name, line string
		want       []string
	}{
		{"plain", "-A FORWARD -s 10.252.0.0/24 -j DROP", []string{"-A", "FORWARD", "-s", "10.252.0.0/24", "-j", "DROP"}},
		{"quoted comment", `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			[]string{"-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}},
		{"quoted word", `-A OUTPUT -m comment --comment "x" -j KUBE-X`, []string{"-A", "OUTPUT", "-m", "comment", "--comment", "x", "-j", "KUBE-X"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := unquote(strings.Fields(tt.line))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("unquote(%q) mismatch (-want +got):\n%s", tt.line, diff)
			}
		})
	}
}

func TestJumpsToKube(t *testing.T) {
	tests := []struct {
		line string
		want bool
	}{
		{"-A OUTPUT -j KUBE-SERVICES", true},
		{"-A FORWARD -j DROP", false},
		{"-A FORWARD -s 10.0.0.0/8", false},
		{"-A FORWARD -j", false},
	}
	for _, tt := range tests {
		if got := jumpsToKube(strings.Fields(tt.line)); got != tt.want {
			t.Errorf("jumpsToKube(%q) = %v, want %v", tt.line, got, tt.want)
		}
	}
}

func TestUnescapeOctal(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory"},
		{`/mnt/a\040b`, "/mnt/a b"},
		{`/mnt/end\04`, `/mnt/end\04`},
		{`/mnt/x\\y`, `/mnt/x\\y`},
	}
	for _, tt := range tests {
		if got := unescapeOctal(tt.in); got != tt.want {
			t.Errorf("unescapeOctal(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestLdflagsStampVersion(t *testing.T) {
	got := ldflags()
	for _, want := range []string{
		"-X k8s.io/component-base/version.gitVersion=" + Version,
		"-X k8s.io/component-base/version.gitMajor=1",
		"-X k8s.io/component-base/version.gitMinor=37",
		"-X k8s.io/client-go/pkg/version.gitVersion=" + Version,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("ldflags() = %q, want it to contain %q", got, want)
		}
	}
}
