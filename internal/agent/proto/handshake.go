package proto

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"

	"space/internal/errkind"
)

// The handshake opens every host connection:
//
//	host  → "SPACE-HELLO <version> <nonce>\n"   (repeated until the reply)
//	guest → "SPACE-READY <version> <nonce> <agent version>\n"
//	host  → "SPACE-START <nonce>\n"
//
// then both sides speak yamux. Each side discards whatever precedes the line
// it waits for: on a virtio-serial port, bytes from an earlier host session
// can still be in flight, and a hello sent while the guest was still busy
// with the previous session can be lost, hence the repeats. The host stops
// repeating before it sends START, so after START only session bytes
// follow. The nonce ties every line to one connection.
const (
	helloPrefix = "SPACE-HELLO "
	readyPrefix = "SPACE-READY "
	startPrefix = "SPACE-START "
	maxLine     = 256
	// MaxHandshakeScan bounds how many stale bytes the host skips looking
	// for the guest's reply before it gives up on the connection.
	MaxHandshakeScan = 8 << 20
)

// ErrHandshake is returned when a peer's handshake line is malformed.
var ErrHandshake = fmt.Errorf("bad handshake: %w", errkind.Unavailable)

// Hello is the host's greeting.
type Hello struct {
	Version int
	Nonce   string // 16..64 characters of [0-9a-f]
}

// Ready is the guest's reply.
type Ready struct {
	Version      int
	Nonce        string
	AgentVersion string
}

// Line encodes h as a handshake line.
func (h Hello) Line() []byte {
	return fmt.Appendf(nil, "%s%d %s\n", helloPrefix, h.Version, h.Nonce)
}

// StartLine is the host's last handshake line for nonce.
func StartLine(nonce string) []byte { return fmt.Appendf(nil, "%s%s\n", startPrefix, nonce) }

// ReadStart waits, after the guest replied to hello, for the host's start
// line. A hello with another nonce means a new host took over the port: it
// is returned, and the guest answers it instead. Repeats of the current
// hello are skipped.
func ReadStart(br *bufio.Reader, current Hello) (next *Hello, err error) {
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, err
		}
		if i := bytes.Index(line, []byte(startPrefix)); i >= 0 {
			if f := strings.Fields(string(line[i+len(startPrefix):])); len(f) == 1 && f[0] == current.Nonce {
				return nil, nil
			}
			continue
		}
		if bytes.Contains(line, []byte(helloPrefix)) {
			h, err := ReadHello(bufio.NewReader(bytes.NewReader(line)), 0)
			if err == nil && h.Nonce != current.Nonce {
				return &h, nil
			}
		}
	}
}

// readLine returns the next line (at most maxLine bytes of it; the rest of
// an overlong line is skipped).
func readLine(br *bufio.Reader) ([]byte, error) {
	var first []byte
	for {
		line, err := br.ReadSlice('\n')
		if first == nil {
			first = append([]byte(nil), line[:min(len(line), maxLine)]...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, err
		}
		return first, nil
	}
}

// Line encodes r as a handshake line.
func (r Ready) Line() []byte {
	return fmt.Appendf(nil, "%s%d %s %s\n", readyPrefix, r.Version, r.Nonce, r.AgentVersion)
}

// ReadHello skips input until a hello line and parses it. limit bounds the
// bytes skipped (0 = no bound: the guest waits as long as the host needs).
func ReadHello(br *bufio.Reader, limit int64) (Hello, error) {
	f, err := scanLine(br, helloPrefix, limit)
	if err != nil {
		return Hello{}, err
	}
	if len(f) != 2 {
		return Hello{}, fmt.Errorf("hello has %d fields: %w", len(f), ErrHandshake)
	}
	v, err := strconv.Atoi(f[0])
	if err != nil || v < 1 {
		return Hello{}, fmt.Errorf("hello version %q: %w", f[0], ErrHandshake)
	}
	if !validNonce(f[1]) {
		return Hello{}, fmt.Errorf("hello nonce: %w", ErrHandshake)
	}
	return Hello{Version: v, Nonce: f[1]}, nil
}

// ReadReady skips input until a ready line carrying nonce and parses it.
// Ready lines with another nonce are stale and skipped too.
func ReadReady(br *bufio.Reader, nonce string, limit int64) (Ready, error) {
	for {
		f, err := scanLine(br, readyPrefix, limit)
		if err != nil {
			return Ready{}, err
		}
		if len(f) != 3 {
			return Ready{}, fmt.Errorf("ready has %d fields: %w", len(f), ErrHandshake)
		}
		if f[1] != nonce {
			continue
		}
		v, err := strconv.Atoi(f[0])
		if err != nil || v < 1 {
			return Ready{}, fmt.Errorf("ready version %q: %w", f[0], ErrHandshake)
		}
		if !printable(f[2]) {
			return Ready{}, fmt.Errorf("ready agent version: %w", ErrHandshake)
		}
		return Ready{Version: v, Nonce: f[1], AgentVersion: f[2]}, nil
	}
}

// scanLine reads lines until one contains prefix and returns the fields
// after it. The prefix may follow stale bytes on the same line: a peer that
// died mid-write leaves no newline behind. Overlong lines are skipped in
// bounded pieces.
func scanLine(br *bufio.Reader, prefix string, limit int64) ([]string, error) {
	var skipped int64
	for {
		if limit > 0 && skipped > limit {
			return nil, fmt.Errorf("no %q line in %d bytes: %w", strings.TrimSpace(prefix), skipped, ErrHandshake)
		}
		line, err := br.ReadSlice('\n')
		skipped += int64(len(line))
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err == io.EOF && len(line) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		i := bytes.Index(line, []byte(prefix))
		if i < 0 || len(line)-i-len(prefix) > maxLine {
			continue
		}
		return strings.Fields(string(line[i+len(prefix):])), nil
	}
}

func validNonce(s string) bool {
	if len(s) < 16 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}
