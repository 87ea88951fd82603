package worker

import (
	"io"
	"sync"
)

// inputPipe carries a WebSocket client's stdin to the process's input
// copier. Unlike io.Pipe it holds up to max bytes: while the copier is
// busy, the client's messages (32 KiB each) gather, and the copier moves
// them on in one read as large as its buffer, a ring slot's worth, rather
// than a slot per message. A full pipe blocks the writer, which is the
// client's back-pressure; a read never waits for more than one byte, so
// typed input goes on at once.
type inputPipe struct {
	mu   sync.Mutex
	cond *sync.Cond // +checklocksignore: on mu; immutable
	max  int        // +checklocksignore: immutable
	// +checklocks:mu
	buf []byte
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	err error // what Read returns once the bytes are read: io.EOF or the writer's error
}

func newInputPipe(max int) *inputPipe {
	p := &inputPipe{max: max}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Read returns what the pipe holds, up to len(b), waiting while it is
// empty and open.
func (p *inputPipe) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.buf) == 0 && !p.closed {
		p.cond.Wait()
	}
	if len(p.buf) == 0 {
		return 0, p.err
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	if len(p.buf) == 0 {
		p.buf = nil // let the backing array go
	}
	p.cond.Broadcast()
	return n, nil
}

// Write adds b to the pipe, waiting while it is full. It fails once the
// pipe is closed.
func (p *inputPipe) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for len(b) > 0 {
		for len(p.buf) >= p.max && !p.closed {
			p.cond.Wait()
		}
		if p.closed {
			return n, io.ErrClosedPipe
		}
		m := min(len(b), p.max-len(p.buf))
		p.buf = append(p.buf, b[:m]...)
		b, n = b[m:], n+m
		p.cond.Broadcast()
	}
	return n, nil
}

// Close ends the input: Read returns io.EOF once the bytes are read.
func (p *inputPipe) Close() error { return p.CloseWithError(nil) }

// CloseWithError ends the input with err (nil: io.EOF), the first close
// winning; bytes already written are still read.
func (p *inputPipe) CloseWithError(err error) error {
	if err == nil {
		err = io.EOF
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed, p.err = true, err
		p.cond.Broadcast()
	}
	return nil
}
