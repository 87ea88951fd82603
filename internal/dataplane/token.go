// Package dataplane carries a sandbox's data-plane requests (exec,
// processes, files, ports) from a client straight to the worker that holds
// the sandbox, without the control plane or its database in the path.
//
// The control plane hands a client a token for one sandbox (see [Sealer]):
// an AES-256-GCM sealed, short-lived grant naming the sandbox, its team,
// its worker and that worker's address. Whoever serves the data plane
// ([Handler]: `space server` itself, or any number of stateless `space
// proxy` processes in front of the workers) opens the token, checks it
// names the sandbox of the path and has not expired, and forwards the
// request to the worker the token names. A request thus touches no
// database, and a control-plane replica that restarts or goes away cuts
// no stream: a stream runs between the client, the proxy and the worker.
//
// The sealing key is derived from the cluster's worker token, which the
// control plane replicas, the workers and the proxies already share (it
// authenticates the control plane's calls to workers, so a holder of it
// can reach every worker anyway). Clients never see what a token holds:
// worker ids and addresses stay inside the cluster.
package dataplane

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"space/internal/errkind"
	"space/internal/httpapi"
)

// TokenPrefix starts every data-plane token, so a client or a log reader
// can tell one from an API key ("sk_").
const TokenPrefix = "sdp1_"

// maxToken bounds a token a request may present.
const maxToken = 2048

// Grant is what a token allows: data-plane requests to one sandbox, on
// the worker that holds it, until Expires.
type Grant struct {
	Sandbox string    `json:"s"`
	Team    string    `json:"t"`
	Worker  string    `json:"w"`
	Address string    `json:"a,omitempty"` // the worker's API (https://...); "" for a worker inside the serving process
	Expires time.Time `json:"e"`
}

// Sealer makes and opens tokens. It is safe for concurrent use.
type Sealer struct {
	aead cipher.AEAD // set by NewSealer, never changed
}

// NewSealer returns the sealer of the cluster whose worker token is
// secret. Every process given the same secret makes and opens the same
// tokens.
func NewSealer(secret string) (*Sealer, error) {
	if secret == "" {
		return nil, fmt.Errorf("data-plane tokens need the cluster's worker token: %w", errkind.InvalidArgument)
	}
	key, err := hkdf.Key(sha256.New, []byte(secret), []byte("space data plane"), "space data-plane token v1", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// Seal returns a token for g.
func (s *Sealer) Seal(g Grant) (string, error) {
	if g.Sandbox == "" || g.Worker == "" || g.Expires.IsZero() {
		return "", fmt.Errorf("data-plane grant needs a sandbox, a worker and an expiry: %w", errkind.InvalidArgument)
	}
	g.Expires = g.Expires.UTC().Truncate(time.Second)
	plain, err := json.Marshal(g)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	rand.Read(nonce)
	sealed := s.aead.Seal(nonce, nonce, plain, []byte(TokenPrefix))
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(sealed), nil
}

// ErrBadToken is returned by Open for a token this cluster did not make
// (or that was altered), and ErrExpired for one past its expiry.
var (
	ErrBadToken = fmt.Errorf("not a data-plane token of this cluster: %w", httpapi.ErrUnauthenticated)
	ErrExpired  = fmt.Errorf("data-plane token expired; get the sandbox again for a new one: %w", httpapi.ErrUnauthenticated)
)

// Open returns the grant token carries if it is one of this cluster's
// and is valid at now.
func (s *Sealer) Open(token string, now time.Time) (Grant, error) {
	body, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok || len(token) > maxToken {
		return Grant{}, ErrBadToken
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(body) // one encoding per token: no spare bits
	if err != nil || len(raw) < s.aead.NonceSize()+s.aead.Overhead() {
		return Grant{}, ErrBadToken
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], []byte(TokenPrefix))
	if err != nil {
		return Grant{}, ErrBadToken
	}
	var g Grant
	if err := json.Unmarshal(plain, &g); err != nil || g.Sandbox == "" || g.Worker == "" {
		return Grant{}, ErrBadToken
	}
	if !now.Before(g.Expires) {
		return Grant{}, ErrExpired
	}
	return g, nil
}
