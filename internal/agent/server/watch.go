package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// watch serves OpFileWatch: a result once the directory a names is
// watched, then batches of events as they come, until the host closes
// its side of the stream (or the directory goes: then an end frame).
// The inotify instance is closed before it returns.
func (s *Server) watch(c *call, a proto.WatchArgs) error {
	root, err := guestPath(a.Path)
	if err != nil {
		return c.fail(err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return c.fail(err)
	}
	if !fi.IsDir() {
		return c.fail(fmt.Errorf("watch %s: not a directory: %w", root, errkind.FailedPrecondition))
	}
	w, err := startWatch(root, a.Recursive, s.cfg.WatchQueue)
	if err != nil {
		return c.fail(err)
	}
	defer w.stop()
	if err := c.result(proto.Empty{}); err != nil {
		return err
	}
	// The host sends nothing more: it ends the watch by closing its side
	// of the stream. A send blocked on a host that stopped reading gives
	// up then too.
	hostGone := make(chan struct{})
	go func() {
		defer close(hostGone)
		for {
			if _, err := c.r.Next(); err != nil {
				c.st.SetWriteDeadline(time.Now())
				return
			}
		}
	}()
	defer func() {
		c.st.SetReadDeadline(time.Now())
		<-hostGone
	}()
	for {
		select {
		case <-hostGone:
			return nil
		case <-w.ready:
		}
		evs, end, werr := w.take()
		b := newBatch(c, `{"events":[`)
		for _, ev := range evs {
			switch ev.Op {
			case proto.WatchCreate, proto.WatchWrite, proto.WatchChmod:
				if fi, err := os.Lstat(ev.Path); err == nil {
					info := fileInfo(filepath.Base(ev.Path), fi)
					s.describe(ev.Path, &info)
					ev.Info = &info
				}
			}
			if err := b.add(ev); err != nil {
				return err
			}
		}
		if err := b.flush(); err != nil {
			return err
		}
		if werr != nil {
			return c.fail(werr)
		}
		if end {
			return c.send(proto.TypeEnd, nil)
		}
	}
}

// watchMask is what a watch asks inotify for, for every directory.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// watcher turns the events of one inotify instance into a bounded queue
// of proto.WatchEvent. Its reader goroutine runs from startWatch to stop.
type watcher struct {
	root      string
	recursive bool
	f         *os.File // the inotify instance; closing it ends the reader
	rc        syscall.RawConn
	max       int           // events the queue holds, besides an overflow
	ready     chan struct{} // holds a token when take has something new
	done      chan struct{} // closed when the reader returned

	// The reader's alone once it runs (startWatch's before).
	dirs   map[int32]string // watch descriptor -> directory watched
	rootWD int32

	mu sync.Mutex
	// +checklocks:mu
	queue []proto.WatchEvent
	// +checklocks:mu
	lost bool // the queue is full and ends with an overflow event
	// +checklocks:mu
	end bool // the reader stopped: the root went, or err
	// +checklocks:mu
	err error
}

// startWatch watches root (and with recursive the directories below
// it) and starts the reader. The caller must call stop.
func startWatch(root string, recursive bool, max int) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.EMFILE) {
			return nil, fmt.Errorf("watch %s: the guest's limit of inotify instances (fs.inotify.max_user_instances) is reached: %w", root, errkind.ResourceExhausted)
		}
		return nil, fmt.Errorf("watch %s: inotify: %w", root, err)
	}
	// Non-blocking, so the runtime poller reads it and Close ends a Read.
	f := os.NewFile(uintptr(fd), "inotify")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("watch %s: %w", root, err)
	}
	w := &watcher{
		root: root, recursive: recursive, f: f, rc: rc, max: max,
		ready: make(chan struct{}, 1), done: make(chan struct{}),
		dirs: map[int32]string{},
	}
	w.rootWD, err = w.addDir(root, true)
	if err == nil && recursive {
		err = w.addTree(root, false)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	go w.read()
	return w, nil
}

// stop closes the inotify instance and waits for the reader.
func (w *watcher) stop() {
	w.f.Close()
	<-w.done
}

// addDir watches the directory dir; the root's watch follows a symlink.
func (w *watcher) addDir(dir string, root bool) (int32, error) {
	mask := uint32(watchMask)
	if !root {
		mask |= unix.IN_DONT_FOLLOW
	}
	var wd int
	var err error
	if cerr := w.rc.Control(func(fd uintptr) { wd, err = unix.InotifyAddWatch(int(fd), dir, mask) }); cerr != nil {
		return 0, fmt.Errorf("watch %s: %w", dir, cerr)
	}
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return 0, fmt.Errorf("watch %s: the guest's limit of inotify watches (fs.inotify.max_user_watches) is reached: %w", dir, errkind.ResourceExhausted)
		}
		return 0, &os.PathError{Op: "watch", Path: dir, Err: err}
	}
	w.dirs[int32(wd)] = dir
	return int32(wd), nil
}

