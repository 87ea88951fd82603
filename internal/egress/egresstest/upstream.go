// Package egresstest runs the upstream that egress tests reach: HTTPS and
// HTTP servers with a CA of their own, on a documentation address in a
// network namespace the test creates, so that no traffic leaves the host.
package egresstest

import (
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"space/internal/netns"
	"space/internal/testenv"
)

// Addr is the upstream's address: on the loopback of its namespace, and
// nowhere else.
var Addr = netip.MustParseAddr("198.51.100.10")

// Addr6 is the upstream's IPv6 address (documentation range), where the
// same servers listen.
var Addr6 = netip.MustParseAddr("2001:db8::10")

// Names are the names its certificate holds.
var Names = []string{"api.test", "other.test", "x.wild.test"}

// BigBody is what GET /big answers with, in bytes.
const BigBody = 64 << 20

// BannerPort is the upstream's port whose server speaks first (as SSH
// or SMTP do), with Banner, and then echoes what it reads.
const (
	BannerPort = 2222
	Banner     = "SSH-2.0-space-test\r\n"
)

// Echo is what /echo answers: the request as the upstream saw it.
type Echo struct {
	Host, Method, Path, RawQuery, Proto string
	Header                              http.Header
	Body                                string
}

// Upstream is the running servers: 443 (TLS, ALPN h2 and http/1.1) and
// 80 at Addr. They answer "hello HOST", GET /big with BigBody zero
// bytes, /redirect with a 302 to https://other.test/landed, /echo with
// the request as JSON (see Echo; gzip-compressed when the client accepts
// it), /brotli with a body it says is br-encoded, and /ws with a
// WebSocket that sends back each message after the request's headers as
// JSON. Port BannerPort speaks first: it sends Banner, then echoes.
type Upstream struct {
	Netns string         // the namespace's path
	CAPEM []byte         // the CA's certificate
	Pool  *x509.CertPool // holding the CA

	mu sync.Mutex
	// +checklocks:mu
	requests []Request
}

// Request is what the upstream was sent.
type Request struct {
	Host, Path, RawQuery string
	Header               http.Header
	Body                 string
}

// String is "host path authorization body", for logs.
func (r Request) String() string {
	return fmt.Sprintf("%s %s %s %q", r.Host, r.Path, r.Header.Get("Authorization"), r.Body)
}

var seq atomic.Int64

// Start creates the namespace and the servers; both go when t ends. It
// needs root and iproute2 (the netns test tier).
func Start(t testing.TB) *Upstream {
	t.Helper()
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierNetns, "ip", "iproute2")
	ns := fmt.Sprintf("space-up-%d-%d", os.Getpid(), seq.Add(1))
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("setup: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	exec.Command("ip", "netns", "del", ns).Run()
	run("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run("-n", ns, "link", "set", "lo", "up")
	run("-n", ns, "addr", "add", Addr.String()+"/32", "dev", "lo")
	run("-n", ns, "addr", "add", Addr6.String()+"/128", "dev", "lo", "nodad")

	ca, caKey := newCA(t)
	u := &Upstream{Netns: "/run/netns/" + ns, Pool: x509.NewCertPool(),
		CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})}
	u.Pool.AddCert(ca)
	cert := leaf(t, ca, caKey, Names...)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.requests = append(u.requests, Request{Host: r.Host, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: string(body)})
		u.mu.Unlock()
		switch r.URL.Path {
		case "/echo":
			b, _ := json.Marshal(Echo{Host: r.Host, Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
				Proto: r.Proto, Header: r.Header, Body: string(body)})
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Echo-Authorization", r.Header.Get("Authorization"))
			if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				w.Header().Set("Content-Encoding", "gzip")
				zw := gzip.NewWriter(w)
				zw.Write(b)
				zw.Close()
				return
			}
			w.Write(b)
		case "/brotli":
			w.Header().Set("Content-Encoding", "br")
			w.Write([]byte(r.Header.Get("Authorization")))
		case "/ws":
			hdr, _ := json.Marshal(r.Header)
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			ctx := r.Context()
			for {
				typ, msg, err := c.Read(ctx)
				if err != nil {
					return
				}
				if err := c.Write(ctx, typ, append(append(msg, ' '), hdr...)); err != nil {
					return
				}
			}
		case "/big":
			w.Write(make([]byte, BigBody))
		case "/redirect":
			http.Redirect(w, r, "https://other.test/landed", http.StatusFound)
		default:
			fmt.Fprintf(w, "hello %s", r.Host)
		}
	})
	var banner net.Listener
	if err := netns.Do(u.Netns, func() (err error) {
		banner, err = net.Listen("tcp", net.JoinHostPort(Addr.String(), strconv.Itoa(BannerPort)))
		return err
	}); err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	t.Cleanup(func() { banner.Close() })
	go serveBanner(banner)
	for _, addr := range []string{
		net.JoinHostPort(Addr.String(), "443"), net.JoinHostPort(Addr.String(), "80"),
		net.JoinHostPort(Addr6.String(), "443"), net.JoinHostPort(Addr6.String(), "80"),
	} {
		var l net.Listener
		if err := netns.Do(u.Netns, func() (err error) {
			l, err = net.Listen("tcp", addr)
			return err
		}); err != nil {
			t.Fatalf("setup: listen: %v", err)
		}
		if strings.HasSuffix(addr, ":443") {
			l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}})
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	return u
}

// ServeAt serves h over HTTP on addr:port in the upstream's namespace,
// adding addr to its loopback, until t ends.
func (u *Upstream) ServeAt(t testing.TB, addr netip.Addr, port uint16, h http.Handler) {
	t.Helper()
	if out, err := exec.Command("ip", "-n", filepath.Base(u.Netns), "addr", "add", netip.PrefixFrom(addr, addr.BitLen()).String(), "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("setup: add %s: %v: %s", addr, err, out)
	}
	var l net.Listener
	if err := netns.Do(u.Netns, func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
		return err
	}); err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// serveBanner greets each connection with Banner, then echoes it.
func serveBanner(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.WriteString(c, Banner)
			io.Copy(c, c)
		}()
	}
}

// Requests returns what the upstream was sent so far, oldest first.
func (u *Upstream) Requests() []Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Request(nil), u.requests...)
}

// Dial opens a connection from inside the upstream's namespace: a
// gateway's way out in the tests.
func (u *Upstream) Dial(ctx context.Context, network, addr string) (c net.Conn, err error) {
	err = netns.Do(u.Netns, func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func newCA(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "space egress test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

func leaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, names ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
