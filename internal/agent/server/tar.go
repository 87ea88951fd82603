package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/agent/tarball"
	"space/internal/errkind"
)

// tarRead sends the directory a.Path as a tar stream: an empty result,
// the archive as data frames, an end frame. A failure after the result
// is an error frame; the host then discards what arrived.
func (s *Server) tarRead(ctx context.Context, c *call, a proto.PathArgs) error {
	p, err := guestPath(a.Path)
	if err != nil {
		return c.fail(err)
	}
	if fi, err := os.Stat(p); err != nil {
		return c.fail(err)
	} else if !fi.IsDir() {
		return c.fail(fmt.Errorf("tar %s: not a directory: %w", p, errkind.FailedPrecondition))
	}
	if err := c.result(proto.Empty{}); err != nil {
		return err
	}
	ts := &tarSender{s: s, c: c, ctx: ctx, buf: make([]byte, 0, ring.SlotSize),
		pages: a.Pages && s.cfg.Pages != nil && c.sess.ringSession() != nil}
	_, err = tarball.Pack(ctx, p, ts)
	if err == nil {
		err = ts.flush()
	}
	switch {
	case errors.Is(err, errHostGone):
		return err
	case err != nil:
		return c.fail(err)
	}
	return c.send(proto.TypeEnd, nil)
}

// tarSender sends the archive Pack writes as data, in slot-sized pieces,
// and the content of large files in place where the host asked for that
// (tarball.FileSender).
type tarSender struct {
	s     *Server
	c     *call
	ctx   context.Context
	buf   []byte // what is not sent yet; a slot's worth at most
	pages bool
}

func (t *tarSender) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := copy(t.buf[len(t.buf):cap(t.buf)], p)
		t.buf, p = t.buf[:len(t.buf)+k], p[k:]
		if len(t.buf) == cap(t.buf) {
			if err := t.flush(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

func (t *tarSender) flush() error {
	if len(t.buf) == 0 {
		return nil
	}
	err := t.c.sendOutput(t.ctx, proto.TypeData, t.buf)
	t.buf = t.buf[:0]
	return err
}

// SendFile sends n bytes of f: in place while it can, the rest read
// straight into the buffer.
func (t *tarSender) SendFile(f *os.File, n int64) (int64, error) {
	if err := t.flush(); err != nil {
		return 0, err
	}
	var sent int64
	if t.pages {
		next, err := t.s.sendPages(t.c, f, 0, n)
		if err != nil {
			return next, err
		}
		sent = next
	}
	for sent < n {
		if len(t.buf) == cap(t.buf) {
			if err := t.flush(); err != nil {
				return sent, err
			}
		}
		room := t.buf[len(t.buf):cap(t.buf)]
		if rest := n - sent; rest < int64(len(room)) {
			room = room[:rest]
		}
		k, err := f.ReadAt(room, sent)
		t.buf = t.buf[:len(t.buf)+k]
		sent += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// tarWrite unpacks the host's tar stream into a staging directory beside
// a.Path and moves it into place only once the archive arrived whole and
// well formed: a cut or bad stream leaves a.Path as it was.
func (s *Server) tarWrite(ctx context.Context, c *call, a proto.TarWriteArgs) error {
	p, err := guestPath(a.Path)
	if err == nil && p == "/" {
		err = fmt.Errorf("tar into /: unpack into a directory below it: %w", errkind.InvalidArgument)
	}
	if err == nil && a.MkdirAll {
		err = os.MkdirAll(filepath.Dir(p), 0o755)
	}
	var staging string
	if err == nil {
		staging, err = os.MkdirTemp(filepath.Dir(p), "."+filepath.Base(p)+".space-untar-*")
	}
	if err == nil {
		// A new directory gets mkdir's mode, unless the archive names
		// its own ("./").
		err = os.Chmod(staging, 0o755)
	}
	if err != nil {
		return c.refuse(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	type unpacked struct {
		st  tarball.Stats
		err error
	}
	done := make(chan unpacked, 1)
	go func() {
		st, err := tarball.Unpack(ctx, pr, staging, tarball.Options{Privileged: true}) // the sandbox owner's archive
		if err == nil {
			// Whatever follows the archive's end must be read too, or
			// the sender blocks; it is ignored, as tar does.
			_, err = io.Copy(io.Discard, pr)
		}
		pr.CloseWithError(err)
		done <- unpacked{st, err}
	}()
	recvErr := c.receive(func(b []byte) error {
		_, err := pw.Write(b)
		return err
	})
	if recvErr != nil {
		pw.CloseWithError(recvErr)
	} else {
		pw.Close() // the archive must end within the stream
	}
	res := <-done
	if recvErr != nil || res.err != nil {
		os.RemoveAll(staging) // before the answer: a refused archive leaves nothing
	}
	switch {
	case errors.Is(recvErr, errHostGone):
		return recvErr
	case res.err != nil:
		return c.refuse(fmt.Errorf("untar into %s: %w", p, res.err))
	case recvErr != nil:
		return c.refuse(fmt.Errorf("untar into %s: %w", p, recvErr))
	}
	if err := tarball.Place(staging, p, tarball.Options{Privileged: true}); err != nil {
		os.RemoveAll(staging)
		return c.fail(fmt.Errorf("untar into %s: %w", p, err))
	}
	return c.result(proto.TarResult{Entries: res.st.Entries, Bytes: res.st.Bytes})
}
