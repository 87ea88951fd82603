// Package transport gives the guest agent its host connections: a
// virtio-serial port (QEMU without vhost-vsock) or a vsock listener
// (Firecracker's hybrid vsock, QEMU's vhost-vsock). Both satisfy
// server.Listener.
//
// A virtio-serial port is one byte stream with no connection boundaries:
// while no host is attached, reads return 0 at once and writes block. The
// port therefore waits for a host without polling (SIGIO on the host's
// connect, with a slow timer as a backstop), and a session ends when the
// host goes away; the next Accept waits for the next host.
package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// FindVirtioPort returns the device node of the virtio-serial port named
// name, e.g. /dev/vport1p1. Without udev, names are read from sysfs.
func FindVirtioPort(name string) (string, error) {
	matches, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(m)), nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port named %q (%d ports found)", name, len(matches))
}

// VirtioPort serves sessions over one virtio-serial port, one at a time.
type VirtioPort struct {
	f       *os.File
	fd      int
	backoff time.Duration

	mu sync.Mutex
	// +checklocks:mu
	active *portConn // the session in progress, or nil
}

// OpenVirtioPort opens the port's device node, non-blocking: reads and
// writes that would block wait in poll, which costs no CPU while the guest
// idles and which Close can interrupt.
func OpenVirtioPort(dev string) (*VirtioPort, error) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	return &VirtioPort{f: os.NewFile(uintptr(fd), dev), fd: fd, backoff: time.Second}, nil
}

// Close closes the port.
func (p *VirtioPort) Close() error { return p.f.Close() }

// Accept waits until the previous session ended and a host is attached, then
// returns the port as a connection. Its Close ends the session, not the port.
func (p *VirtioPort) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	p.mu.Lock()
	prev := p.active
	p.mu.Unlock()
	if prev != nil {
		select {
		case <-prev.idle:
			unix.Close(prev.efd) // nobody can be polling it any more
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := p.waitHost(ctx); err != nil {
		return nil, err
	}
	c, err := newPortConn(p)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.active = c
	p.mu.Unlock()
	return c, nil
}

// hostAttached reports whether a host has the port open: the port polls
// HUP while nobody is on the other end.
func (p *VirtioPort) hostAttached() (bool, error) {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll port: %w", err)
		}
		return fds[0].Revents&unix.POLLHUP == 0, nil
	}
}

// waitHost blocks until a host attaches. The kernel sends SIGIO when the
// host side opens; asynchronous notification is on only while waiting, so
// data transfer does not pay for signals.
func (p *VirtioPort) waitHost(ctx context.Context) error {
	if ok, err := p.hostAttached(); ok || err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGIO)
	defer signal.Stop(sigs)
	if err := p.setAsync(true); err != nil {
		return err
	}
	defer p.setAsync(false)
	t := time.NewTicker(p.backoff) // a lost wakeup costs at most this
	defer t.Stop()
	for {
		if ok, err := p.hostAttached(); ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sigs:
		case <-t.C:
		}
	}
}

func (p *VirtioPort) setAsync(on bool) error {
	if on {
		if _, err := unix.FcntlInt(uintptr(p.fd), unix.F_SETOWN, unix.Getpid()); err != nil {
			return fmt.Errorf("port F_SETOWN: %w", err)
		}
	}
	fl, err := unix.FcntlInt(uintptr(p.fd), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("port F_GETFL: %w", err)
	}
	if on {
		fl |= unix.O_ASYNC
	} else {
		fl &^= unix.O_ASYNC
	}
	if _, err := unix.FcntlInt(uintptr(p.fd), unix.F_SETFL, fl); err != nil {
		return fmt.Errorf("port F_SETFL: %w", err)
	}
	return nil
}

// portConn is one host session on the port. Reads and writes are
// non-blocking and, when the port is not ready, poll it together with an
// eventfd, so Close can interrupt them: a blocking read on the port itself
// could only be ended by the host.
//
// Writes are batched. Every write to the port is one virtqueue buffer and
// one notification of the VMM (a VM exit), and the session above writes
// many small pieces (a 12-byte mux header, then its body; window updates).
// Write copies into a pending batch and returns; one flusher goroutine
// writes whatever has gathered, in as few port writes as the driver takes
// (at most 32 KiB each). A full batch makes Write wait (backpressure), and
// a port error fails the next Write. Flush waits until the batch is out.
type portConn struct {
	p      *VirtioPort
	efd    int           // eventfd written by Close
	idle   chan struct{} // closed once closed and no read or write is in flight
	lastIO atomic.Int64  // unix nanoseconds of the last read or write that moved bytes

	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	inflight int

	wmu   sync.Mutex
	wcond *sync.Cond // +checklocksignore: on wmu, signalled when the batch, flushing, werr or wclosed changed; immutable
	// +checklocks:wmu
	pending []byte // written by Write, not yet taken by the flusher
	// +checklocks:wmu
	flushing bool // the flusher is writing a batch to the port
	// +checklocks:wmu
	werr error // the port write that failed; later writes fail with it
	// +checklocks:wmu
	wclosed bool
}

// maxBatch bounds the bytes Write holds for the flusher. It is several
// mux frames, so the flusher writes full driver buffers while the session
// prepares the next ones.
const maxBatch = 256 << 10

