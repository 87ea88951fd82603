package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// maxPeek bounds what is read of a connection before its destination is
// decided: a TLS ClientHello or an HTTP request's header.
const maxPeek = 64 << 10

// errNoName is a first message that names no host.
var errNoName = errors.New("the connection names no host (no TLS SNI, no HTTP Host)")

// peekName reads the start of a connection from the guest: a TLS
// ClientHello (its SNI) or an HTTP/1 request (its Host, without a port).
// It returns the name in lower case, whether the connection is TLS, and
// every byte read, which must be sent on before anything else.
func peekName(c net.Conn, timeout time.Duration) (name string, isTLS bool, head []byte, err error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	rec := &recorder{r: io.LimitReader(c, maxPeek)}
	br := bufio.NewReaderSize(rec, 4096)
	first, err := br.Peek(1)
	if err != nil {
		return "", false, rec.buf.Bytes(), err
	}
	if first[0] == 0x16 { // a TLS handshake record
		name, err = clientHelloSNI(br)
		return normalize(name), true, rec.buf.Bytes(), err
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return "", false, rec.buf.Bytes(), err
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return normalize(host), false, rec.buf.Bytes(), nil
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
		return "", errNoName
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
