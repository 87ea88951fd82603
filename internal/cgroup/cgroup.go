// Package cgroup runs processes in control groups with CPU, memory and pids
// limits, on cgroup v1 and cgroup v2 alike.
//
// A [Hierarchy] is the host's cgroup file system, found by [Detect]: the v2
// unified mount, or on older hosts the v1 mounts of the cpu, cpuacct,
// memory, pids and freezer controllers (whichever exist). A [Group] is named
// by a relative path under the hierarchy's root, such as "space-w1/sbx_abc".
// On v2 it is one directory; on v1 it is one directory in each controller's
// mount, created, filled and removed together.
//
// On v1 a group is also made in every other hierarchy mounted beside those
// (devices, cpuset, blkio, named ones such as name=systemd, and a hybrid
// host's empty cgroup2 mount), without limits, and its processes are moved
// there too. Software that finds its processes by cgroup reads one of those:
// a container runtime lists a container's processes in its devices group,
// and the kubelet kills whatever is left in any of a deleted pod's groups.
// A process a worker in a pod moved into its own groups must be in none of
// the pod's, or it dies with the pod.
//
// The caller owns its names: a worker prefixes them with its own ID and
// finds its groups again by name ([Hierarchy.Open], [Hierarchy.List]),
// never by looking at which processes run where.
//
// A Hierarchy and its Groups hold only paths: they are immutable, safe for
// concurrent use and take no locks. The kernel serializes the file writes;
// two callers setting limits on one group concurrently get the last write.
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// ErrUnavailable is returned by Detect, NewV1 and NewV2 when cgroups cannot
// be used here: no cgroup file system is mounted, or it is not writable
// (not root, or /sys/fs/cgroup mounted read-only). A caller can run its
// processes without limits instead.
var ErrUnavailable = fmt.Errorf("cgroups unavailable: %w", errkind.Unavailable)

// ErrNoController is returned by Create when a limit is asked for whose
// controller the hierarchy lacks.
var ErrNoController = fmt.Errorf("cgroup controller not available: %w", errkind.FailedPrecondition)

// ErrNotEmpty is returned by Remove while processes remain in the group.
var ErrNotEmpty = fmt.Errorf("cgroup has processes: %w", errkind.FailedPrecondition)

// Controller names a cgroup controller. Its value is the kernel's name.
type Controller string

// The controllers this package uses. On v2 only CPU, Memory and Pids are
// controllers to enable; freezing and the CPU time statistic are core
// features there.
const (
	CPU     Controller = "cpu"
	CPUAcct Controller = "cpuacct"
	Memory  Controller = "memory"
	Pids    Controller = "pids"
	Freezer Controller = "freezer"
)

var (
	v1Controllers = []Controller{CPU, CPUAcct, Memory, Pids, Freezer}
	v2Controllers = []Controller{CPU, Memory, Pids}
)

// Hierarchy is a cgroup file system that groups are made in. Make one with
// Detect, NewV1 or NewV2.
type Hierarchy struct {
	version int
	// v2 is the directory groups are made under on v2; "" on v1.
	v2 string
	// v1 maps each available v1 controller to its mount; nil on v2.
	v1 map[Controller]string
	// roots are the distinct directories groups are made under: v2, or
	// the v1 mounts (one for co-mounted controllers such as cpu,cpuacct)
	// followed by the other hierarchies mounted beside them (members).
	roots []string
	// cpuset is the root of the v1 cpuset hierarchy when it is among
	// roots: a new group there must be given its parent's CPUs and memory
	// nodes before a process can join it.
	cpuset string
	// controllers are those available for limits and statistics.
	controllers []Controller
	// noKill makes Kill ignore cgroup.kill, for tests of the fallback.
	noKill bool
}

