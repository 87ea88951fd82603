package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/errkind"
)

// guestPath checks that p is an absolute, clean path and returns it.
func guestPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("empty path: %w", errkind.InvalidArgument)
	case len(p) > 4096:
		return "", fmt.Errorf("path of %d bytes: %w", len(p), errkind.InvalidArgument)
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("path %.64q contains NUL: %w", p, errkind.InvalidArgument)
	case !filepath.IsAbs(p):
		return "", fmt.Errorf("path %.64q is not absolute: %w", p, errkind.InvalidArgument)
	}
	return filepath.Clean(p), nil
}

func fileInfo(name string, fi fs.FileInfo) proto.FileInfo {
	info := proto.FileInfo{
		Name:    name,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		MtimeNS: fi.ModTime().UnixNano(),
	}
	m := fi.Mode()
	if m&fs.ModeSetuid != 0 {
		info.Mode |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		info.Mode |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		info.Mode |= syscall.S_ISVTX
	}
	switch {
	case m.IsRegular():
		info.Type = proto.FileRegular
	case m.IsDir():
		info.Type = proto.FileDir
	case m&fs.ModeSymlink != 0:
		info.Type = proto.FileSymlink
	default:
		info.Type = proto.FileOther
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.UID, info.GID = st.Uid, st.Gid
	}
	return info
}

func statFile(a proto.PathArgs) (proto.FileInfo, error) {
	p, err := guestPath(a.Path)
	if err != nil {
		return proto.FileInfo{}, err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return proto.FileInfo{}, err
	}
	info := fileInfo(filepath.Base(p), fi)
	if info.Type == proto.FileSymlink {
		info.Target, _ = os.Readlink(p)
	}
	return info, nil
}

