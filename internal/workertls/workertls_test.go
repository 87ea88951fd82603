package workertls

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const token = "0123456789abcdef0123456789abcdef"

// serve starts an HTTPS server with a worker certificate of token t.
func serve(t *testing.T, tok string) string {
	t.Helper()
	cfg, err := Server(tok)
	if err != nil {
		t.Fatalf("Server = %v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "worker")
	}))
	srv.TLS = cfg
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

func get(t *testing.T, cfg *tls.Config, url string) (string, error) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestWorkerTLS: a control plane reaches a worker of its own token (over
// TLS 1.3, whatever the worker's address), and refuses one whose
// certificate another token's CA signed, or a self-signed one.
func TestWorkerTLS(t *testing.T) {
	client, err := Client(token)
	if err != nil {
		t.Fatalf("Client = %v", err)
	}
	if got, err := get(t, client, serve(t, token)); err != nil || got != "worker" {
		t.Errorf("GET a worker of the same token = %q, %v", got, err)
	}
	if _, err := get(t, client, serve(t, token+"x")); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("GET a worker of another token = %v, want a certificate error", err)
	}
	plain := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer plain.Close()
	if _, err := get(t, client, plain.URL); err == nil {
		t.Errorf("GET a server with a certificate of its own = nil error")
	}
	if _, err := Client("short"); err == nil {
		t.Errorf("Client(short token) = nil error")
	}
}

// TestDeriveCA: the CA is the same bytes on both sides, and differs by
// token.
func TestDeriveCA(t *testing.T) {
	a, err := deriveCA(token)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := deriveCA(token)
	c, _ := deriveCA(token + "x")
	if !bytes.Equal(a.cert.Raw, b.cert.Raw) {
		t.Errorf("the same token gave two CAs")
	}
	if bytes.Equal(a.cert.Raw, c.cert.Raw) {
		t.Errorf("two tokens gave one CA")
	}
}

// TestLeafRenewal: a worker certificate is reused until it is near its
// end, then replaced.
func TestLeafRenewal(t *testing.T) {
	ca, _ := deriveCA(token)
	l := &leaves{ca: ca}
	now := time.Now()
	first, err := l.get(now)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := l.get(now.Add(time.Hour)); again != first {
		t.Errorf("certificate replaced after an hour")
	}
	if later, _ := l.get(now.Add(leafLifetime - leafRenew + time.Hour)); later == first {
		t.Errorf("certificate kept when %v of it was left", leafRenew-time.Hour)
	}
}
