package cgroup

import (
	"bufio"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
)

// mounts are the cgroup file systems in a mountinfo file.
type mounts struct {
	v2 []string              // cgroup2 mount points, in mount order
	v1 map[Controller]string // first mount point of each v1 controller we use
	// v1All are the mount points of every v1 hierarchy, named ones too,
	// in mount order.
	v1All []string
}

// parseMountinfo reads /proc/<pid>/mountinfo (proc(5)): "id parent
// major:minor root mountpoint options [optional...] - fstype source
// superoptions", where a v1 cgroup's super options name its controllers.
func parseMountinfo(r io.Reader) (mounts, error) {
	m := mounts{v1: make(map[Controller]string)}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 5 || len(f) < sep+4 {
			continue
		}
		point := unescapeOctal(f[4])
		switch f[sep+1] {
		case "cgroup2":
			m.v2 = append(m.v2, point)
		case "cgroup":
			m.v1All = append(m.v1All, point)
			for o := range strings.SplitSeq(f[sep+3], ",") {
				c := Controller(o)
				if _, seen := m.v1[c]; !seen && slices.Contains(v1Controllers, c) {
					m.v1[c] = point
				}
			}
		}
	}
	return m, sc.Err()
}

// pick chooses the hierarchy to use: v2 when /sys/fs/cgroup is cgroup2
// (unified mode); else the v1 controllers when one that limits or counts
// is mounted (legacy or hybrid mode, where a cgroup2 mount has no
// controllers); else any cgroup2 mount. Both results are empty when there
// is none.
func (m mounts) pick() (v2 string, v1 map[Controller]string) {
	if slices.Contains(m.v2, "/sys/fs/cgroup") {
		return "/sys/fs/cgroup", nil
	}
	for _, c := range []Controller{CPU, CPUAcct, Memory, Pids} {
		if _, ok := m.v1[c]; ok {
			return "", m.v1
		}
	}
	if len(m.v2) > 0 {
		return m.v2[0], nil
	}
	return "", nil
}

// besides returns the cgroup mounts other than those in used (the v1
// controllers chosen) that sit in the same directory as one of them: on a
// v1 host, the other hierarchies under /sys/fs/cgroup (devices, cpuset,
// name=systemd, a hybrid host's unified cgroup2). Mounts elsewhere, such
// as a private cgroup2 a program mounted for itself, are not the host's
// layout and are left out.
func (m mounts) besides(used map[Controller]string) []string {
	var parents, taken []string
	for _, dir := range used {
		parents = append(parents, path.Dir(dir))
		taken = append(taken, dir)
	}
	var out []string
	for _, dir := range append(slices.Clone(m.v1All), m.v2...) {
		if slices.Contains(parents, path.Dir(dir)) && !slices.Contains(taken, dir) && !slices.Contains(out, dir) {
			out = append(out, dir)
		}
	}
	return out
}

// unescapeOctal undoes mountinfo's \ooo escapes (space, tab, newline,
// backslash).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
