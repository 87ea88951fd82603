// Package guestinit turns the initramfs the agent starts in into the
// sandbox's root: it loads kernel modules, mounts the read-only template
// root under a per-sandbox writable layer (overlayfs), switches into it and
// mounts the usual pseudo file systems.
//
// The kernel command line configures it (space.* keys, see Params).
package guestinit

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Params are the space.* keys of the kernel command line.
type Params struct {
	Root      string // space.root: template root device; "" = /dev/vda
	RootFS    string // space.rootfstype: "" = ext4
	RW        string // space.rw: writable layer device; "" = tmpfs (lost at power-off)
	Hostname  string // space.hostname: "" = "sandbox"
	Transport string // space.transport: "virtio-serial" (default) or "vsock"
	Port      string // space.port: virtio-serial port name; "" = "space.agent"
	VsockPort uint32 // space.vsock_port: "" = 1024
	Debug     bool   // space.debug=1: debug logging
}

// ParseCmdline reads Params from a kernel command line.
func ParseCmdline(cmdline string) (Params, error) {
	p := Params{Root: "/dev/vda", RootFS: "ext4", Hostname: "sandbox", Transport: "virtio-serial", Port: "space.agent", VsockPort: 1024}
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "space.root":
			p.Root = v
		case "space.rootfstype":
			p.RootFS = v
		case "space.rw":
			p.RW = v
		case "space.hostname":
			p.Hostname = v
		case "space.transport":
			if v != "virtio-serial" && v != "vsock" {
				return p, fmt.Errorf("space.transport=%q: want virtio-serial or vsock", v)
			}
			p.Transport = v
		case "space.port":
			p.Port = v
		case "space.vsock_port":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return p, fmt.Errorf("space.vsock_port=%q: %w", v, err)
			}
			p.VsockPort = uint32(n)
		case "space.debug":
			p.Debug = v == "1" || v == "true"
		}
	}
	return p, nil
}

// Init prepares the guest. It runs as PID 1 from the initramfs and leaves
// the process chrooted into the sandbox root.
type Init struct {
	log *slog.Logger
}

// New returns an Init that logs to log.
func New(log *slog.Logger) *Init { return &Init{log: log} }

// EarlyMounts mounts /dev, /proc and /sys of the initramfs.
func (in *Init) EarlyMounts() error {
	for _, m := range []mount{
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	} {
		if err := m.do(); err != nil {
			return err
		}
	}
	return nil
}

// LoadModules loads the modules listed in /lib/modules/<release>/load.order,
// in that order (the image tool wrote it dependencies first).
func (in *Init) LoadModules() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]))
	f, err := os.Open(filepath.Join(dir, "load.order"))
	if errors.Is(err, os.ErrNotExist) {
		in.log.Warn("no module list; assuming a kernel with built-in drivers", "dir", dir)
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var errs []error
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		if err := loadModule(filepath.Join(dir, name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, sc.Err())...)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", filepath.Base(path), err)
	}
	return nil
}

// Mount paths inside the initramfs. They stay mounted but unreachable once
// the agent has switched into the sandbox root.
const (
	lowerDir = "/mnt/lower"
	rwDir    = "/mnt/rw"
	newRoot  = "/mnt/root"
)

// MountRoot mounts the template root read-only, the writable layer, and the
// overlay of the two at newRoot.
func (in *Init) MountRoot(p Params) error {
	if err := waitDevice(p.Root, 10*time.Second); err != nil {
		return err
	}
	for _, d := range []string{lowerDir, rwDir, newRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := (mount{p.Root, lowerDir, p.RootFS, unix.MS_RDONLY, ""}).do(); err != nil {
		return err
	}
	if p.RW != "" {
		if err := waitDevice(p.RW, 10*time.Second); err != nil {
			return err
		}
		if err := (mount{p.RW, rwDir, "ext4", unix.MS_NOATIME, ""}).do(); err != nil {
			return err
		}
	} else {
		in.log.Warn("no writable layer device; changes live in memory only")
		if err := (mount{"tmpfs", rwDir, "tmpfs", 0, "mode=0755"}).do(); err != nil {
			return err
		}
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(rwDir, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lowerDir, rwDir, rwDir)
	return (mount{"overlay", newRoot, "overlay", 0, opts}).do()
}

// SwitchRoot moves /dev into the new root, makes it / (the initramfs cannot
// be pivoted away from, so this is the switch_root dance: move, chroot) and
// mounts the pseudo file systems a sandbox expects.
func (in *Init) SwitchRoot() error {
	if err := os.MkdirAll(newRoot+"/dev", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/dev", newRoot+"/dev", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move /dev: %w", err)
	}
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	for _, m := range []mount{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	} {
		if err := m.do(); err != nil {
			return err
		}
	}
	// /dev/ptmx must be the devpts one for ptys opened inside the root.
	os.Remove("/dev/ptmx")
	if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
		return fmt.Errorf("link /dev/ptmx: %w", err)
	}
	for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}} {
		os.Symlink(l[0], l[1]) // devtmpfs may lack them; existing ones are fine
	}
	return nil
}

// Identity sets the hostname and brings up the loopback interface.
func (in *Init) Identity(p Params) error {
	if err := unix.Sethostname([]byte(p.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	return loopbackUp()
}

// loopbackUp sets IFF_UP on lo with an ioctl (no netlink needed).
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// SyncDisks flushes and remounts the sandbox root read-only, so a power-off
// leaves a clean writable layer.
func SyncDisks() {
	unix.Sync()
	unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
	unix.Sync()
}

func waitDevice(dev string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(dev); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("device %s did not appear within %v", dev, timeout)
		}
		time.Sleep(10 * time.Millisecond) // boot only: devtmpfs has no event we can wait on without udev
	}
}

type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

func (m mount) do() error {
	if err := os.MkdirAll(m.target, 0o755); err != nil {
		return err
	}
	err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
	if errors.Is(err, unix.EBUSY) {
		return nil // already mounted (devtmpfs with CONFIG_DEVTMPFS_MOUNT)
	}
	if err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", m.source, m.target, m.fstype, err)
	}
	return nil
}

// Args encodes p as space.* kernel command-line keys, the inverse of
// ParseCmdline. Empty fields are left out (the guest uses its defaults).
func (p Params) Args() []string {
	var args []string
	add := func(k, v string) {
		if v != "" {
			args = append(args, k+"="+v)
		}
	}
	add("space.root", p.Root)
	add("space.rootfstype", p.RootFS)
	add("space.rw", p.RW)
	add("space.hostname", p.Hostname)
	add("space.transport", p.Transport)
	add("space.port", p.Port)
	if p.VsockPort != 0 {
		add("space.vsock_port", strconv.FormatUint(uint64(p.VsockPort), 10))
	}
	if p.Debug {
		add("space.debug", "1")
	}
	return args
}
