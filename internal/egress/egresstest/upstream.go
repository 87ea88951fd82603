// Package egresstest runs the upstream that egress tests reach: HTTPS and
// HTTP servers with a CA of their own, on a documentation address in a
// network namespace the test creates, so that no traffic leaves the host.
package egresstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// Upstream is the running servers: 443 (TLS) and 80 at Addr. They answer
// "hello HOST", GET /big with BigBody zero bytes, and /redirect with a
// 302 to https://other.test/landed.
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
		case "/big":
			w.Write(make([]byte, BigBody))
		case "/redirect":
			http.Redirect(w, r, "https://other.test/landed", http.StatusFound)
		default:
			fmt.Fprintf(w, "hello %s", r.Host)
		}
	})
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
			l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	return u
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
