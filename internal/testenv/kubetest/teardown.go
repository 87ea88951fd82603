package kubetest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cleanHost removes everything a cluster run leaves on the machine once
// its components are stopped, or were killed with a run that never got to
// its cleanup: stray processes (pid files, containerd shims, containers
// in the kubepods cgroups), mounts, pod network namespaces, cgroups,
// kube-proxy's and the kubelet's iptables chains, the interfaces, CNI
// state, containerd's fixed runtime directories, pod log links, the
// sysctl Start changed, and StateDir itself. It is idempotent and keeps
// going past a failed step; the error joins every failure.
func cleanHost(p paths) error {
	errs := []error{
		killPidFiles(p.pids()),
		killByCmdline(p.root),
	}
	errs = append(errs, cleanCgroups()...)
	errs = append(errs,
		unmountUnder(p.root+"/", "/run/netns/cni-"),
		removeGlob("/run/netns/cni-*"),
		cleanIPTables(),
		deleteLink(bridgeIface),
		deleteLink(nodeIface),
		removeGlob("/var/lib/cni/results/"+cniNetwork+"-*"),
		removeContainerLinks(p.podLogs()),
		restoreSysctls(p),
	)
	if !containerdRunning() {
		// Shim sockets, the runc root and the CRI's loopback results
		// cannot be moved under StateDir in containerd 1.6; leave them to
		// a containerd that runs.
		errs = append(errs, os.RemoveAll("/run/containerd/s"), os.RemoveAll("/run/containerd/runc"),
			removeGlob("/var/lib/cni/results/cni-loopback-*"),
			removeEmpty("/run/containerd", "/var/lib/cni/results", "/var/lib/cni"))
	}
	if mounts, err := mountsUnder(p.root + "/"); err != nil || len(mounts) > 0 {
		errs = append(errs, fmt.Errorf("keep %s: still mounted below it: %v %w", p.root, mounts, err))
	} else {
		errs = append(errs, os.RemoveAll(p.root))
	}
	return errors.Join(errs...)
}

// cgroupMounts returns the mount points of every cgroup hierarchy, v1 and
// v2.
func cgroupMounts() ([]string, error) {
	ms, err := readMounts()
	if err != nil {
		return nil, err
	}
	var points []string
	for _, m := range ms {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			points = append(points, m.point)
		}
	}
	return points, nil
}

// cleanCgroups kills the processes left in the kubelet's kubepods cgroups
// of every hierarchy and removes the cgroups, innermost first.
func cleanCgroups() []error {
	points, err := cgroupMounts()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, pt := range points {
		root := filepath.Join(pt, "kubepods")
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs) // children before parents
		for _, d := range dirs {
			errs = append(errs, emptyCgroup(d))
		}
	}
	return errs
}

// emptyCgroup kills the processes in the cgroup dir and removes it.
func emptyCgroup(dir string) error {
	var last error
	for range 50 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				unix.Kill(pid, unix.SIGKILL)
			}
		}
		if last = unix.Rmdir(dir); last == nil || errors.Is(last, unix.ENOENT) {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // killed processes take a moment to leave; nothing to wait on
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, last)
}

type mount struct{ point, fstype string }

func readMounts() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ms []mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || len(fields) < sep+2 {
			continue
		}
		ms = append(ms, mount{point: unescapeOctal(fields[4]), fstype: fields[sep+1]})
	}
	return ms, sc.Err()
}

// unescapeOctal undoes mountinfo's escaping of spaces and such (\040).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountsUnder returns the mount points that start with one of prefixes,
// deepest (latest) first.
func mountsUnder(prefixes ...string) ([]string, error) {
	ms, err := readMounts()
	if err != nil {
		return nil, err
	}
	var points []string
	for _, m := range ms {
		for _, p := range prefixes {
			if strings.HasPrefix(m.point, p) {
				points = append(points, m.point)
				break
			}
		}
	}
	slices.Reverse(points)
	return points, nil
}

// unmountUnder detaches every mount below the prefixes.
func unmountUnder(prefixes ...string) error {
	points, err := mountsUnder(prefixes...)
	if err != nil {
		return err
	}
	var errs []error
	for _, pt := range points {
		if err := unix.Unmount(pt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", pt, err))
		}
	}
	return errors.Join(errs...)
}

func removeGlob(pattern string) error {
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range matches {
		errs = append(errs, os.RemoveAll(m))
	}
	return errors.Join(errs...)
}

