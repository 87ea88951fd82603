// Package jail starts a program the way Firecracker's jailer starts
// Firecracker: as an unprivileged user, without new privileges, in new
// network, mount, PID, IPC and UTS namespaces whose root holds only what
// the program needs.
//
// # Mechanism
//
// [Command] returns an exec.Cmd that starts this very binary again
// (/proc/self/exe) under the name "space-jail", in fresh namespaces
// (SysProcAttr.Cloneflags), as root. The package's init function
// recognizes that name and, before main runs, builds the root and execs
// the real program:
//
//  1. marks every mount a slave (MS_REC|MS_SLAVE), so nothing it mounts
//     reaches the host and nothing the host unmounts stays pinned here;
//  2. mounts a small tmpfs on Config.Mountpoint (any existing directory:
//     the mount exists only in the new namespace) and bind-mounts into it,
//     read-only and at their own paths, the Config.ReadOnly paths (a
//     symlink such as /lib -> usr/lib is recreated as a symlink), and the
//     Config.Devices nodes under /dev, then the Config.Binds at their
//     targets (read-write where asked: the only writable places), and a
//     devpts of its own when Config.PTYs, and the Config.Overlays;
//  3. mounts a proc of the new PID namespace (subset=pid where the kernel
//     has it: no /proc/sys, no kernel-wide files);
//  4. pivot_root(2)s into the tmpfs and detaches the old root, so the
//     host's file system is gone from the namespace, not merely out of
//     reach as after chroot(2); then makes the root read-only;
//  5. empties the capability bounding set, sets the groups, gid and uid
//     (all of real, effective and saved), sets no_new_privs, and execs.
//
// The new network namespace holds only a loopback device that is down:
// no address, no route, so the program reaches nothing by IP, not even
// 127.0.0.1. It talks to the world only through descriptors it inherits
// (unix sockets, a tap opened in another namespace). The new PID
// namespace means it cannot see or signal any other process (another
// jail's, running as the same uid, included); the program becomes its
// PID 1, so only signals it handles, and SIGKILL and SIGSTOP from the
// host, reach it.
//
// Why a re-exec and not SysProcAttr.Chroot: Go's fork path can unshare
// namespaces and chroot, but it cannot mount, so the root would have to
// be assembled with mounts in the host's namespace, where a crash of the
// caller between mounting and unmounting leaks them (and an unmount there
// propagates into peer namespaces); and chroot(2) leaves the whole host
// tree in the namespace, one escape away. Here every mount is made inside
// the new mount namespace, after it is private: the host never sees one.
// A jail therefore leaves nothing behind on the host: its namespaces and
// mounts end with the program's last process, whether the caller is
// still running, restarted or crashed, and there is nothing to clean up.
//
// Requirements: root in the initial user namespace (no user namespaces
// are used), a kernel with PID, network and mount namespaces, and a root
// file system that is a mount point (pivot_root). [Probe] checks them.
package jail

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"space/internal/errkind"
)

// argv0 is the name this binary is re-executed under to act as a jail.
const argv0 = "space-jail"

// Cloneflags are the namespaces a jailed program gets of its own.
const Cloneflags = syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// Config describes one jail.
type Config struct {
	// UID and GID are the user and group the program runs as. Numeric ids
	// need no /etc/passwd or /etc/group entry: the kernel knows only
	// numbers.
	UID, GID uint32
	// Groups are supplementary groups; nil = none.
	Groups []uint32
	// Mountpoint is an existing directory the jail's root is mounted on
	// inside its own mount namespace; the host never sees that mount.
	// Required.
	Mountpoint string
	// ReadOnly are host paths the root holds at the same path, read-only:
	// directories and files are bind-mounted (not recursively: mounts
	// below them are not included), symlinks are recreated as symlinks
	// (list their targets too). Paths that do not exist are left out.
	ReadOnly []string
	// Devices are device nodes bind-mounted at the same path (under
	// /dev). A missing one is an error.
	Devices []string
	// Binds are host paths mounted at another path of the root, after
	// ReadOnly and Devices: read-only unless Writable. A missing source is
	// an error.
	Binds []Bind
	// Overlays are host directories seen through an overlay at their
	// own path, after Binds: the program reads the host's files and its
	// writes land in Upper, never in the host's directory.
	Overlays []Overlay
	// PTYs mounts a devpts of the jail's own at /dev/pts (with /dev/ptmx
	// pointing into it), so the program can open pseudo-terminals without
	// seeing the host's.
	PTYs bool
}

