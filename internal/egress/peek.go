package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"time"
)

// maxPeek bounds what is read of a connection before its destination is
// decided: a TLS ClientHello or an HTTP request's header.
const maxPeek = 64 << 10

// What a connection's first bytes are.
type firstKind int

const (
	firstTLS   firstKind = iota + 1 // a TLS handshake record
	firstHTTP                       // an HTTP/1 request line's method
	firstOther                      // anything else
)

// errNoSNI is a ClientHello that names no server.
var errNoSNI = errors.New("the TLS ClientHello names no server (no SNI)")

// classify says what the guest's connection carries, from its first
// bytes (first, already read) and as many more as it needs, within
// timeout. For TLS it returns the SNI in lower case. Every byte read
// stays in gc to be read again.
func classify(gc *guestConn, first []byte, timeout time.Duration) (kind firstKind, sni string, err error) {
	gc.SetReadDeadline(time.Now().Add(timeout))
	defer gc.SetReadDeadline(time.Time{})
	src := io.MultiReader(bytes.NewReader(first), gc.r)
	rec := &recorder{r: io.LimitReader(src, maxPeek)}
	defer func() { gc.r = io.MultiReader(bytes.NewReader(rec.buf.Bytes()), src) }()
	br := bufio.NewReaderSize(rec, 4096)
	b, err := br.Peek(1)
	if err != nil {
		return 0, "", err
	}
	if b[0] == 0x16 {
		name, err := clientHelloSNI(br)
		return firstTLS, normalize(name), err
	}
	// An HTTP method is a token of upper-case letters before a space
	// (RFC 9110's are; lower-case or odd ones are not worth the doubt).
	for n := 1; n <= 16; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return firstOther, "", nil
		}
		switch c := b[n-1]; {
		case c == ' ' && n > 1:
			return firstHTTP, "", nil
		case c < 'A' || c > 'Z':
			return firstOther, "", nil
		}
	}
	return firstOther, "", nil
}

func normalize(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

// recorder keeps what was read through it.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// clientHelloSNI reads a ClientHello from r and returns its server name:
// crypto/tls parses it, and the handshake stops there.
func clientHelloSNI(r io.Reader) (string, error) {
	var sni string
	stop := errors.New("stop after the ClientHello")
	err := tls.Server(readOnly{r}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, stop
		},
	}).Handshake()
	if sni != "" {
		return sni, nil
	}
	if err == nil || errors.Is(err, stop) {
		return "", errNoSNI
	}
	return "", err
}

// readOnly is a net.Conn that reads r and drops writes (the alert a
// stopped handshake sends).
type readOnly struct{ r io.Reader }

func (c readOnly) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnly) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnly) Close() error                     { return nil }
func (readOnly) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (readOnly) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (readOnly) SetDeadline(time.Time) error      { return nil }
func (readOnly) SetReadDeadline(time.Time) error  { return nil }
func (readOnly) SetWriteDeadline(time.Time) error { return nil }