// removeEmpty removes the directories dirs that are empty, in order.
func removeEmpty(dirs ...string) error {
	for _, d := range dirs {
		if ents, err := os.ReadDir(d); err == nil && len(ents) == 0 {
			if err := os.Remove(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeContainerLinks removes the kubelet's links in /var/log/containers
// that point into logDir (the pod logs of this cluster).
func removeContainerLinks(logDir string) error {
	const dir = "/var/log/containers"
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	left := 0
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, logDir+"/") {
			errs = append(errs, os.Remove(p))
			continue
		}
		left++
	}
	if left == 0 {
		errs = append(errs, os.Remove(dir)) // the kubelet made it
	}
	return errors.Join(errs...)
}

func deleteLink(name string) error {
	if _, err := os.Stat("/sys/class/net/" + name); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip link del %s: %v: %s", name, err, out)
	}
	return nil
}

// containerdRunning reports whether a containerd other than ours (which
// is stopped when this runs) is running.
func containerdRunning() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && strings.TrimSpace(string(b)) == "containerd" {
			return true
		}
	}
	return false
}

// ruleComment marks the iptables rules Start adds.
const ruleComment = "space-kubetest"

// cleanIPTables removes the KUBE-* chains kube-proxy and the kubelet add,
// in every table of iptables and ip6tables, with the jumps to them, and
// the rules marked ruleComment.
func cleanIPTables() error {
	var errs []error
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		for _, table := range []string{"nat", "filter", "mangle"} {
			errs = append(errs, cleanChains(tool, table))
		}
	}
	return errors.Join(errs...)
}

func cleanChains(tool, table string) error {
	out, err := exec.Command(tool, "-w", "-t", table, "-S").Output()
	if err != nil {
		return nil // the table is not there (no kernel support): nothing to clean
	}
	var ours []string
	var errs []error
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-"):
			ours = append(ours, f[1])
		case len(f) > 2 && f[0] == "-A" && !strings.HasPrefix(f[1], "KUBE-") && (jumpsToKube(f) || slices.Contains(f, ruleComment)):
			// A rule of a built-in chain that jumps to one of ours, or
			// one Start added.
			// iptables -S quotes as the shell would; our rules carry
			// comments without spaces inside quotes only.
			args := append([]string{"-w", "-t", table, "-D"}, unquote(f[1:])...)
			if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, out))
			}
		}
	}
	for _, op := range []string{"-F", "-X"} {
		for _, c := range ours {
			if out, err := exec.Command(tool, "-w", "-t", table, op, c).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s %s %s: %v: %s", tool, table, op, c, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

func jumpsToKube(f []string) bool {
	i := slices.Index(f, "-j")
	return i >= 0 && i+1 < len(f) && strings.HasPrefix(f[i+1], "KUBE-")
}

// unquote joins the shell-quoted words of an iptables -S line back into
// arguments.
func unquote(f []string) []string {
	var args []string
	for i := 0; i < len(f); i++ {
		w := f[i]
		if strings.HasPrefix(w, `"`) {
			for !strings.HasSuffix(w, `"`) || len(w) == 1 {
				if i+1 >= len(f) {
					break
				}
				i++
				w += " " + f[i]
			}
			w = strings.Trim(w, `"`)
		}
		args = append(args, w)
	}
	return args
}

// The sysctls Start sets, with the file that keeps their earlier values.
var sysctls = []string{"net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"}

func sysctlSaved(p paths, key string) string {
	return p.join("sysctl", strings.ReplaceAll(key, "/", "."))
}

// setSysctls records the current values of sysctls and sets them to 1:
// pods route through the host, and bridged pod-to-pod replies of Service
// traffic must pass kube-proxy's conntrack.
func setSysctls(p paths) error {
	for _, key := range sysctls {
		path := "/proc/sys/" + key
		old, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("sysctl %s (is br_netfilter loaded?): %w", key, err)
		}
		if err := writeFile(sysctlSaved(p, key), string(old), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", key, err)
		}
	}
	return nil
}

func restoreSysctls(p paths) error {
	var errs []error
	for _, key := range sysctls {
		old, err := os.ReadFile(sysctlSaved(p, key))
		if err != nil {
			continue // never changed
		}
		errs = append(errs, os.WriteFile("/proc/sys/"+key, old, 0o644))
	}
	return errors.Join(errs...)
}
