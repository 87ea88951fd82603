package firecracker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// JailerConfig runs each Firecracker process through the jailer: a chroot
// of its own, a mount namespace, an unprivileged uid/gid, and the network
// namespace of the spec's NIC (--netns). The caller runs as root.
type JailerConfig struct {
	// Binary is the jailer executable, a path or a name looked up on PATH;
	// "" means jailer. It must be the release of Config.Binary.
	Binary string
	// UID and GID are what Firecracker runs as. Required, not 0. Clones
	// restored from one snapshot share them (they read its files).
	UID, GID int
	// ChrootBaseDir holds the jails, <base>/<firecracker binary name>/<id>/root;
	// "" means /srv/jailer. Writable disks and snapshots must be on its
	// file system: they are hard-linked into the jail, never copied.
	ChrootBaseDir string
	// CgroupVersion is 1 or 2; 0 detects it from /sys/fs/cgroup.
	CgroupVersion int
	// ParentCgroup is the jailer's --parent-cgroup, or "" for its default
	// (the firecracker binary's name).
	ParentCgroup string
}

// jailer is a validated JailerConfig.
type jailer struct {
	bin           string
	uid, gid      int
	base          string
	cgroupVersion int
	parentCgroup  string
	// exeName is the name the jailer gives the chroot's parent: the base
	// name of the firecracker binary after resolving symlinks.
	exeName string
}

func newJailer(cfg JailerConfig, firecracker string) (*jailer, error) {
	bin := cfg.Binary
	if bin == "" {
		bin = "jailer"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("jailer binary %q: %w: %w", bin, err, errkind.FailedPrecondition)
	}
	if cfg.UID <= 0 || cfg.GID <= 0 {
		return nil, fmt.Errorf("jailer uid %d, gid %d: want unprivileged ids: %w", cfg.UID, cfg.GID, errkind.InvalidArgument)
	}
	real, err := filepath.EvalSymlinks(firecracker)
	if err != nil {
		return nil, fmt.Errorf("firecracker binary: %w: %w", err, errkind.FailedPrecondition)
	}
	base := cfg.ChrootBaseDir
	if base == "" {
		base = "/srv/jailer"
	}
	if base, err = filepath.Abs(base); err != nil {
		return nil, fmt.Errorf("chroot base dir: %w: %w", err, errkind.InvalidArgument)
	}
	v := cfg.CgroupVersion
	switch v {
	case 0:
		var fs unix.Statfs_t
		if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil {
			return nil, fmt.Errorf("detect cgroup version: %w: %w", err, errkind.FailedPrecondition)
		}
		v = cgroupVersion(fs.Type)
	case 1, 2:
	default:
		return nil, fmt.Errorf("cgroup version %d: want 1 or 2: %w", v, errkind.InvalidArgument)
	}
	return &jailer{
		bin: path, uid: cfg.UID, gid: cfg.GID, base: base,
		cgroupVersion: v, parentCgroup: cfg.ParentCgroup, exeName: filepath.Base(real),
	}, nil
}

// cgroupVersion maps the file system type of /sys/fs/cgroup to the
// jailer's --cgroup-version: cgroup2fs is 2, anything else (a tmpfs of v1
// hierarchies) is 1. The jailer itself defaults to 1.
func cgroupVersion(fsType int64) int {
	if fsType == unix.CGROUP2_SUPER_MAGIC {
		return 2
	}
	return 1
}

// dir is the jail of instance id (removed by Stop), chroot its root.
func (j *jailer) dir(id string) string    { return filepath.Join(j.base, j.exeName, id) }
func (j *jailer) chroot(id string) string { return filepath.Join(j.dir(id), "root") }

// args is the jailer command line for instance id, joining the network
// namespace at netns ("" = none). The jailer adds --id to Firecracker's
// arguments itself; the ones after "--" are passed on. No --daemonize:
// Firecracker keeps our stdout and stderr (the logs). No --new-pid-ns:
// the pid we start is Firecracker's (the jailer execs it), and SIGTERM
// reaches it (the init of a pid namespace ignores it).
func (j *jailer) args(firecracker, id, netns string) []string {
	args := []string{
		"--id", id,
		"--exec-file", firecracker,
		"--uid", strconv.Itoa(j.uid),
		"--gid", strconv.Itoa(j.gid),
		"--chroot-base-dir", j.base,
		"--cgroup-version", strconv.Itoa(j.cgroupVersion),
	}
	if j.parentCgroup != "" {
		args = append(args, "--parent-cgroup", j.parentCgroup)
	}
	if netns != "" {
		args = append(args, "--netns", netns)
	}
	return append(args, "--", "--api-sock", apiSocket)
}

// place puts a file into the jail's root. Files Firecracker writes (and
// linkOnly ones) are hard links; a writable one is handed to the jail's
// uid. A read-only file is shared by hard link only if the jail can read
// it as it is: it is never chowned, since a shared image owned by the
// jail uid would be writable from every jail. Otherwise it is copied
// (sparse) and the copy is the jail's.
func (j *jailer) place(p placement, dst string) error {
	if err := removeIfExists(dst); err != nil {
		return err
	}
	if p.writable || p.linkOnly {
		fi, err := os.Stat(p.src)
		if err != nil {
			return err
		}
		if !p.writable && !readableBy(fi, j.uid, j.gid) {
			return fmt.Errorf("%s is not readable by jail uid %d / gid %d: %w", p.src, j.uid, j.gid, errkind.FailedPrecondition)
		}
		if err := os.Link(p.src, dst); err != nil {
			if errors.Is(err, syscall.EXDEV) {
				return fmt.Errorf("%s must be on the file system of %s to be linked into the jail: %w", p.src, j.base, errkind.FailedPrecondition)
			}
			return err
		}
		if p.writable {
			return os.Lchown(dst, j.uid, j.gid)
		}
		return nil
	}
	fi, err := os.Stat(p.src)
	if err != nil {
		return err
	}
	if readableBy(fi, j.uid, j.gid) {
		err := os.Link(p.src, dst)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, syscall.EPERM) {
			return err
		}
	}
	if err := copySparse(p.src, dst, 0o400); err != nil {
		return err
	}
	return os.Lchown(dst, j.uid, j.gid)
}

// readableBy reports whether uid:gid may read the file by its mode bits.
func readableBy(fi os.FileInfo, uid, gid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	perm := fi.Mode().Perm()
	switch {
	case int(st.Uid) == uid:
		return perm&0o400 != 0
	case int(st.Gid) == gid:
		return perm&0o040 != 0
	default:
		return perm&0o004 != 0
	}
}

// copySparse copies src to a new file dst, keeping holes (SEEK_DATA /
// SEEK_HOLE): a sparse disk or diff-snapshot layer stays sparse.
func copySparse(src, dst string, perm os.FileMode) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	sc, err := in.SyscallConn()
	if err != nil {
		return err
	}
	seek := func(off int64, whence int) (n int64, err error) {
		if cerr := sc.Control(func(fd uintptr) { n, err = unix.Seek(int(fd), off, whence) }); cerr != nil {
			return 0, cerr
		}
		return n, err
	}
	for off := int64(0); off < size; {
		data, err := seek(off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		end := size
		if err == nil {
			if end, err = seek(data, unix.SEEK_HOLE); err != nil {
				return err
			}
		} else if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			data = off // no hole support: copy the rest
		} else {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, end-data)); err != nil {
			return err
		}
		off = end
	}
	return out.Sync()
}
