package server

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/proto"
	"space/internal/testenv"
)

// got is one chunk as a reader sees it.
type got struct {
	Type proto.Type
	Data string
}

// drain reads everything buffered, delivering it, and reports whether the
// log ended (closed and empty).
func drain(t *testing.T, l *outputLog) (chunks []got, eof bool) {
	t.Helper()
	never := make(chan struct{})
	for {
		l.mu.Lock()
		empty, closed := l.endLocked() == l.delivered, l.closed
		l.mu.Unlock()
		if empty && !closed {
			return chunks, false
		}
		p, ok := l.nextAt(nil, never)
		if !ok {
			t.Fatalf("next() = not ok with an open stop channel")
		}
		if p.eof {
			return chunks, true
		}
		chunks = append(chunks, got{p.typ, string(p.data)})
		l.advanceAt(nil, p.end)
	}
}

func TestOutputLogDropsOldestWhileDetached(t *testing.T) {
	tests := []struct {
		name        string
		limit       int
		maxChunks   int
		writes      []got
		want        []got
		wantDropped int64
	}{
		{
			name: "within limit", limit: 10, maxChunks: 10,
			writes: []got{{proto.TypeStdout, "abc"}, {proto.TypeStderr, "de"}, {proto.TypeStdout, "f"}},
			want:   []got{{proto.TypeStdout, "abc"}, {proto.TypeStderr, "de"}, {proto.TypeStdout, "f"}},
		},
		{
			name: "same type coalesces", limit: 10, maxChunks: 10,
			writes: []got{{proto.TypeStdout, "abc"}, {proto.TypeStdout, "def"}},
			want:   []got{{proto.TypeStdout, "abcdef"}},
		},
		{
			name: "oldest bytes dropped, chunk trimmed", limit: 10, maxChunks: 10,
			writes:      []got{{proto.TypeStdout, "abcdef"}, {proto.TypeStderr, "ghijkl"}},
			want:        []got{{proto.TypeStdout, "cdef"}, {proto.TypeStderr, "ghijkl"}},
			wantDropped: 2,
		},
		{
			name: "whole chunks dropped", limit: 4, maxChunks: 10,
			writes:      []got{{proto.TypeStdout, "ab"}, {proto.TypeStderr, "cd"}, {proto.TypeStdout, "efgh"}},
			want:        []got{{proto.TypeStdout, "efgh"}},
			wantDropped: 4,
		},
		{
			name: "chunk larger than the limit", limit: 3, maxChunks: 10,
			writes:      []got{{proto.TypeStdout, "abcdefg"}},
			want:        []got{{proto.TypeStdout, "efg"}},
			wantDropped: 4,
		},
		{
			name: "too many chunks", limit: 100, maxChunks: 2,
			writes:      []got{{proto.TypeStdout, "a"}, {proto.TypeStderr, "b"}, {proto.TypeStdout, "c"}},
			want:        []got{{proto.TypeStderr, "b"}, {proto.TypeStdout, "c"}},
			wantDropped: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newOutputLog(tt.limit, tt.maxChunks)
			for _, w := range tt.writes {
				l.write(w.Type, []byte(w.Data)) // never waits: nobody attached
			}
			buffered, dropped := l.stats()
			if dropped != tt.wantDropped {
				t.Errorf("dropped = %d, want %d", dropped, tt.wantDropped)
			}
			l.close()
			chunks, eof := drain(t, l)
			if diff := cmp.Diff(tt.want, chunks); diff != "" || !eof {
				t.Errorf("read back (eof %v) differs (-want +got):\n%s", eof, diff)
			}
			n := 0
			for _, c := range tt.want {
				n += len(c.Data)
			}
			if buffered != int64(n) {
				t.Errorf("buffered = %d, want %d", buffered, n)
			}
		})
	}
}

func TestOutputLogBackpressure(t *testing.T) {
	l := newOutputLog(10, 100)
	l.setHold(true)
	l.write(proto.TypeStdout, []byte("12345678"))
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		l.write(proto.TypeStderr, []byte("abcdefgh")) // does not fit: waits
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return l.waiters() == 1 })
	if buffered, dropped := l.stats(); buffered != 8 || dropped != 0 {
		t.Errorf("while the writer waits: buffered %d, dropped %d; want 8, 0", buffered, dropped)
	}
	// The reader is handed the chunk, but the writer still waits: the
	// bytes leave the log only once advance says they were sent.
	p, ok := l.nextAt(nil, nil)
	if !ok || string(p.data) != "12345678" {
		t.Fatalf("next() = %q, %v; want %q", p.data, ok, "12345678")
	}
	select {
	case <-wrote:
		t.Fatalf("write returned before the reader advanced")
	default:
	}
	l.advanceAt(nil, p.end)
	<-wrote
	chunks, _ := drain(t, l)
	if diff := cmp.Diff([]got{{proto.TypeStderr, "abcdefgh"}}, chunks); diff != "" {
		t.Errorf("after advance (-want +got):\n%s", diff)
	}
	if _, dropped := l.stats(); dropped != 0 {
		t.Errorf("dropped = %d while attached, want 0", dropped)
	}
}

