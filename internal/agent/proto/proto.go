// Package proto defines the wire protocol between the host and space-agent,
// the guest's PID 1. docs/agent-protocol.md is its prose description; the two
// change together, and Version changes whenever a change is not backward
// compatible.
//
// A host connection is a byte stream (a virtio-serial port or a vsock
// connection). It starts with a line handshake (see Hello), then carries a
// yamux session: the host opens one stream per call, the guest accepts. Each
// stream carries frames: a 1-byte type, a 4-byte big-endian payload length and
// the payload. The first frame on a stream is a Request; what follows depends
// on the op.
//
// The host treats every frame it reads as untrusted: the Reader bounds sizes,
// and nothing in a reply is used as a host path.
package proto

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"space/internal/errkind"
)

// Version is the protocol version both sides announce in the handshake.
const Version = 1

// Size limits. A frame above MaxFrame is refused before its payload is read.
const (
	MaxFrame   = 1 << 20  // largest payload of any frame
	MaxControl = 64 << 10 // largest JSON payload, except list batches
	DataChunk  = 64 << 10 // the size senders cut data streams into
	headerLen  = 5
)

// Type is a frame type. Values are wire format and never change.
type Type uint8

// Frame types. "host→" frames are sent by the host, "guest→" by the agent.
const (
	TypeRequest  Type = 1  // host→ JSON Request; first frame of a stream
	TypeResult   Type = 2  // guest→ JSON result of the op
	TypeError    Type = 3  // guest→ JSON Error; ends the call
	TypeData     Type = 4  // file bytes, either direction
	TypeEnd      Type = 5  // end of file bytes, either direction; empty
	TypeStdin    Type = 6  // host→ bytes for the process's stdin (or pty)
	TypeStdinEOF Type = 7  // host→ close the process's stdin; empty
	TypeStdout   Type = 8  // guest→ bytes the process wrote to stdout (or the pty)
	TypeStderr   Type = 9  // guest→ bytes the process wrote to stderr
	TypeSignal   Type = 10 // host→ JSON Signal
	TypeResize   Type = 11 // host→ JSON WinSize
	TypeStarted  Type = 12 // guest→ JSON Started
	TypeExit     Type = 13 // guest→ JSON Exit; ends an exec
	// TypeDataRef stands for a data, stdout or stderr frame whose bytes
	// are in the session's ring region (package ring: a ring.Ref).
	// Either direction, only after an OpRing call succeeded.
	TypeDataRef Type = 14
	// TypeRelease gives ring slots back to their sender (ring.AppendRelease);
	// either direction, on the OpRing stream only.
	TypeRelease Type = 15
	// TypePagesRef stands for data bytes that lie in the guest's page
	// cache (ring.PagesRef): the host copies them from guest memory and
	// gives the piece back with a Release of its ID on the same stream.
	// Only in a file.read or tar.read the host asked for it
	// (ReadArgs.Pages, PathArgs.Pages).
	TypePagesRef Type = 16
)

var typeNames = map[Type]string{
	TypeRequest: "request", TypeResult: "result", TypeError: "error", TypeData: "data",
	TypeEnd: "end", TypeStdin: "stdin", TypeStdinEOF: "stdin_eof", TypeStdout: "stdout",
	TypeStderr: "stderr", TypeSignal: "signal", TypeResize: "resize", TypeStarted: "started",
	TypeExit: "exit", TypeDataRef: "data_ref", TypeRelease: "release",
	TypePagesRef: "pages_ref",
}

func (t Type) String() string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Known reports whether t is a frame type of this protocol version.
func (t Type) Known() bool { _, ok := typeNames[t]; return ok }

// ErrFrameTooLarge is returned by Reader.Next for a frame above the limit.
var ErrFrameTooLarge = fmt.Errorf("frame too large: %w", errkind.InvalidArgument)

// ErrUnknownType is returned by Reader.Next for a frame type it does not know.
var ErrUnknownType = fmt.Errorf("unknown frame type: %w", errkind.InvalidArgument)

// Frame is one decoded frame. Payload is owned by the caller.
type Frame struct {
	Type    Type
	Payload []byte
}

// Reader decodes frames from a stream, refusing any above its limit.
type Reader struct {
	r   *bufio.Reader
	max int
	hdr [headerLen]byte
}

// NewReader returns a Reader that accepts payloads of up to max bytes
// (MaxFrame if max is 0 or larger).
func NewReader(r io.Reader, max int) *Reader {
	if max <= 0 || max > MaxFrame {
		max = MaxFrame
	}
	return &Reader{r: bufio.NewReaderSize(r, 32<<10), max: max}
}

// Next reads one frame. io.EOF means the stream ended cleanly between frames;
// a stream that ends inside a frame gives io.ErrUnexpectedEOF. After
// ErrFrameTooLarge or ErrUnknownType the stream is out of step and must be
// abandoned.
func (r *Reader) Next() (Frame, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return Frame{}, err
	}
	t := Type(r.hdr[0])
	n := uint32(r.hdr[1])<<24 | uint32(r.hdr[2])<<16 | uint32(r.hdr[3])<<8 | uint32(r.hdr[4])
	if !t.Known() {
		return Frame{}, fmt.Errorf("%w %d", ErrUnknownType, uint8(t))
	}
	if n > uint32(r.max) {
		return Frame{}, fmt.Errorf("%s frame of %d bytes (limit %d): %w", t, n, r.max, ErrFrameTooLarge)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r.r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return Frame{Type: t, Payload: p}, nil
}

// AppendFrame appends the encoding of a frame to b.
func AppendFrame(b []byte, t Type, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(t), byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(b, payload...)
}

// WriteFrame writes one frame with a single Write call, so a writer shared by
// goroutines under a lock never interleaves frames.
func WriteFrame(w io.Writer, t Type, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("write %s frame of %d bytes: %w", t, len(payload), ErrFrameTooLarge)
	}
	_, err := w.Write(AppendFrame(make([]byte, 0, headerLen+len(payload)), t, payload))
	return err
}

// WriteJSON writes a frame whose payload is v encoded as JSON.
func WriteJSON(w io.Writer, t Type, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", t, err)
	}
	return WriteFrame(w, t, p)
}

// DecodeJSON decodes a frame's JSON payload into v, refusing payloads above
// max bytes (MaxControl if max is 0) and unknown fields.
func DecodeJSON(f Frame, max int, v any) error {
	if max <= 0 {
		max = MaxControl
	}
	if len(f.Payload) > max {
		return fmt.Errorf("%s payload of %d bytes (limit %d): %w", f.Type, len(f.Payload), max, ErrFrameTooLarge)
	}
	dec := json.NewDecoder(bytes.NewReader(f.Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode %s frame: %v: %w", f.Type, err, errkind.InvalidArgument)
	}
	if dec.More() {
		return fmt.Errorf("decode %s frame: trailing data: %w", f.Type, errkind.InvalidArgument)
	}
	return nil
}
