package jail

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// exitJailFailed is the jail's exit status when it could not be built.
const exitJailFailed = 126

// hostname is the UTS name inside a jail (instead of the host's).
const hostname = "jail"

// init turns this process into a jail when Command started it: it never
// returns then. Any binary that links this package can thus serve as its
// own jail, test binaries included, with no wiring in main.
func init() {
	if len(os.Args) < 3 || os.Args[0] != argv0 {
		return
	}
	// no_new_privs and the capability bounding set belong to a thread:
	// set them on the one that calls execve. (Package init runs on the
	// main thread; the lock makes that explicit.)
	runtime.LockOSThread()
	var cfg Config
	err := json.Unmarshal([]byte(os.Args[1]), &cfg)
	if err == nil {
		err = enter(cfg, os.Args[2], os.Args[2:])
	}
	fmt.Fprintf(os.Stderr, "space-jail: %v\n", err)
	os.Exit(exitJailFailed)
}

// enter builds the jail in the namespaces this process was started in and
// execs path with argv. It returns only on failure.
func enter(cfg Config, path string, argv []string) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if os.Getpid() != 1 {
		return errors.New("not started by jail.Command (no pid namespace of its own)")
	}
	// Nothing below propagates to the host's mounts.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := cfg.Mountpoint
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("mount root tmpfs on %s: %w", root, err)
	}
	for _, p := range cfg.ReadOnly {
		if err := bindReadOnly(root, p); err != nil {
			return err
		}
	}
	for _, d := range cfg.Devices {
		if err := bindDevice(root, d); err != nil {
			return err
		}
	}
	for _, b := range cfg.Binds {
		if err := bind(root, b); err != nil {
			return err
		}
	}
	for _, o := range cfg.Overlays {
		if err := mountOverlay(root, o); err != nil {
			return err
		}
	}
	if cfg.PTYs {
		if err := mountPTYs(root); err != nil {
			return err
		}
	}
	if err := mountProc(filepath.Join(root, "proc")); err != nil {
		return err
	}
	if err := pivot(root); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make root read-only: %w", err)
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := dropPrivileges(cfg); err != nil {
		return err
	}
	err := unix.Exec(path, argv, os.Environ())
	return fmt.Errorf("exec %s: %w", path, err)
}

// bindReadOnly puts the host's path p at root/p, read-only.
func bindReadOnly(root, p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	dst := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.IsDir():
		err = os.Mkdir(dst, 0o755)
	default:
		err = createEmpty(dst)
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := unix.Mount(p, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", p, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", p, err)
	}
	return nil
}

// bind puts the host's b.Source at root/b.Target.
func bind(root string, b Bind) error {
	fi, err := os.Stat(b.Source)
	if err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	dst := filepath.Join(root, b.Target)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.IsDir() {
		err = os.Mkdir(dst, 0o755)
	} else {
		err = createEmpty(dst)
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := unix.Mount(b.Source, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s to %s: %w", b.Source, b.Target, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV)
	if !b.Writable {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", b.Target, err)
	}
	return nil
}

// mountOverlay mounts o at root/o.Lower.
func mountOverlay(root string, o Overlay) error {
	dst := filepath.Join(root, o.Lower)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	opts := "lowerdir=" + o.Lower + ",upperdir=" + o.Upper + ",workdir=" + o.Work
	if err := unix.Mount("overlay", dst, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", o.Lower, err)
	}
	return nil
}

// mountPTYs mounts a new devpts instance at root/dev/pts and points
// root/dev/ptmx at its multiplexer.
func mountPTYs(root string) error {
	pts := filepath.Join(root, "dev", "pts")
	if err := os.MkdirAll(pts, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := os.Symlink("pts/ptmx", filepath.Join(root, "dev", "ptmx")); err != nil {
		return err
	}
	return nil
}

// bindDevice puts the host's device node d at root/d.
func bindDevice(root, d string) error {
	fi, err := os.Stat(d)
	if err != nil {
		return fmt.Errorf("device: %w", err)
	}
	if fi.Mode()&os.ModeDevice == 0 {
		return fmt.Errorf("device %s is not a device node", d)
	}
	dst := filepath.Join(root, d)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := createEmpty(dst); err != nil {
		return err
	}
	if err := unix.Mount(d, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", d, err)
	}
	if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("remount %s: %w", d, err)
	}
	return nil
}

func createEmpty(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// mountProc mounts the PID namespace's proc at dir: only the process
// directories where the kernel can hide the rest (subset=pid, Linux 5.8).
func mountProc(dir string) error {
	if err := os.Mkdir(dir, 0o555); err != nil {
		return err
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	err := unix.Mount("proc", dir, "proc", flags, "subset=pid")
	if errors.Is(err, unix.EINVAL) {
		err = unix.Mount("proc", dir, "proc", flags, "")
	}
	if err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	return nil
}

// pivot makes root the root of the mount namespace and detaches the old
// one, with everything mounted below it.
func pivot(root string) error {
	old := filepath.Join(root, ".old")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := os.Remove("/.old"); err != nil {
		return err
	}
	return nil
}

// dropPrivileges empties the bounding set, becomes cfg's user and sets
// no_new_privs. Setting the uid from 0 to another clears the permitted,
// effective and ambient capabilities.
func dropPrivileges(cfg Config) error {
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past the last capability this kernel knows
		}
		if err != nil {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	groups := make([]int, len(cfg.Groups))
	for i, g := range cfg.Groups {
		groups[i] = int(g)
	}
	// The syscall package applies these to every thread of the process.
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("set groups: %w", err)
	}
	if err := syscall.Setresgid(int(cfg.GID), int(cfg.GID), int(cfg.GID)); err != nil {
		return fmt.Errorf("set gid %d: %w", cfg.GID, err)
	}
	if err := syscall.Setresuid(int(cfg.UID), int(cfg.UID), int(cfg.UID)); err != nil {
		return fmt.Errorf("set uid %d: %w", cfg.UID, err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	return nil
}