func newPortConn(p *VirtioPort) (*portConn, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	c := &portConn{p: p, efd: efd, idle: make(chan struct{})}
	c.wcond = sync.NewCond(&c.wmu)
	if err := c.enter(); err != nil { // the flusher is in flight until it ends
		return nil, err
	}
	go c.flusher()
	return c, nil
}

// The guest's virtio console can miss the wake-up for a poll on the port:
// that the host consumed the buffers already sent (POLLOUT), or that host
// bytes arrived (POLLIN). The waiter then sleeps on although a fresh poll,
// which reclaims consumed buffers and fetches arrived ones, would find the
// port ready. Seen as a long transfer stalling mid-way (the agent waiting
// for room, or for the host's yamux window update) until the host happened
// to send something else. So a waiting write, and a waiting read while the
// session is busy, poll again every repoll. An idle session polls without
// a timeout: an idle guest does not wake. Reads and writes try the port
// first and poll only when it is not ready, so a busy transfer rarely
// waits at all.
const (
	repoll     = 100             // ms
	busyWindow = 2 * time.Second // a session that moved bytes this recently is busy
)

// wait blocks until the port is ready for events or the host went away
// (which reads as EOF and fails writes), or the session is closed. It
// returns the port's poll events.
func (c *portConn) wait(events int16) (int16, error) {
	fds := []unix.PollFd{{Fd: int32(c.p.fd), Events: events}, {Fd: int32(c.efd), Events: unix.POLLIN}}
	for {
		timeout := -1
		if events&unix.POLLOUT != 0 || time.Since(time.Unix(0, c.lastIO.Load())) < busyWindow {
			timeout = repoll
		}
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("poll port: %w", err)
		}
		if n == 0 {
			return 0, nil // timed out: the caller tries the port again
		}
		if fds[1].Revents != 0 {
			return 0, io.ErrClosedPipe
		}
		return fds[0].Revents, nil
	}
}

// enter registers a read or write; it fails once the session is closed.
func (c *portConn) enter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return io.ErrClosedPipe
	}
	c.inflight++
	return nil
}

func (c *portConn) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	if c.closed && c.inflight == 0 {
		close(c.idle)
	}
}

// Read returns io.EOF when the host went away: the port reads 0 bytes then.
func (c *portConn) Read(b []byte) (int, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	for {
		n, err := unix.Read(c.p.fd, b)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			if _, err := c.wait(unix.POLLIN); err != nil {
				return 0, err
			}
			continue
		case err != nil:
			return 0, fmt.Errorf("read port: %w", err)
		case n == 0 && len(b) > 0:
			return 0, io.EOF
		}
		c.lastIO.Store(time.Now().UnixNano())
		return n, nil
	}
}

// Write adds b to the batch the flusher writes, waiting while the batch is
// full. It fails once an earlier batch could not be written.
func (c *portConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for c.werr == nil && !c.wclosed && len(c.pending) > 0 && len(c.pending)+len(b) > maxBatch {
		c.wcond.Wait()
	}
	switch {
	case c.werr != nil:
		return 0, c.werr
	case c.wclosed:
		return 0, io.ErrClosedPipe
	}
	c.pending = append(c.pending, b...)
	c.wcond.Broadcast()
	return len(b), nil
}

// Flush waits until everything written so far is on the port.
func (c *portConn) Flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for c.werr == nil && !c.wclosed && (len(c.pending) > 0 || c.flushing) {
		c.wcond.Wait()
	}
	if c.werr != nil {
		return c.werr
	}
	if len(c.pending) > 0 {
		return io.ErrClosedPipe
	}
	return nil
}

// flusher writes batches to the port until the session is closed or a
// write fails. It holds one in-flight registration for its life.
func (c *portConn) flusher() {
	defer c.leave()
	var batch []byte
	for {
		c.wmu.Lock()
		for len(c.pending) == 0 && !c.wclosed {
			c.wcond.Wait()
		}
		if c.wclosed {
			c.wmu.Unlock()
			return
		}
		batch, c.pending = c.pending, batch[:0]
		c.flushing = true
		c.wmu.Unlock()
		err := c.writePort(batch)
		c.wmu.Lock()
		c.flushing = false
		if err != nil {
			c.werr = err
		}
		c.wcond.Broadcast()
		c.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// writePort writes all of b to the port, waiting for room.
func (c *portConn) writePort(b []byte) error {
	for written := 0; written < len(b); {
		n, err := unix.Write(c.p.fd, b[written:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			ev, err := c.wait(unix.POLLOUT)
			if err != nil {
				return err
			}
			if ev&unix.POLLHUP != 0 {
				return io.ErrClosedPipe // host gone: the session is over
			}
			continue
		case err != nil:
			return fmt.Errorf("write port: %w", err)
		}
		written += n
		c.lastIO.Store(time.Now().UnixNano())
	}
	return nil
}

// Close ends the session and wakes its blocked reads, writes and flusher;
// bytes still in the batch are dropped (Flush first to keep them). The
// port stays open for the next host.
func (c *portConn) Close() error {
	c.wmu.Lock()
	c.wclosed = true
	c.wcond.Broadcast()
	c.wmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var one [8]byte
	one[0] = 1 // any non-zero counter value wakes poll
	unix.Write(c.efd, one[:])
	if c.inflight == 0 {
		close(c.idle)
	}
	return nil
}