// Overlay shows the host directory Lower at the same path in the root,
// writable through an overlay file system whose upper layer is Upper (on
// the host: what the program writes there lands there) and whose work
// directory is Work (empty, on Upper's file system). Upper's directories'
// owners and modes are those the program sees: a directory the program
// should be able to write in is one its user owns in Upper.
type Overlay struct {
	Lower string `json:"lower"`
	Upper string `json:"upper"`
	Work  string `json:"work"`
}

// Bind puts the host path Source (a directory or a file) at Target inside
// the root (bind mount, not recursive, nosuid and nodev). A Writable bind
// is how a jailed program gets a place to write: whatever it writes there
// lands in Source, on the host, and outlives the jail.
type Bind struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	Writable bool   `json:"writable,omitempty"`
}

func (c Config) validate() error {
	if c.Mountpoint == "" || !strings.HasPrefix(c.Mountpoint, "/") {
		return fmt.Errorf("jail mountpoint %q, want an absolute path: %w", c.Mountpoint, errkind.InvalidArgument)
	}
	paths := append(append([]string(nil), c.ReadOnly...), c.Devices...)
	for _, b := range c.Binds {
		paths = append(paths, b.Source, b.Target)
	}
	for _, o := range c.Overlays {
		paths = append(paths, o.Lower, o.Upper, o.Work)
		if strings.ContainsAny(o.Lower+o.Upper+o.Work, ",:\\") {
			return fmt.Errorf("jail overlay %+v: paths must not contain ',', ':' or '\\': %w", o, errkind.InvalidArgument)
		}
	}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/") || p == "/" || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
			return fmt.Errorf("jail path %q, want an absolute path below /: %w", p, errkind.InvalidArgument)
		}
	}
	for _, d := range c.Devices {
		if !strings.HasPrefix(d, "/dev/") {
			return fmt.Errorf("jail device %q, want a path under /dev: %w", d, errkind.InvalidArgument)
		}
	}
	return nil
}

// Command returns a Cmd that runs the program at path (absolute, and
// inside one of cfg.ReadOnly) with args in a new jail. The caller may set
// the Cmd's Env, Dir, Stdin, Stdout, Stderr and ExtraFiles (which the
// program inherits as usual) and further SysProcAttr fields (a process
// group, a cgroup), but must keep SysProcAttr.Cloneflags and must not set
// Credential or Chroot: the jail sets the user itself. Only root can start
// the Cmd. If the jail cannot be built, the Cmd exits with status 126
// after a line on its stderr that starts with "space-jail:".
func Command(cfg Config, path string, args ...string) (*exec.Cmd, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("jail program %q, want an absolute path: %w", path, errkind.InvalidArgument)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("jail config: %w", err)
	}
	return &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        append([]string{argv0, string(b), path}, args...),
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: Cloneflags},
	}, nil
}

// Probe checks that this host can jail a program: it jails path with
// args (a quick command such as "-version") under cfg and waits for it to
// exit. The error says what failed: errkind.FailedPrecondition when the
// caller is not root or the host lacks a mechanism.
func Probe(ctx context.Context, cfg Config, path string, args ...string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("jail needs root, running as uid %d: %w", os.Geteuid(), errkind.FailedPrecondition)
	}
	cmd, err := Command(cfg, path, args...)
	if err != nil {
		return err
	}
	cmd.Env = []string{}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("jail probe: %w: %w", err, errkind.FailedPrecondition)
	}
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	err = cmd.Wait()
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("jail probe: %w", context.Cause(ctx))
		}
		return fmt.Errorf("jail probe: %s: %w: %w", strings.TrimSpace(out.String()), err, errkind.FailedPrecondition)
	}
	return nil
}