func TestOutputLogDetachReleasesWriter(t *testing.T) {
	l := newOutputLog(10, 100)
	l.setHold(true)
	l.write(proto.TypeStdout, []byte("12345678"))
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		l.write(proto.TypeStdout, []byte("abcdefgh"))
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return l.waiters() == 1 })
	l.setHold(false) // the attachment went away: the writer drops instead
	<-wrote
	chunks, _ := drain(t, l)
	if diff := cmp.Diff([]got{{proto.TypeStdout, "78abcdefgh"}}, chunks); diff != "" {
		t.Errorf("after detach (-want +got):\n%s", diff)
	}
	if _, dropped := l.stats(); dropped != 6 {
		t.Errorf("dropped = %d, want 6", dropped)
	}
}

func TestOutputLogDeliveredOnce(t *testing.T) {
	l := newOutputLog(100, 100)
	stop := make(chan struct{})
	l.write(proto.TypeStdout, []byte("abc"))

	// The first reader is handed "abc" and sends it; meanwhile the process
	// writes more, which lands in the same chunk.
	if !l.acquire(stop) {
		t.Fatalf("acquire() = false")
	}
	p, _ := l.nextAt(nil, stop)
	l.write(proto.TypeStdout, []byte("def"))
	l.advanceAt(nil, p.end)
	l.release()

	// A reader whose send failed does not advance: the next reader gets
	// the same bytes.
	l.acquire(stop)
	p, _ = l.nextAt(nil, stop)
	if string(p.data) != "def" {
		t.Fatalf("second reader next() = %q, want %q (delivered bytes are not replayed)", p.data, "def")
	}
	l.release()

	l.acquire(stop)
	l.close()
	chunks, eof := drain(t, l)
	if diff := cmp.Diff([]got{{proto.TypeStdout, "def"}}, chunks); diff != "" || !eof {
		t.Errorf("third reader (eof %v) differs (-want +got):\n%s", eof, diff)
	}
	l.release()
}

func TestOutputLogReaderToken(t *testing.T) {
	l := newOutputLog(100, 100)
	if !l.acquire(nil) {
		t.Fatalf("acquire() = false")
	}
	stop := make(chan struct{})
	close(stop)
	if l.acquire(stop) {
		t.Errorf("acquire() while held = true, want false once stop closed")
	}
	if _, ok := l.nextAt(nil, stop); ok {
		t.Errorf("next() with stop closed = ok, want not ok")
	}
	l.release()
	if !l.acquire(make(chan struct{})) {
		t.Errorf("acquire() after release = false")
	}
}

func TestOutputLogObserver(t *testing.T) {
	l := newOutputLog(10, 100)
	never := make(chan struct{})
	l.setHold(true)
	l.write(proto.TypeStdout, []byte("abc"))
	o := l.observe() // joins after "abc": sees only what comes next
	l.write(proto.TypeStdout, []byte("def"))
	l.write(proto.TypeStderr, []byte("gh"))

	// The delivery cursor gets everything; delivering does not take the
	// observer's bytes away.
	chunks, _ := drain(t, l)
	if diff := cmp.Diff([]got{{proto.TypeStdout, "abcdef"}, {proto.TypeStderr, "gh"}}, chunks); diff != "" {
		t.Errorf("delivered (-want +got):\n%s", diff)
	}
	var seen []got
	for range 2 {
		p, ok := l.nextAt(o, never)
		if !ok || p.eof {
			t.Fatalf("nextFor() = %+v, %v", p, ok)
		}
		seen = append(seen, got{p.typ, string(p.data)})
		l.advanceAt(o, p.end)
	}
	if diff := cmp.Diff([]got{{proto.TypeStdout, "def"}, {proto.TypeStderr, "gh"}}, seen); diff != "" {
		t.Errorf("observed (-want +got):\n%s", diff)
	}
	if l.mu.Lock(); l.size != 0 {
		t.Errorf("%d bytes left once every cursor passed them", l.size)
	}
	l.mu.Unlock()

	// Detached, a writer drops what only the delivery cursor wanted, but
	// waits for the observer.
	l.setHold(false)
	l.write(proto.TypeStdout, []byte("12345678"))
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		l.write(proto.TypeStderr, []byte("ijklmnop"))
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return l.waiters() == 1 })
	p, _ := l.nextAt(o, never)
	if string(p.data) != "12345678" {
		t.Fatalf("observer next = %q", p.data)
	}
	l.advanceAt(o, p.end)
	<-wrote
	if _, dropped := l.stats(); dropped != 6 {
		t.Errorf("dropped = %d, want 6 (just enough of the first write to make room)", dropped)
	}
	l.close()
	p, _ = l.nextAt(o, never)
	if string(p.data) != "ijklmnop" {
		t.Fatalf("observer next = %q", p.data)
	}
	l.advanceAt(o, p.end)
	if p, _ = l.nextAt(o, never); !p.eof {
		t.Errorf("observer after close = %+v, want eof", p)
	}
	l.unobserve(o)
	chunks, eof := drain(t, l)
	if diff := cmp.Diff([]got{{proto.TypeStdout, "78"}, {proto.TypeStderr, "ijklmnop"}}, chunks); diff != "" || !eof {
		t.Errorf("delivered after the drop (-want +got):\n%s (eof %v)", diff, eof)
	}
}
