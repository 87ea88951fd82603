package egress

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Secret is a credential the gateway adds to requests for the hosts it is
// bound to; the guest only ever sees its placeholder.
type Secret struct {
	Name string
	// Placeholder is what the guest holds instead of the value (in an
	// environment variable or a file); the gateway replaces it.
	Placeholder string
	// Value is the real credential. It never reaches the guest.
	Value []byte
	// Hosts are the exact names whose requests may carry it.
	Hosts []string
	// Header, if set, is a header the gateway sets on every request to
	// the hosts: Format with "{}" replaced by the value ("" = the value).
	Header string
	Format string
}

// bodyTypes are the content types whose bodies the placeholder is
// replaced in (besides headers and the query string).
var bodyTypes = map[string]bool{
	"application/json": true, "application/x-www-form-urlencoded": true, "text/plain": true,
}

// maxInjectBody bounds a request body the gateway rewrites.
const maxInjectBody = 16 << 20

// CA is a sandbox's certificate authority: the guest trusts it, and the
// gateway signs with it the certificates of the hosts whose TLS it
// terminates to add secrets. The key never leaves the host.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer

	mu sync.Mutex
	// +checklocks:mu
	leaves map[string]*tls.Certificate
}

// NewCA makes a CA for one sandbox, valid for validity.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name, Organization: []string{"SPACE sandbox egress"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// leaf returns a certificate for host signed by the CA.
func (ca *CA) leaf(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	c, ok := ca.leaves[host]
	ca.mu.Unlock()
	if ok && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: ca.Cert.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	c = &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}
	ca.mu.Lock()
	if ca.leaves == nil {
		ca.leaves = map[string]*tls.Certificate{}
	}
	ca.leaves[host] = c
	ca.mu.Unlock()
	return c, nil
}

// secretsFor returns the secrets bound to host.
func (p Policy) secretsFor(host string) []Secret {
	var out []Secret
	for _, s := range p.Secrets {
		for _, h := range s.Hosts {
			if h == host {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// injectRequest puts the secrets into req.
func injectRequest(req *http.Request, secrets []Secret) error {
	for _, s := range secrets {
		val := string(s.Value)
		for k, vs := range req.Header {
			for i, v := range vs {
				req.Header[k][i] = strings.ReplaceAll(v, s.Placeholder, val)
			}
		}
		if s.Header != "" {
			f := s.Format
			if f == "" {
				f = "{}"
			}
			req.Header.Set(s.Header, strings.ReplaceAll(f, "{}", val))
		}
		req.URL.RawQuery = strings.ReplaceAll(req.URL.RawQuery, s.Placeholder, url.QueryEscape(val))
	}
	mt, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if req.Body == nil || req.Body == http.NoBody || !bodyTypes[mt] {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, maxInjectBody+1))
	req.Body.Close()
	if err != nil {
		return err
	}
	if len(b) > maxInjectBody {
		return errors.New("a request body to rewrite is larger than 16 MiB")
	}
	for _, s := range secrets {
		v := s.Value
		if mt == "application/x-www-form-urlencoded" {
			v = []byte(url.QueryEscape(string(v)))
		}
		b = bytes.ReplaceAll(b, []byte(s.Placeholder), v)
	}
	req.Body = io.NopCloser(bytes.NewReader(b))
	req.ContentLength = int64(len(b))
	req.Header.Set("Content-Length", strconv.Itoa(len(b)))
	req.TransferEncoding = nil
	return nil
}