// readFile sends a result with the file's info, its bytes, and an end frame.
func (s *Server) readFile(ctx context.Context, c *call, a proto.PathArgs) error {
	p, err := guestPath(a.Path)
	if err != nil {
		return c.fail(err)
	}
	f, err := os.Open(p)
	if err != nil {
		return c.fail(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return c.fail(err)
	}
	if !fi.Mode().IsRegular() {
		return c.fail(fmt.Errorf("read %s: not a regular file: %w", p, errkind.FailedPrecondition))
	}
	if err := c.result(fileInfo(filepath.Base(p), fi)); err != nil {
		return err
	}
	buf := make([]byte, proto.DataChunk)
	var readErr error
	read := func(b []byte) (int, error) {
		n, err := f.Read(b)
		readErr = err
		return n, nil
	}
	for {
		// Ask for a whole slot: a file read straight into the ring is
		// the only copy its bytes take in the guest.
		if _, err := c.sendBulk(ctx, proto.TypeData, ring.SlotSize, buf, read); err != nil {
			return err
		}
		if readErr == io.EOF {
			return c.send(proto.TypeEnd, nil)
		}
		if readErr != nil {
			return c.fail(readErr)
		}
	}
}

// writeFile receives data frames into a temporary file next to the target and
// renames it into place at the end frame, after an fsync: the target holds
// the old or the new content, never a part.
func (s *Server) writeFile(c *call, a proto.WriteArgs) (err error) {
	drained := false
	defer func() {
		if !drained {
			c.drain() // the host's slots in frames never read go back
		}
	}()
	p, err := guestPath(a.Path)
	if err != nil {
		return c.fail(err)
	}
	if a.Mode&^0o7777 != 0 {
		return c.fail(fmt.Errorf("write %s: mode %o: %w", p, a.Mode, errkind.InvalidArgument))
	}
	mode := fs.FileMode(a.Mode & 0o777)
	if a.Mode == 0 {
		mode = 0o644
	}
	mode |= fileModeBits(a.Mode)
	dir := filepath.Dir(p)
	if a.MkdirAll {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return c.fail(err)
		}
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return c.fail(fmt.Errorf("write %s: is a directory: %w", p, errkind.FailedPrecondition))
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(p)+".space-tmp-*")
	if err != nil {
		return c.fail(err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	var size int64
	for {
		f, err := c.r.Next()
		if err != nil {
			drained = true
			return fmt.Errorf("write %s: host stream: %w", p, err) // host gone: nothing to answer
		}
		if f.Type == proto.TypeEnd {
			drained = true
			break
		}
		data, slot := f.Payload, -1
		switch f.Type {
		case proto.TypeData:
		case proto.TypeDataRef:
			if slot, data, err = c.sess.view(f, proto.TypeData); err != nil {
				return c.fail(fmt.Errorf("write %s: %w", p, err))
			}
		default:
			return c.fail(fmt.Errorf("write %s: unexpected %s frame: %w", p, f.Type, errkind.InvalidArgument))
		}
		n, err := tmp.Write(data)
		size += int64(n)
		if slot >= 0 {
			if rerr := c.sess.release(slot); rerr != nil && err == nil {
				return fmt.Errorf("write %s: %w", p, rerr) // the session is going
			}
		}
		if err != nil {
			return c.fail(err)
		}
	}
	if err := tmp.Chmod(mode); err != nil {
		return c.fail(err)
	}
	if a.UID != nil || a.GID != nil {
		uid, gid := -1, -1
		if a.UID != nil {
			uid = int(*a.UID)
		}
		if a.GID != nil {
			gid = int(*a.GID)
		}
		if err := tmp.Chown(uid, gid); err != nil {
			return c.fail(err)
		}
	}
	if !a.NoSync {
		if err := tmp.Sync(); err != nil {
			return c.fail(err)
		}
	}
	if err := tmp.Close(); err != nil {
		return c.fail(err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return c.fail(err)
	}
	committed = true
	if !a.NoSync {
		if d, err := os.Open(dir); err == nil {
			d.Sync()
			d.Close()
		}
	}
	return c.result(proto.WriteResult{Size: size})
}

func fileModeBits(m uint32) fs.FileMode {
	var fm fs.FileMode
	if m&syscall.S_ISUID != 0 {
		fm |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		fm |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// listBatch is how many entries one result frame carries.
const listBatch = 500

func (s *Server) listDir(c *call, a proto.ListArgs) error {
	p, err := guestPath(a.Path)
	if err != nil {
		return c.fail(err)
	}
	if a.Limit < 0 {
		return c.fail(fmt.Errorf("list %s: negative limit: %w", p, errkind.InvalidArgument))
	}
	d, err := os.Open(p)
	if err != nil {
		return c.fail(err)
	}
	defer d.Close()
	if fi, err := d.Stat(); err != nil {
		return c.fail(err)
	} else if !fi.IsDir() {
		return c.fail(fmt.Errorf("list %s: not a directory: %w", p, errkind.FailedPrecondition))
	}
	sent := 0
	for {
		n := listBatch
		if a.Limit > 0 && a.Limit-sent < n {
			n = a.Limit - sent
		}
		if n == 0 {
			break
		}
		des, err := d.ReadDir(n)
		batch := proto.ListBatch{Entries: make([]proto.FileInfo, 0, len(des))}
		for _, de := range des {
			fi, err := de.Info()
			if err != nil {
				continue // removed while we listed
			}
			info := fileInfo(de.Name(), fi)
			if info.Type == proto.FileSymlink {
				info.Target, _ = os.Readlink(filepath.Join(p, de.Name()))
			}
			batch.Entries = append(batch.Entries, info)
		}
		if len(batch.Entries) > 0 {
			if err := c.result(batch); err != nil {
				return err
			}
			sent += len(batch.Entries)
		}
		if errors.Is(err, io.EOF) || len(des) == 0 {
			break
		}
		if err != nil {
			return c.fail(err)
		}
	}
	return c.send(proto.TypeEnd, nil)
}

func mkdir(a proto.MkdirArgs) error {
	p, err := guestPath(a.Path)
	if err != nil {
		return err
	}
	if a.Mode&^0o7777 != 0 {
		return fmt.Errorf("mkdir %s: mode %o: %w", p, a.Mode, errkind.InvalidArgument)
	}
	mode := fs.FileMode(a.Mode&0o777) | fileModeBits(a.Mode)
	if a.Mode == 0 {
		mode = 0o755
	}
	if a.Parents {
		return os.MkdirAll(p, mode)
	}
	return os.Mkdir(p, mode)
}

func remove(a proto.RemoveArgs) error {
	p, err := guestPath(a.Path)
	if err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("remove /: %w", errkind.InvalidArgument)
	}
	if !a.Recursive {
		return os.Remove(p)
	}
	if _, err := os.Lstat(p); err != nil {
		return err
	}
	return os.RemoveAll(p)
}

func rename(a proto.RenameArgs) error {
	from, err := guestPath(a.From)
	if err != nil {
		return err
	}
	to, err := guestPath(a.To)
	if err != nil {
		return err
	}
	return os.Rename(from, to)
}