// Detect finds the host's cgroup hierarchy in /proc/self/mountinfo: v2 when
// /sys/fs/cgroup is the unified hierarchy; else v1 when any of the cpu,
// cpuacct, memory or pids controllers is mounted (legacy or hybrid hosts);
// else any cgroup2 mount. Controllers missing from a v1 host are left out
// (see [Hierarchy.Controllers]). The error wraps [ErrUnavailable] when
// cgroups cannot be used here.
func Detect() (*Hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("detect cgroups: %v: %w", err, ErrUnavailable)
	}
	defer f.Close()
	m, err := parseMountinfo(f)
	if err != nil {
		return nil, fmt.Errorf("detect cgroups: read mountinfo: %v: %w", err, ErrUnavailable)
	}
	v2, v1 := m.pick()
	switch {
	case v2 != "":
		return NewV2(v2)
	case v1 != nil:
		h, err := NewV1(v1)
		if err != nil {
			return nil, err
		}
		h.addMembers(m.besides(v1))
		return h, nil
	}
	return nil, fmt.Errorf("detect cgroups: no cgroup file system mounted: %w", ErrUnavailable)
}

// NewV2 returns the cgroup v2 hierarchy whose groups are made under root: a
// cgroup2 mount point or a subtree delegated to the caller. Limits need the
// cpu, memory and pids controllers listed in root's cgroup.controllers; on
// a host whose controllers are bound to v1 there are none, and only groups
// without limits can be made. The error wraps [ErrUnavailable] when root is
// not writable.
func NewV2(root string) (*Hierarchy, error) {
	if err := checkRoot(root, unix.CGROUP2_SUPER_MAGIC); err != nil {
		return nil, fmt.Errorf("cgroup v2 root: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("cgroup v2 root: %w", err)
	}
	h := &Hierarchy{version: 2, v2: root, roots: []string{root}}
	have := strings.Fields(string(b))
	for _, c := range v2Controllers {
		if slices.Contains(have, string(c)) {
			h.controllers = append(h.controllers, c)
		}
	}
	return h, nil
}

// NewV1 returns the cgroup v1 hierarchy made of the given controller
// mounts. Each mount must be a writable cgroup v1 file system; co-mounted
// controllers (cpu,cpuacct) share one. The error wraps [ErrUnavailable]
// when a mount is not writable.
func NewV1(mounts map[Controller]string) (*Hierarchy, error) {
	if len(mounts) == 0 {
		return nil, fmt.Errorf("cgroup v1: no controller mounts: %w", ErrUnavailable)
	}
	for c := range mounts {
		if !slices.Contains(v1Controllers, c) {
			return nil, fmt.Errorf("cgroup v1: controller %q not supported: %w", c, errkind.InvalidArgument)
		}
	}
	h := &Hierarchy{version: 1, v1: make(map[Controller]string)}
	for _, c := range v1Controllers {
		dir, ok := mounts[c]
		if !ok {
			continue
		}
		if err := checkRoot(dir, unix.CGROUP_SUPER_MAGIC); err != nil {
			return nil, fmt.Errorf("cgroup v1 %s mount: %w", c, err)
		}
		h.v1[c] = dir
		h.controllers = append(h.controllers, c)
		if !slices.Contains(h.roots, dir) {
			h.roots = append(h.roots, dir)
		}
	}
	return h, nil
}

// checkRoot checks that dir is a writable file system of type magic.
func checkRoot(dir string, magic int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return &fs.PathError{Op: "statfs", Path: dir, Err: err}
	}
	if int64(st.Type) != magic {
		return fmt.Errorf("%s is not a cgroup file system of this version: %w", dir, errkind.InvalidArgument)
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return fmt.Errorf("%s not writable: %v: %w", dir, err, ErrUnavailable)
	}
	return nil
}

// Version returns 1 or 2.
func (h *Hierarchy) Version() int { return h.version }

// Controllers returns the controllers available for limits and statistics.
func (h *Hierarchy) Controllers() []Controller { return slices.Clone(h.controllers) }

func (h *Hierarchy) has(c Controller) bool { return slices.Contains(h.controllers, c) }

