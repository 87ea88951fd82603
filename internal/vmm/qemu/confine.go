package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"space/internal/errkind"
	"space/internal/jail"
	"space/internal/vmm"
)

// JailMode says whether QEMU runs in a jail (see the package doc).
type JailMode string

const (
	// JailAuto jails QEMU where the host can, and where it cannot runs
	// QEMU unjailed, logs why and reports it in every VM's
	// vmm.Confinement.
	JailAuto JailMode = ""
	// JailRequire makes Boot fail where the host cannot jail QEMU.
	JailRequire JailMode = "require"
	// JailOff never jails QEMU.
	JailOff JailMode = "off"
)

// DefaultUID and DefaultGID are the user and group QEMU runs as when the
// caller is root and Config.User is nil. The ids are numeric and need no /etc/passwd or
// /etc/group entry: the kernel knows users only by number, and nothing
// in a jail looks a name up. They are not nobody (65534), whose per-user
// kernel state (its user keyring, its process count under RLIMIT_NPROC)
// other daemons and NFS share, and they lie in a range that distributions,
// systemd (system, regular, dynamic, homed and container users) and
// subordinate-id allocators leave unused: 0x70000000 up to systemd's
// foreign range at 0x7FFE0000.
const (
	DefaultUID = 2_000_000_000
	DefaultGID = 2_000_000_000
)

// jailReadOnly is the host's file system as a jailed QEMU sees it: what
// it needs to exec (binary, libraries, loader cache) and to find its
// firmware and option ROMs (/usr/share/qemu, /usr/share/seabios,
// /usr/lib/ipxe), all read-only. Its own files arrive as descriptors.
var jailReadOnly = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache"}

// jailDevices are the device nodes a jailed QEMU gets (rng-random reads
// /dev/urandom); /dev/kvm is added for KVM guests.
var jailDevices = []string{"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}

// jailConfig is the jail of a VM of spec: its root is mounted on spec.Dir
// (in the jail's mount namespace only).
func (d *Driver) jailConfig(spec Spec) jail.Config {
	devs := jailDevices
	if spec.Accel == "kvm" {
		devs = append(append([]string(nil), devs...), "/dev/kvm")
	}
	ro := jailReadOnly
	if !underAny(d.jailBin, ro) {
		// A QEMU installed elsewhere: its prefix (bin/..) holds its
		// libraries and data (share/qemu).
		prefix := filepath.Dir(filepath.Dir(d.jailBin))
		if prefix == "/" {
			prefix = d.jailBin
		}
		ro = append(append([]string(nil), ro...), prefix)
	}
	return jail.Config{
		UID: d.user.UID, GID: d.user.GID, Groups: kvmGroup(spec.Accel),
		Mountpoint: spec.Dir, ReadOnly: ro, Devices: devs,
	}
}

func underAny(path string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// jailSupported reports whether QEMU runs jailed, and why not if it does
// not. The host is probed once, by jailing qemu -version with its root
// on dir (an existing directory: the probe creates nothing on the host).
func (d *Driver) jailSupported(ctx context.Context, dir string) (bool, string, error) {
	d.mu.Lock()
	s, why := d.jail, d.jailWhy
	d.mu.Unlock()
	if s != jailUnknown {
		return s == jailOn, why, nil
	}
	s, why = jailOn, ""
	switch {
	case d.jailMode == JailOff:
		s, why = jailOff, "jail turned off in the driver's config"
	case d.user == nil:
		s, why = jailOff, fmt.Sprintf("jail needs root, running as uid %d", os.Geteuid())
	default:
		cfg := d.jailConfig(Spec{Dir: dir, Accel: "tcg"})
		if err := jail.Probe(ctx, cfg, d.jailBin, "-version"); err != nil {
			if ctx.Err() != nil {
				return false, "", err
			}
			s, why = jailOff, err.Error()
		}
	}
	d.mu.Lock()
	first := d.jail == jailUnknown
	d.jail, d.jailWhy = s, why
	d.mu.Unlock()
	if first && s == jailOff && d.jailMode != JailOff {
		level := slog.LevelWarn
		if d.user != nil {
			level = slog.LevelError // root, so a host that should jail and cannot
		}
		d.log.Log(ctx, level, "qemu runs without jail: it shares the host's network and file system", "binary", d.bin, "reason", why)
	}
	if s == jailOff && d.jailMode == JailRequire {
		return false, why, fmt.Errorf("qemu jail required: %s: %w", why, errkind.FailedPrecondition)
	}
	return s == jailOn, why, nil
}

// observeConfinement reads how process pid is confined from /proc,
// compared with this process.
func observeConfinement(pid int, missing string) (vmm.Confinement, error) {
	c := vmm.Confinement{Missing: missing}
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return c, fmt.Errorf("confinement of qemu %d: %w", pid, err)
	}
	for line := range bytes.Lines(status) {
		key, val, _ := strings.Cut(string(line), ":")
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		switch key {
		case "Uid":
			if len(f) > 1 {
				n, _ := strconv.ParseUint(f[1], 10, 32) // effective
				c.UID = uint32(n)
			}
		case "Gid":
			if len(f) > 1 {
				n, _ := strconv.ParseUint(f[1], 10, 32)
				c.GID = uint32(n)
			}
		case "NoNewPrivs":
			c.NoNewPrivs = f[0] == "1"
		case "Seccomp":
			c.Seccomp = f[0] == "2"
		}
	}
	for _, ns := range []struct {
		name string
		on   *bool
	}{{"net", &c.NetNS}, {"mnt", &c.MountNS}, {"pid", &c.PIDNS}} {
		theirs, err1 := os.Readlink(filepath.Join(dir, "ns", ns.name))
		ours, err2 := os.Readlink(filepath.Join("/proc/self/ns", ns.name))
		if err := errors.Join(err1, err2); err != nil {
			return c, fmt.Errorf("confinement of qemu %d: %w", pid, err)
		}
		*ns.on = theirs != ours
	}
	theirs, err1 := os.ReadFile(filepath.Join(dir, "cgroup"))
	ours, err2 := os.ReadFile("/proc/self/cgroup")
	if err := errors.Join(err1, err2); err != nil {
		return c, fmt.Errorf("confinement of qemu %d: %w", pid, err)
	}
	c.Cgroup = !bytes.Equal(theirs, ours)
	return c, nil
}

// checkJailed returns an error if a QEMU that was jailed as user u (and
// with seccomp, if sandbox) is not confined that way.
func checkJailed(c vmm.Confinement, u User, sandbox bool) error {
	var lacks []string
	if c.UID != u.UID || c.GID != u.GID {
		lacks = append(lacks, fmt.Sprintf("runs as %d:%d, not %d:%d", c.UID, c.GID, u.UID, u.GID))
	}
	for _, f := range []struct {
		name string
		on   bool
	}{{"no_new_privs", c.NoNewPrivs}, {"network namespace", c.NetNS}, {"mount namespace", c.MountNS}, {"pid namespace", c.PIDNS}, {"seccomp", c.Seccomp || !sandbox}} {
		if !f.on {
			lacks = append(lacks, "no "+f.name)
		}
	}
	if len(lacks) > 0 {
		return fmt.Errorf("jailed qemu is not confined: %s", strings.Join(lacks, ", "))
	}
	return nil
}