// addTree watches the directories below dir; with announce it queues a
// create event for every entry it finds, which may have come before its
// directory was watched. Only running out of watches is an error: a
// directory that went meanwhile is skipped.
func (w *watcher) addTree(dir string, announce bool) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if announce {
			w.push(proto.WatchEvent{Op: proto.WatchCreate, Path: p})
		}
		if !de.IsDir() {
			continue
		}
		if _, err := w.addDir(p, false); err != nil {
			if errors.Is(err, errkind.ResourceExhausted) {
				return err
			}
			continue
		}
		if err := w.addTree(p, announce); err != nil {
			return err
		}
	}
	return nil
}

// unwatchTree drops the watches of dir and the directories below it (dir
// moved: their paths no longer hold).
func (w *watcher) unwatchTree(dir string) {
	for wd, d := range w.dirs {
		if d == dir || strings.HasPrefix(d, dir+"/") {
			w.rc.Control(func(fd uintptr) { unix.InotifyRmWatch(int(fd), uint32(wd)) })
			delete(w.dirs, wd)
		}
	}
}

// read turns inotify events into queued events until the instance is
// closed or the watch ends.
func (w *watcher) read() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.finish(fmt.Errorf("watch %s: read events: %w", w.root, err))
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			size := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + unix.SizeofInotifyEvent
			if start+size > n {
				break
			}
			name := strings.TrimRight(string(buf[start:start+size]), "\x00")
			off = start + size
			if !w.handle(wd, mask, name) {
				return
			}
		}
	}
}

// handle queues what one inotify event says. It returns false when the
// watch ended.
func (w *watcher) handle(wd int32, mask uint32, name string) bool {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.push(proto.WatchEvent{Op: proto.WatchOverflow})
		return true
	}
	dir, ok := w.dirs[wd]
	if !ok {
		return true // a watch dropped meanwhile
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		if wd == w.rootWD {
			w.finish(nil)
			return false
		}
		return true
	}
	if name == "" {
		// An event of a watched directory itself. Those of the
		// directories below the root reach their parent's watch too.
		if wd == w.rootWD && mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
			op := proto.WatchRemove
			if mask&unix.IN_MOVE_SELF != 0 {
				op = proto.WatchRename
			}
			w.push(proto.WatchEvent{Op: op, Path: w.root})
			w.finish(nil)
			return false
		}
		return true
	}
	p := filepath.Join(dir, name)
	isDir := mask&unix.IN_ISDIR != 0
	var err error
	switch {
	case mask&unix.IN_CREATE != 0:
		w.push(proto.WatchEvent{Op: proto.WatchCreate, Path: p})
		if isDir && w.recursive {
			err = w.addNew(p, true)
		}
	case mask&unix.IN_MOVED_TO != 0:
		w.push(proto.WatchEvent{Op: proto.WatchCreate, Path: p})
		if isDir && w.recursive {
			err = w.addNew(p, false)
		}
	case mask&unix.IN_MODIFY != 0:
		w.push(proto.WatchEvent{Op: proto.WatchWrite, Path: p})
	case mask&unix.IN_ATTRIB != 0:
		w.push(proto.WatchEvent{Op: proto.WatchChmod, Path: p})
	case mask&unix.IN_DELETE != 0:
		w.push(proto.WatchEvent{Op: proto.WatchRemove, Path: p})
	case mask&unix.IN_MOVED_FROM != 0:
		w.push(proto.WatchEvent{Op: proto.WatchRename, Path: p})
		if isDir && w.recursive {
			w.unwatchTree(p)
		}
	}
	if err != nil {
		w.finish(err)
		return false
	}
	return true
}

// addNew watches a directory that appeared below the root, and the
// directories in it; with announce, what it already holds comes as
// create events.
func (w *watcher) addNew(dir string, announce bool) error {
	if _, err := w.addDir(dir, false); err != nil {
		if errors.Is(err, errkind.ResourceExhausted) {
			return err
		}
		return nil // gone again
	}
	return w.addTree(dir, announce)
}

// push queues ev, or drops it while the queue is full: the first event
// that finds it full becomes an overflow event.
func (w *watcher) push(ev proto.WatchEvent) {
	limit := w.max
	w.mu.Lock()
	switch {
	case w.lost:
	case len(w.queue) >= limit:
		w.queue = append(w.queue, proto.WatchEvent{Op: proto.WatchOverflow})
		w.lost = true
	default:
		w.queue = append(w.queue, ev)
	}
	w.mu.Unlock()
	w.signal()
}

// finish records that the reader stopped, with err or because the root
// went.
func (w *watcher) finish(err error) {
	w.mu.Lock()
	w.end, w.err = true, err
	w.mu.Unlock()
	w.signal()
}

func (w *watcher) signal() {
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// take empties the queue. end is set once the reader stopped: nothing
// more comes, and err says why when the root did not go.
func (w *watcher) take() (evs []proto.WatchEvent, end bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs, w.queue, w.lost = w.queue, nil, false
	return evs, w.end, w.err
}
