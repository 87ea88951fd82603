// Package workertls secures the worker protocol: the control plane and
// its standalone workers share the worker token, and from it both derive
// the same certificate authority. A worker serves TLS with a certificate
// that CA signs for it; the control plane trusts that CA alone, so it
// talks only to a worker that knows the token, and what it sends (exec
// streams, secret values) is encrypted on the way.
//
// The CA's key is an Ed25519 key whose seed comes from the token through
// HKDF, and its certificate is built from fixed fields and signed
// deterministically, so each side makes the identical certificate without
// exchanging anything. Changing the token changes the CA.
package workertls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// ServerName is the name every worker certificate carries and the
// control plane checks: workers are told apart by their registration, not
// by the name in the certificate (their addresses may be anything).
const ServerName = "space-worker"

// leafLifetime is how long a worker certificate is valid; a worker makes
// a new one when less than leafRenew of it is left.
const (
	leafLifetime = 90 * 24 * time.Hour
	leafRenew    = 30 * 24 * time.Hour
)

// authority is the CA derived from a token.
type authority struct {
	cert *x509.Certificate
	key  ed25519.PrivateKey
}

func deriveCA(token string) (*authority, error) {
	if len(token) < 16 {
		return nil, errors.New("worker token shorter than 16 bytes")
	}
	seed, err := hkdf.Key(sha256.New, []byte(token), []byte("space worker protocol"), "space worker CA v1", ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	skid := sha256.Sum256(pub)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "space worker CA"},
		NotBefore:             time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2124, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
		SubjectKeyId:          skid[:20],
	}
	// Ed25519 signatures are deterministic: every side gets these bytes.
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key}, nil
}

// Client returns the TLS configuration the control plane reaches workers
// with: it trusts only certificates the token's CA signed for ServerName.
func Client(token string) (*tls.Config, error) {
	ca, err := deriveCA(token)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &tls.Config{RootCAs: pool, ServerName: ServerName, MinVersion: tls.VersionTLS13}, nil
}

// Server returns the TLS configuration a worker serves its API with: a
// certificate of its own (a fresh key each process), signed by the
// token's CA and renewed before it expires.
func Server(token string) (*tls.Config, error) {
	ca, err := deriveCA(token)
	if err != nil {
		return nil, err
	}
	l := &leaves{ca: ca}
	if _, err := l.get(time.Now()); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return l.get(time.Now())
		},
	}, nil
}

// leaves holds a worker's current certificate.
type leaves struct {
	ca *authority // +checklocksignore: immutable
	mu sync.Mutex
	// +checklocks:mu
	cur *tls.Certificate
}

func (l *leaves) get(now time.Time) (*tls.Certificate, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil && l.cur.Leaf.NotAfter.Sub(now) > leafRenew {
		return l.cur, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: ServerName},
		DNSNames:     []string{ServerName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, l.ca.cert, key.Public(), crypto.Signer(l.ca.key))
	if err != nil {
		return nil, fmt.Errorf("worker certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	l.cur = &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	return l.cur, nil
}
