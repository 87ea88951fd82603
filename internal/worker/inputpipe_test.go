package worker

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

// TestInputPipe: messages gather into one read, a full pipe holds its
// writer until a read makes room, and a close lets the reader drain first.
func TestInputPipe(t *testing.T) {
	p := newInputPipe(8)
	p.Write([]byte("abc"))
	p.Write([]byte("de"))
	buf := make([]byte, 16)
	if n, err := p.Read(buf); err != nil || string(buf[:n]) != "abcde" {
		t.Errorf("Read = %q, %v; want the two writes in one read", buf[:n], err)
	}

	wrote := make(chan error, 1)
	go func() {
		_, err := p.Write(bytes.Repeat([]byte("x"), 12)) // 4 more than fit
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("Write past the pipe's size returned (%v) before a read", err)
	case <-time.After(100 * time.Millisecond):
	}
	if n, _ := p.Read(buf); n != 8 {
		t.Errorf("Read of a full pipe = %d bytes, want 8", n)
	}
	if err := <-wrote; err != nil {
		t.Errorf("Write after the read made room = %v", err)
	}

	p.Close()
	if n, err := p.Read(buf); err != nil || n != 4 {
		t.Errorf("Read after Close = %d, %v; want the 4 bytes left", n, err)
	}
	if _, err := p.Read(buf); err != io.EOF {
		t.Errorf("Read of a drained, closed pipe = %v, want EOF", err)
	}
	if _, err := p.Write([]byte("y")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Write after Close = %v, want ErrClosedPipe", err)
	}

	q := newInputPipe(8)
	cut := errors.New("client went away")
	q.CloseWithError(cut)
	q.Close() // the first close wins
	if _, err := q.Read(buf); err != cut {
		t.Errorf("Read after CloseWithError = %v, want its error", err)
	}
}