// Create makes the group name, with its parents as needed, and sets its
// limits. name is a relative path of components made of [A-Za-z0-9._-]
// separated by "/" (errkind.InvalidArgument otherwise). For an existing
// group Create sets the limits again, all of them: a zero limit removes
// one set before. A limit whose controller is missing gives
// [ErrNoController] and makes nothing.
func (h *Hierarchy) Create(name string, l Limits) (*Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := h.check(l); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	g := &Group{h: h, name: name}
	created, err := h.mkdir(name)
	if err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	if err := g.apply(l); err != nil {
		err = fmt.Errorf("create cgroup %s: %w", name, err)
		if created {
			err = errors.Join(err, g.Remove())
		}
		return nil, err
	}
	return g, nil
}

// mkdir makes name's directories under every root, enabling the v2
// controllers on the way down. created reports whether the group itself
// was new in any root.
func (h *Hierarchy) mkdir(name string) (created bool, err error) {
	parts := strings.Split(name, "/")
	for _, root := range h.roots {
		dir := root
		for _, p := range parts {
			if h.version == 2 {
				if err := enable(dir, h.controllers); err != nil {
					return created, err
				}
			}
			parent := dir
			dir = filepath.Join(dir, p)
			err := os.Mkdir(dir, 0o755)
			switch {
			case err == nil:
				created = true
			case !errors.Is(err, fs.ErrExist):
				return created, err
			default:
				if fi, err := os.Stat(dir); err != nil {
					return created, err
				} else if !fi.IsDir() {
					return created, fmt.Errorf("%s exists and is not a group: %w", dir, errkind.InvalidArgument)
				}
			}
			// Also when the group exists: a concurrent Create may have
			// made it and not yet filled its sets, and a child made
			// under it meanwhile would copy them empty (joining it then
			// fails with ENOSPC).
			if root == h.cpuset {
				if err := inheritCpuset(parent, dir); err != nil {
					return created, err
				}
			}
		}
	}
	return created, nil
}

// inheritCpuset gives the new v1 cpuset group dir its parent's CPUs and
// memory nodes, unless the kernel did (cgroup.clone_children): a process
// cannot join a cpuset group whose sets are empty.
func inheritCpuset(parent, dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(cur)) != "" {
			continue
		}
		v, err := os.ReadFile(filepath.Join(parent, f))
		if err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, f), strings.TrimSpace(string(v))); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
		}
	}
	return nil
}

// enable makes the v2 controllers cs available to dir's children, writing
// only those not yet in its cgroup.subtree_control.
func enable(dir string, cs []Controller) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	on := strings.Fields(string(b))
	var add []string
	for _, c := range cs {
		if !slices.Contains(on, string(c)) {
			add = append(add, "+"+string(c))
		}
	}
	if len(add) == 0 {
		return nil
	}
	return writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " "))
}

