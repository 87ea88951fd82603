package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// describe completes info, the FileInfo of the path p, with what fileInfo
// does not know: a symlink's target, the owner's and group's names and
// the user extended attributes.
func (s *Server) describe(p string, info *proto.FileInfo) {
	if info.Type == proto.FileSymlink {
		info.Target, _ = os.Readlink(p)
	}
	info.Owner, info.Group = s.names.lookup(info.UID, info.GID)
	info.Xattrs = userXattrs(p)
}

// userXattrs returns the user.* extended attributes of p (not following
// a symlink) without the prefix, as proto.FileInfo.Xattrs holds them, or
// nil. A file system without extended attributes has none.
func userXattrs(p string) map[string]string {
	size, err := unix.Llistxattr(p, nil)
	if err != nil || size <= 0 {
		return nil
	}
	buf := make([]byte, size+256) // it may grow between the calls
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	var keys []string
	for name := range bytes.SplitSeq(buf[:n], []byte{0}) {
		key, ok := strings.CutPrefix(string(name), "user.")
		if ok && proto.CheckXattr(key, "") == nil {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	out := map[string]string{}
	val := make([]byte, proto.MaxXattrValue)
	for _, key := range keys {
		if len(out) == proto.MaxXattrs {
			break
		}
		n, err := unix.Lgetxattr(p, "user."+key, val)
		if err != nil {
			continue // removed meanwhile, or larger than we report (ERANGE)
		}
		out[key] = string(val[:n])
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// setXattrs sets xattrs on f as user.<key> extended attributes. A file
// system that has none is FailedPrecondition; attributes that do not fit
// are ResourceExhausted.
func setXattrs(f *os.File, xattrs map[string]string) error {
	if len(xattrs) == 0 {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(xattrs))
	for k := range xattrs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.Fsetxattr(int(fd), "user."+k, []byte(xattrs[k]), 0)
		}); err != nil {
			return err
		}
		switch {
		case serr == nil:
		case errors.Is(serr, unix.ENOTSUP):
			return fmt.Errorf("set metadata on %s: its file system does not support user extended attributes (%v): %w", f.Name(), serr, errkind.FailedPrecondition)
		case errors.Is(serr, unix.ENOSPC), errors.Is(serr, unix.E2BIG), errors.Is(serr, unix.EDQUOT):
			return fmt.Errorf("set metadata %s on %s: the attributes do not fit (%v): %w", k, f.Name(), serr, errkind.ResourceExhausted)
		default:
			return fmt.Errorf("set metadata %s on %s: %w", k, f.Name(), serr)
		}
	}
	return nil
}

// checkXattrs checks the attributes a write asks for.
func checkXattrs(xattrs map[string]string) error {
	if len(xattrs) > proto.MaxXattrs {
		return fmt.Errorf("%d metadata entries, want at most %d: %w", len(xattrs), proto.MaxXattrs, errkind.InvalidArgument)
	}
	for k, v := range xattrs {
		if err := proto.CheckXattr(k, v); err != nil {
			return err
		}
	}
	return nil
}

// names resolves user and group IDs through the guest's /etc/passwd and
// /etc/group, read again when they change.
type names struct {
	mu sync.Mutex
	// +checklocks:mu
	users idFile
	// +checklocks:mu
	groups idFile
}

// idFile is one parsed ID file and the identity of the version parsed.
type idFile struct {
	stamp [3]int64 // inode, size, mtime; zero before the first read
	byID  map[uint32]string
}

// lookup returns the names of uid and gid, "" for an ID without one.
func (n *names) lookup(uid, gid uint32) (user, group string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.users.refresh("/etc/passwd")
	n.groups.refresh("/etc/group")
	return n.users.byID[uid], n.groups.byID[gid]
}

// refresh parses path again when it changed since the last time; a file
// that cannot be read names nobody.
func (f *idFile) refresh(path string) {
	var stamp [3]int64
	fi, err := os.Stat(path)
	if err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			stamp = [3]int64{int64(st.Ino), fi.Size(), fi.ModTime().UnixNano()}
		}
	}
	if f.byID != nil && stamp == f.stamp {
		return
	}
	f.stamp, f.byID = stamp, parseIDFile(path)
}

// maxIDFile bounds the part of an ID file read.
const maxIDFile = 4 << 20

// parseIDFile maps the IDs of an /etc/passwd or /etc/group file (name:x:id:...)
// to their names, the first name of each ID. Names that are not short
// printable text are left out.
func parseIDFile(path string) map[uint32]string {
	out := map[uint32]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxIDFile))
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 4)
		if len(fields) < 3 || !goodName(fields[0]) {
			continue
		}
		id, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			continue
		}
		if _, ok := out[uint32(id)]; !ok {
			out[uint32(id)] = fields[0]
		}
	}
	return out
}

// goodName reports whether s may be a user or group name.
func goodName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return false
		}
	}
	return true
}
