package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// statFile describes a path without following a final symlink.
func (s *Server) statFile(a proto.PathArgs) (proto.FileInfo, error) {
	p, err := guestPath(a.Path)
	if err != nil {
		return proto.FileInfo{}, err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return proto.FileInfo{}, err
	}
	info := fileInfo(filepath.Base(p), fi)
	s.describe(p, &info)
	return info, nil
}

// readFile sends a result with the file's info, the bytes a.Offset and
// a.Length select, and an end frame.
func (s *Server) readFile(ctx context.Context, c *call, a proto.ReadArgs) error {
	p, err := guestPath(a.Path)
	if err != nil {
		return c.fail(err)
	}
	if a.Offset < 0 || a.Length < 0 {
		return c.fail(fmt.Errorf("read %s: negative offset or length: %w", p, errkind.InvalidArgument))
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
	off, n := a.Offset, a.Length
	if n == 0 {
		n = math.MaxInt64 - off
	}
	if a.Pages && s.cfg.Pages != nil && c.sess.ringSession() != nil && min(fi.Size()-off, n) >= minPagesRead {
		next, err := s.sendPages(c, f, off, off+n)
		switch {
		case errors.Is(err, errHostGone):
			return err
		case err != nil:
			return c.fail(err)
		}
		n -= next - off
		off = next
	}
	var r io.Reader = f
	if off > 0 || a.Length > 0 {
		r = io.NewSectionReader(f, off, n)
	}
	return c.sendStream(ctx, r)
}

// sendStream sends r's bytes as data, then an end frame; a read error
// ends the call with an error frame instead.
func (c *call) sendStream(ctx context.Context, r io.Reader) error {
	buf := make([]byte, proto.DataChunk)
	for {
		// Ask for a whole slot: a file read straight into the ring is
		// the only copy its bytes take in the guest.
		_, err := c.sendBulk(ctx, proto.TypeData, ring.SlotSize, buf, func(b []byte) (int, error) {
			return io.ReadFull(r, b)
		})
		switch err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return c.send(proto.TypeEnd, nil)
		default:
			return c.fail(err)
		}
	}
}

// receive hands the host's data frames to write, in order, until the end
// frame, giving back the ring slots they name. It returns write's first
// error; answering it (refuse) is the caller's. A broken host stream
// returns errHostGone.
func (c *call) receive(write func([]byte) error) error {
	for {
		f, err := c.r.Next()
		if err != nil {
			return fmt.Errorf("%w: %v", errHostGone, err)
		}
		if f.Type == proto.TypeEnd {
			return nil
		}
		data, slot := f.Payload, -1
		switch f.Type {
		case proto.TypeData:
		case proto.TypeDataRef:
			if slot, data, err = c.sess.view(f, proto.TypeData); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected %s frame: %w", f.Type, errkind.InvalidArgument)
		}
		err = write(data)
		if slot >= 0 {
			if rerr := c.sess.release(slot); rerr != nil {
				return fmt.Errorf("%w: %v", errHostGone, rerr) // the session is going
			}
		}
		if err != nil {
			return err
		}
	}
}

// errHostGone says the host's stream broke: there is no one to answer.
var errHostGone = errors.New("host stream ended")