// Destroy kills everything in group name (and the groups below it) and
// removes it. A group that does not exist is no error.
func (h *Hierarchy) Destroy(ctx context.Context, name string) error {
	g, err := h.Open(name)
	if errors.Is(err, errkind.NotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := g.Kill(ctx); err != nil {
		return err
	}
	return g.Remove()
}

// Open returns the existing group name; errkind.NotFound when it exists in
// none of the hierarchy's roots. A group left half made on v1 (some
// controllers only) opens; Create it again to repair it.
func (h *Hierarchy) Open(name string) (*Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	g := &Group{h: h, name: name}
	for _, dir := range g.dirs() {
		fi, err := os.Stat(dir)
		if err == nil && fi.IsDir() {
			return g, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("open cgroup %s: %w", name, err)
		}
	}
	return nil, fmt.Errorf("cgroup %s does not exist: %w", name, errkind.NotFound)
}

// List returns the names of the groups directly under parent, sorted, such
// as every "space-w1/sbx_…" under "space-w1". parent "" lists the root,
// where other software's groups live too. A parent that does not exist has
// no children.
func (h *Hierarchy) List(parent string) ([]string, error) {
	if parent != "" {
		if err := checkName(parent); err != nil {
			return nil, err
		}
	}
	var names []string
	for _, root := range h.roots {
		entries, err := os.ReadDir(filepath.Join(root, parent))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list cgroups: %w", err)
		}
		for _, e := range entries {
			if n := path.Join(parent, e.Name()); e.IsDir() && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// checkName validates a group name.
func checkName(name string) error {
	why := ""
	switch {
	case name == "":
		why = "empty"
	case strings.HasPrefix(name, "/"):
		why = "absolute"
	}
	for p := range strings.SplitSeq(name, "/") {
		if why != "" {
			break
		}
		switch {
		case p == "":
			why = "empty component"
		case p == "." || p == "..":
			why = "component " + p
		case len(p) > 255:
			why = "component longer than 255 bytes"
		}
		for _, r := range p {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
				why = fmt.Sprintf("character %q not allowed", r)
				break
			}
		}
	}
	if why != "" {
		return fmt.Errorf("cgroup name %q: %s: %w", name, why, errkind.InvalidArgument)
	}
	return nil
}

// writeFile writes value to an existing cgroup file in one write(2), as
// the kernel wants.
func writeFile(name, value string) error {
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	return errors.Join(err, f.Close())
}

func exists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// At returns the hierarchy mounted at root, a path that need not be
// /sys/fs/cgroup: a cgroup2 file system (or a delegated subtree of one),
// or a directory holding cgroup v1 controller mounts as /sys/fs/cgroup
// does on a v1 host (cpu,cpuacct, memory, pids, ...). A worker in a
// container passes the host's hierarchy, mounted into it, so that its
// VMs live outside the container's own cgroup and outlive it. The error
// wraps errkind.InvalidArgument when root is neither, [ErrUnavailable]
// when it is not writable.
func At(root string) (*Hierarchy, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, fmt.Errorf("cgroup root: %w", &fs.PathError{Op: "statfs", Path: root, Err: err})
	}
	if int64(st.Type) == unix.CGROUP2_SUPER_MAGIC {
		return NewV2(root)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("cgroup root: %w", err)
	}
	mounts := map[Controller]string{}
	var others []string
	for _, e := range entries {
		if !e.IsDir() { // symlinks (cpu -> cpu,cpuacct) name a mount listed anyway
			continue
		}
		dir := filepath.Join(root, e.Name())
		var est unix.Statfs_t
		if unix.Statfs(dir, &est) != nil {
			continue
		}
		switch int64(est.Type) {
		case unix.CGROUP2_SUPER_MAGIC:
			others = append(others, dir)
			continue
		case unix.CGROUP_SUPER_MAGIC:
		default:
			continue
		}
		limits := false
		for _, name := range strings.Split(e.Name(), ",") {
			if c := Controller(name); slices.Contains(v1Controllers, c) {
				mounts[c] = dir
				limits = true
			}
		}
		if !limits {
			others = append(others, dir)
		}
	}
	if len(mounts) == 0 {
		return nil, fmt.Errorf("cgroup root %s: neither a cgroup2 file system nor a directory of cgroup v1 controller mounts: %w", root, errkind.InvalidArgument)
	}
	h, err := NewV1(mounts)
	if err != nil {
		return nil, err
	}
	h.addMembers(others)
	return h, nil
}

// addMembers adds the v1 host's other hierarchies, dirs, to the roots
// groups are made under, leaving out those not writable (a read-only
// mount cannot hold our groups; a runtime that mounted it so does not
// manage processes through it either).
func (h *Hierarchy) addMembers(dirs []string) {
	for _, dir := range dirs {
		if slices.Contains(h.roots, dir) || unix.Access(dir, unix.W_OK) != nil {
			continue
		}
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) != nil || (int64(st.Type) != unix.CGROUP_SUPER_MAGIC && int64(st.Type) != unix.CGROUP2_SUPER_MAGIC) {
			continue
		}
		h.roots = append(h.roots, dir)
		if exists(filepath.Join(dir, "cpuset.cpus")) && exists(filepath.Join(dir, "cpuset.mems")) {
			h.cpuset = dir
		}
	}
}

// Roots returns the directories groups are made under: the v2 root, or
// each distinct v1 mount (the limiting controllers' and the others beside
// them).
func (h *Hierarchy) Roots() []string { return slices.Clone(h.roots) }
