package server

import (
	"sync"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
)

// outputLog is the output of one process of the table: stdout and stderr
// chunks in the order the pumps read them, at most limit bytes (plus one
// chunk) and maxChunks chunks. Offsets are absolute: the first byte the
// process ever wrote is at 0, and bytes keep their offset when older ones
// are delivered or dropped.
//
// The pumps call write. One reader at a time (the attachment holding the
// reader token, see acquire) calls next, sends the chunk, and calls advance
// once it was sent: bytes are removed only when delivered, so a send that
// failed leaves them for the next reader, and what one reader delivered is
// never replayed to the next.
//
// While hold is set (someone is attached), a full log makes write wait for
// the reader: backpressure down to the process's pipe. Otherwise write
// never waits; it drops the oldest bytes and counts them.
type outputLog struct {
	limit     int           // +checklocksignore: immutable
	maxChunks int           // +checklocksignore: immutable
	reader    chan struct{} // the reader token: full while a reader holds it

	mu sync.Mutex
	// +checklocks:mu
	chunks []outputChunk // oldest first; never empty data
	// +checklocks:mu
	start int64 // offset of the first buffered byte
	// +checklocks:mu
	size int // bytes buffered
	// +checklocks:mu
	dropped int64 // bytes dropped unread
	// +checklocks:mu
	hold bool // a reader is attached: writes wait instead of dropping
	// +checklocks:mu
	closed bool // the writers are done: no more chunks
	// +checklocks:mu
	waiting int // writers waiting for room; for tests
	// +checklocks:mu
	changed chan struct{} // closed and replaced on every change
}

// maxChunk is the most output one chunk gathers: a ring slot, which one
// reference frame carries. Without a ring a chunk goes out as several
// data frames of at most proto.DataChunk.
const maxChunk = ring.SlotSize

type outputChunk struct {
	typ  proto.Type // TypeStdout or TypeStderr
	data []byte
}

// pending is what next returns: a chunk to send, or the end of the output.
type pending struct {
	typ  proto.Type
	data []byte // shared with the log: read only
	end  int64  // offset after data; pass to advance once sent
	eof  bool   // the log is closed and everything was delivered
}

func newOutputLog(limit, maxChunks int) *outputLog {
	return &outputLog{
		limit:     limit,
		maxChunks: maxChunks,
		reader:    make(chan struct{}, 1),
		changed:   make(chan struct{}),
	}
}

// +checklocks:l.mu
func (l *outputLog) broadcastLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// write appends a copy of p. While a reader is attached it waits until the
// log has room; otherwise it drops the oldest bytes to make room.
func (l *outputLog) write(t proto.Type, p []byte) {
	if len(p) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.hold && !l.closed && !l.fitsLocked(t, len(p)) {
		ch := l.changed
		l.waiting++
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
		l.waiting--
	}
	if l.closed {
		return
	}
	if n := len(l.chunks); n > 0 && l.chunks[n-1].typ == t && len(l.chunks[n-1].data)+len(p) <= maxChunk {
		// Appending past the end never touches bytes a reader was handed.
		l.chunks[n-1].data = append(l.chunks[n-1].data, p...)
	} else {
		l.chunks = append(l.chunks, outputChunk{typ: t, data: append([]byte(nil), p...)})
	}
	l.size += len(p)
	if !l.hold {
		l.trimLocked()
	}
	l.broadcastLocked()
}

// fitsLocked reports whether n more bytes of type t fit. An empty log
// takes any chunk, so a write never waits for ever.
//
// +checklocks:l.mu
func (l *outputLog) fitsLocked(t proto.Type, n int) bool {
	if len(l.chunks) == 0 {
		return true
	}
	if l.size+n > l.limit {
		return false
	}
	last := l.chunks[len(l.chunks)-1]
	return len(l.chunks) < l.maxChunks || last.typ == t && len(last.data)+n <= maxChunk
}

// trimLocked drops the oldest bytes until the log is within its limits.
//
// +checklocks:l.mu
func (l *outputLog) trimLocked() {
	for len(l.chunks) > 0 && (l.size > l.limit || len(l.chunks) > l.maxChunks) {
		n := len(l.chunks[0].data)
		if len(l.chunks) <= l.maxChunks && l.size-l.limit < n {
			n = l.size - l.limit
		}
		l.removeLocked(n)
		l.dropped += int64(n)
	}
}

// removeLocked removes n bytes (at most one chunk) from the front.
//
// +checklocks:l.mu
func (l *outputLog) removeLocked(n int) {
	c := &l.chunks[0]
	c.data = c.data[n:]
	l.start += int64(n)
	l.size -= n
	if len(c.data) == 0 {
		l.chunks[0] = outputChunk{}
		l.chunks = l.chunks[1:]
		if len(l.chunks) == 0 {
			l.chunks = nil // let an idle log hold no memory
		}
	}
}

// next returns the oldest chunk not yet delivered, waiting for one, or
// ok=false once stop is closed. The caller must hold the reader token.
func (l *outputLog) next(stop <-chan struct{}) (_ pending, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		select {
		case <-stop:
			return pending{}, false
		default:
		}
		if len(l.chunks) > 0 {
			c := l.chunks[0]
			return pending{typ: c.typ, data: c.data, end: l.start + int64(len(c.data))}, true
		}
		if l.closed {
			return pending{eof: true}, true
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-stop:
		}
		l.mu.Lock()
	}
}

// advance removes the bytes before offset end: they were delivered. Bytes
// already dropped meanwhile are skipped.
func (l *outputLog) advance(end int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.chunks) > 0 && l.start < end {
		l.removeLocked(int(min(int64(len(l.chunks[0].data)), end-l.start)))
	}
	l.broadcastLocked()
}

// setHold switches between waiting (someone is attached) and dropping.
func (l *outputLog) setHold(hold bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hold = hold
	if !hold {
		l.trimLocked()
	}
	l.broadcastLocked()
}

// close marks the end of the output: the writers are done.
func (l *outputLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.broadcastLocked()
}

// stats returns the bytes buffered and the bytes dropped so far.
func (l *outputLog) stats() (buffered, dropped int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.size), l.dropped
}

// waiters returns how many writers wait for room.
func (l *outputLog) waiters() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// acquire takes the reader token, waiting while another reader holds it,
// and reports false if stop closed first. A reader taken over may still be
// sending a chunk it was handed; the token makes its successor wait, so the
// chunk is delivered once.
func (l *outputLog) acquire(stop <-chan struct{}) bool {
	select {
	case l.reader <- struct{}{}:
		return true
	case <-stop:
		return false
	}
}

// release returns the reader token.
func (l *outputLog) release() { <-l.reader }