// writeFile receives data frames into a temporary file next to the target and
// renames it into place at the end frame, after an fsync: the target holds
// the old or the new content, never a part. With a.At it appends in place
// (appendFile).
func (s *Server) writeFile(c *call, a proto.WriteArgs) error {
	p, mode, err := writeTarget(a)
	if err != nil {
		return c.refuse(err)
	}
	if a.At != nil {
		// One in-place write per file at a time: a resumed upload's part
		// waits for the bytes of the cut one to land, then checks the size.
		defer s.appends.lock(p)()
		return appendFile(c, a, p, mode)
	}
	dir := filepath.Dir(p)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(p)+".space-tmp-*")
	if err != nil {
		return c.refuse(err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := setXattrs(tmp, a.Xattrs); err != nil {
		return c.refuse(fmt.Errorf("write %s: %w", p, err))
	}
	var size int64
	err = c.receive(func(b []byte) error {
		n, err := tmp.Write(b)
		size += int64(n)
		return err
	})
	if err == nil {
		err = finishFile(tmp, mode, a)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		return c.refuse(fmt.Errorf("write %s: %w", p, err))
	}
	committed = true
	if !a.NoSync {
		syncDir(dir)
	}
	return c.result(proto.WriteResult{Size: size})
}

// writeTarget checks a write's arguments and makes the target's parents
// when asked; it returns the clean path and the mode to give the file.
func writeTarget(a proto.WriteArgs) (string, fs.FileMode, error) {
	p, err := guestPath(a.Path)
	if err != nil {
		return "", 0, err
	}
	if a.Mode&^0o7777 != 0 {
		return "", 0, fmt.Errorf("write %s: mode %o: %w", p, a.Mode, errkind.InvalidArgument)
	}
	if a.At != nil && *a.At < 0 {
		return "", 0, fmt.Errorf("write %s: negative offset: %w", p, errkind.InvalidArgument)
	}
	if err := checkXattrs(a.Xattrs); err != nil {
		return "", 0, fmt.Errorf("write %s: %w", p, err)
	}
	mode := fs.FileMode(a.Mode & 0o777)
	if a.Mode == 0 {
		mode = 0o644
	}
	mode |= fileModeBits(a.Mode)
	if a.MkdirAll {
		if err := mkdirAllOwned(filepath.Dir(p), 0o755, a.UID, a.GID); err != nil {
			return "", 0, err
		}
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return "", 0, fmt.Errorf("write %s: is a directory: %w", p, errkind.FailedPrecondition)
	}
	return p, mode, nil
}

// finishFile gives a written file its mode and owner, syncs it unless
// a.NoSync, and closes it.
func finishFile(f *os.File, mode fs.FileMode, a proto.WriteArgs) error {
	if err := setModeOwner(f, mode, a); err != nil {
		return err
	}
	if !a.NoSync {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	return f.Close()
}

// setModeOwner gives f mode, and a's owner where it names one.
func setModeOwner(f *os.File, mode fs.FileMode, a proto.WriteArgs) error {
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if a.UID == nil && a.GID == nil {
		return nil
	}
	uid, gid := -1, -1
	if a.UID != nil {
		uid = int(*a.UID)
	}
	if a.GID != nil {
		gid = int(*a.GID)
	}
	return f.Chown(uid, gid)
}

// appendFile writes the host's bytes into p from *a.At, which must be
// p's size: every byte that arrives stays, so a stream cut anywhere leaves
// a prefix of what was sent, and the host resumes from the size. A new
// file (At 0) gets a's mode and owner.
func appendFile(c *call, a proto.WriteArgs, p string, mode fs.FileMode) error {
	at := *a.At
	flags := os.O_WRONLY
	if at == 0 {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(p, flags, 0o600)
	if err != nil {
		return c.refuse(fmt.Errorf("write %s at %d: %w", p, at, err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err == nil && fi.Size() != at {
		err = fmt.Errorf("write %s at %d: the file holds %d bytes: %w", p, at, fi.Size(), errkind.FailedPrecondition)
	}
	if err == nil && at == 0 && fi.Size() == 0 {
		err = setModeOwner(f, mode, a)
	}
	if err == nil {
		err = setXattrs(f, a.Xattrs)
	}
	if err != nil {
		return c.refuse(err)
	}
	size := at
	err = c.receive(func(b []byte) error {
		n, err := f.WriteAt(b, size)
		size += int64(n)
		return err
	})
	if err == nil && !a.NoSync {
		err = f.Sync()
	}
	if err != nil {
		return c.refuse(fmt.Errorf("write %s: %w", p, err))
	}
	return c.result(proto.WriteResult{Size: size - at, EndSize: size})
}

// refuse answers a call the host is still sending on with err, then
// drains what it sent meanwhile (giving back its ring slots) until its
// end. When the host is gone there is no one to answer.
func (c *call) refuse(err error) error {
	if errors.Is(err, errHostGone) {
		return err
	}
	ferr := c.fail(err)
	c.drain()
	return ferr
}

// syncDir makes a rename in dir durable, as well as it can.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
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

// listBatch is how many entries one result frame carries at most.
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
	b := newBatch(c, `{"entries":[`)
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
		for _, de := range des {
			fi, err := de.Info()
			if err != nil {
				continue // removed while we listed
			}
			info := fileInfo(de.Name(), fi)
			s.describe(filepath.Join(p, de.Name()), &info)
			if err := b.add(info); err != nil {
				return err
			}
			sent++
		}
		if err := b.flush(); err != nil {
			return err
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

// batch gathers JSON values into result frames of the form
// open + values + "]}", each below proto.MaxFrame.
type batch struct {
	c    *call
	open string
	buf  []byte // open and the values so far; or empty
}

func newBatch(c *call, open string) *batch { return &batch{c: c, open: open} }

// add appends v, first sending what the batch holds when v would not
// fit in its frame.
func (b *batch) add(v any) error {
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b.buf) > 0 && len(b.buf)+1+len(j)+2 > proto.MaxFrame {
		if err := b.flush(); err != nil {
			return err
		}
	}
	if len(b.buf) == 0 {
		b.buf = append(b.buf, b.open...)
	} else {
		b.buf = append(b.buf, ',')
	}
	b.buf = append(b.buf, j...)
	return nil
}

// flush sends what the batch holds, if anything.
func (b *batch) flush() error {
	if len(b.buf) == 0 {
		return nil
	}
	b.buf = append(b.buf, "]}"...)
	err := b.c.send(proto.TypeResult, b.buf)
	b.buf = b.buf[:0]
	return err
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
		return mkdirAllOwned(p, mode, a.UID, a.GID)
	}
	if err := os.Mkdir(p, mode); err != nil {
		return err
	}
	return chownMade(p, a.UID, a.GID)
}

// mkdirAllOwned is os.MkdirAll, with the directories it makes owned by
// uid and gid where they are set.
func mkdirAllOwned(p string, mode fs.FileMode, uid, gid *uint32) error {
	if uid == nil && gid == nil {
		return os.MkdirAll(p, mode)
	}
	// The missing directories, from the deepest.
	var missing []string
	for d := p; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || d == "/" {
			break
		}
		missing = append(missing, d)
	}
	if err := os.MkdirAll(p, mode); err != nil {
		return err
	}
	for _, d := range missing {
		if err := chownMade(d, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// chownMade gives a directory the call made its owner, where one is set.
func chownMade(p string, uid, gid *uint32) error {
	if uid == nil && gid == nil {
		return nil
	}
	u, g := -1, -1
	if uid != nil {
		u = int(*uid)
	}
	if gid != nil {
		g = int(*gid)
	}
	return os.Lchown(p, u, g)
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

// pathLocks are mutexes by path, made on demand and dropped when unused.
type pathLocks struct {
	mu sync.Mutex
	// +checklocks:mu
	m map[string]*pathLock
}

type pathLock struct {
	mu    sync.Mutex
	users int // holders and waiters; guarded by pathLocks.mu
}

// lock locks path and returns its unlock.
//
// +checklocksignore: the lock is returned held, to the caller's unlock.
func (l *pathLocks) lock(path string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*pathLock{}
	}
	pl := l.m[path]
	if pl == nil {
		pl = &pathLock{}
		l.m[path] = pl
	}
	pl.users++
	l.mu.Unlock()
	pl.mu.Lock()
	return func() {
		pl.mu.Unlock()
		l.mu.Lock()
		if pl.users--; pl.users == 0 {
			delete(l.m, path)
		}
		l.mu.Unlock()
	}
}
