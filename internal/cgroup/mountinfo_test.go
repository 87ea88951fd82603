package cgroup

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// This host (legacy v1 plus an empty unified mount, cpu and cpuacct apart).
const hybridMountinfo = `23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

// A systemd host in unified mode, with a second cgroup2 mount (a test's).
const unifiedMountinfo = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
29 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
300 30 0:26 / /tmp/test\0401 rw,relatime shared:90 - cgroup2 none rw
`

// A CentOS 7 style host: cpu and cpuacct co-mounted, no pids controller.
const comountedMountinfo = `22 18 0:18 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:6 - tmpfs tmpfs ro,mode=755
25 22 0:21 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:8 - cgroup cgroup rw,cpuacct,cpu
26 22 0:22 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,memory
`

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		wantV2 string
		wantV1 map[Controller]string
		// wantBesides are the other hierarchies a v1 group is made in.
		wantBesides []string
	}{
		{
			name: "hybrid",
			in:   hybridMountinfo,
			wantV1: map[Controller]string{
				CPU:     "/sys/fs/cgroup/cpu",
				CPUAcct: "/sys/fs/cgroup/cpuacct",
				Memory:  "/sys/fs/cgroup/memory",
				Pids:    "/sys/fs/cgroup/pids",
				Freezer: "/sys/fs/cgroup/freezer",
			},
			wantBesides: []string{"/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"},
		},
		{name: "unified", in: unifiedMountinfo, wantV2: "/sys/fs/cgroup"},
		{
			name: "comounted",
			in:   comountedMountinfo,
			wantV1: map[Controller]string{
				CPU:     "/sys/fs/cgroup/cpu,cpuacct",
				CPUAcct: "/sys/fs/cgroup/cpu,cpuacct",
				Memory:  "/sys/fs/cgroup/memory",
			},
		},
		{
			name:   "only a private cgroup2",
			in:     "300 30 0:26 / /tmp/test\\0401 rw,relatime shared:90 - cgroup2 none rw\n",
			wantV2: "/tmp/test 1",
		},
		{name: "none", in: "23 1 0:21 / /sys rw - sysfs sysfs rw\nmalformed line\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := parseMountinfo(strings.NewReader(tt.in))
			if err != nil {
				t.Fatalf("parseMountinfo = %v", err)
			}
			v2, v1 := m.pick()
			if v2 != tt.wantV2 {
				t.Errorf("pick v2 = %q, want %q", v2, tt.wantV2)
			}
			if diff := cmp.Diff(tt.wantV1, v1); diff != "" {
				t.Errorf("pick v1 mismatch (-want +got):\n%s", diff)
			}
			if v1 != nil {
				if diff := cmp.Diff(tt.wantBesides, m.besides(v1)); diff != "" {
					t.Errorf("besides mismatch (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestUnescapeOctal(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:          "/plain",
		`/a\040b`:         "/a b",
		`/tab\011x\134y`:  "/tab\tx\\y",
		`/trailing\04`:    `/trailing\04`,
		`/not\999octal\0`: `/not\999octal\0`,
	} {
		if got := unescapeOctal(in); got != want {
			t.Errorf("unescapeOctal(%q) = %q, want %q", in, got, want)
		}
	}
}
