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
// The pumps call write. Readers read through cursors. The delivery cursor
// belongs to the attachment: one reader at a time (the one holding the
// reader token, see acquire) calls nextAt, sends the chunk, and calls advanceAt
// once it was sent. The cursor outlives its readers: a send that failed
// leaves the bytes for the next reader, and what one reader delivered is
// never replayed to the next. Observers (shared attachments) each have a
// cursor of their own that starts at the end of the log: they see the
// output written after they joined, and bytes stay until every cursor that
// needs them has passed them.
//
// While hold is set (someone is attached), a full log makes write wait for
// the reader: backpressure down to the process's pipe. Otherwise write
// does not wait for the delivery cursor; it drops the oldest bytes and
// counts them. It does wait for observers: they lose nothing.
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
	delivered int64 // the delivery cursor: everything before it was delivered or dropped
	// +checklocks:mu
	observers map[*observer]struct{}
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

// observer is the cursor of one shared attachment: the offset of the next
// byte it reads. Guarded by its log's mu.
type observer struct {
	off int64
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
	end  int64  // offset after data; pass to advanceAt once sent
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
// log has room; otherwise it drops the oldest bytes to make room, except
// those an observer has yet to read: for those it waits too.
func (l *outputLog) write(t proto.Type, p []byte) {
	if len(p) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.closed && !l.fitsLocked(t, len(p)) {
		if !l.hold {
			if len(l.observers) == 0 {
				break // appended, then trimmed below
			}
			if l.trimLocked(t, len(p)); l.fitsLocked(t, len(p)) {
				break
			}
		}
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
		l.trimLocked(t, 0)
	}
	l.broadcastLocked()
}

// fitsLocked reports whether n more bytes of type t fit. An empty log
// takes any chunk, so a write never waits for ever.
//
// +checklocks:l.mu
func (l *outputLog) fitsLocked(t proto.Type, n int) bool { return l.roomLocked(t, n, false) }

// endLocked is the offset after the last byte written.
//
// +checklocks:l.mu
func (l *outputLog) endLocked() int64 { return l.start + int64(l.size) }

// observedLocked is the lowest offset an observer has yet to read, or the
// end of the log.
//
// +checklocks:l.mu
func (l *outputLog) observedLocked() int64 {
	low := l.endLocked()
	for o := range l.observers {
		low = min(low, o.off)
	}
	return low
}

// trimLocked drops the oldest bytes until n more bytes of type t would
// fit (n = 0: until the log is within its limits), but none an observer
// has yet to read. Bytes the delivery cursor had not reached count as
// dropped.
//
// +checklocks:l.mu
func (l *outputLog) trimLocked(t proto.Type, n int) {
	floor := l.observedLocked()
	for len(l.chunks) > 0 && l.start < floor && !l.roomLocked(t, n, false) {
		k := min(len(l.chunks[0].data), int(floor-l.start))
		if l.roomLocked(t, n, true) {
			k = min(k, l.size+n-l.limit) // only bytes are over: drop just those
		}
		if unread := l.start + int64(k) - l.delivered; unread > 0 {
			l.dropped += min(unread, int64(k))
			l.delivered = l.start + int64(k)
		}
		l.removeLocked(k)
	}
}

// roomLocked reports whether n more bytes of type t fit (n = 0: whether
// the log is within its limits); with chunksOnly, by the count of chunks
// alone.
//
// +checklocks:l.mu
func (l *outputLog) roomLocked(t proto.Type, n int, chunksOnly bool) bool {
	if n == 0 {
		return len(l.chunks) <= l.maxChunks && (chunksOnly || l.size <= l.limit)
	}
	if len(l.chunks) == 0 {
		return true
	}
	if !chunksOnly && l.size+n > l.limit {
		return false
	}
	last := l.chunks[len(l.chunks)-1]
	return len(l.chunks) < l.maxChunks || last.typ == t && len(last.data)+n <= maxChunk
}

// compactLocked removes the bytes every cursor has passed.
//
// +checklocks:l.mu
func (l *outputLog) compactLocked() {
	floor := min(l.delivered, l.observedLocked())
	for len(l.chunks) > 0 && l.start < floor {
		l.removeLocked(int(min(int64(len(l.chunks[0].data)), floor-l.start)))
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

// chunkAtLocked returns the buffered bytes from offset off to the end of
// the chunk holding it, or ok=false when off is the end of the log.
//
// +checklocks:l.mu
func (l *outputLog) chunkAtLocked(off int64) (_ pending, ok bool) {
	at := l.start
	for _, c := range l.chunks {
		if end := at + int64(len(c.data)); off < end {
			return pending{typ: c.typ, data: c.data[max(off-at, 0):], end: end}, true
		}
		at += int64(len(c.data))
	}
	return pending{}, false
}

// nextAt returns the chunk at observer o's cursor, or with o nil the
// oldest chunk not yet delivered (the caller must hold the reader token),
// waiting for one, or ok=false once stop is closed.
func (l *outputLog) nextAt(o *observer, stop <-chan struct{}) (_ pending, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		select {
		case <-stop:
			return pending{}, false
		default:
		}
		off := l.delivered
		if o != nil {
			off = o.off
		}
		if c, ok := l.chunkAtLocked(off); ok {
			return c, true
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

// observe adds an observer whose cursor is at the end of the log.
func (l *outputLog) observe() *observer {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := &observer{off: l.endLocked()}
	if l.observers == nil {
		l.observers = map[*observer]struct{}{}
	}
	l.observers[o] = struct{}{}
	return o
}

// advanceAt moves observer o's cursor, or with o nil the delivery cursor,
// to end: the bytes before it were delivered. Bytes dropped meanwhile are
// skipped.
func (l *outputLog) advanceAt(o *observer, end int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if o != nil {
		o.off = max(o.off, end)
	} else {
		l.delivered = max(l.delivered, end)
	}
	l.compactLocked()
	l.broadcastLocked()
}

// unobserve removes o: the bytes only it needed go.
func (l *outputLog) unobserve(o *observer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.observers, o)
	l.compactLocked()
	l.broadcastLocked()
}

// setHold switches between waiting (someone is attached) and dropping.
func (l *outputLog) setHold(hold bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hold = hold
	if !hold {
		l.trimLocked(0, 0)
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

// stats returns the bytes buffered for the delivery cursor and the bytes
// dropped so far.
func (l *outputLog) stats() (buffered, dropped int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endLocked() - l.delivered, l.dropped
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
