package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a delivery.
const (
	// HeaderID is the delivery's idempotency key: "evt_<seq>" for an
	// event, the same on every attempt to deliver that event to that
	// webhook, so a receiver that got it twice can tell.
	HeaderID = "Space-Webhook-Id"
	// HeaderTimestamp is when the attempt was signed, in Unix seconds.
	HeaderTimestamp = "Space-Webhook-Timestamp"
	// HeaderSignature holds one or more space-separated "v1=<hex>"
	// signatures (several while a secret is being rotated): each the
	// HMAC-SHA256, keyed by a secret, of timestamp + "." + body.
	HeaderSignature = "Space-Webhook-Signature"
)

// SecretPrefix begins every secret NewSecret makes.
const SecretPrefix = "whsec_"

// DefaultTolerance is how far a delivery's timestamp may be from a
// receiver's clock when Verify is given no tolerance.
const DefaultTolerance = 5 * time.Minute

// NewSecret returns a fresh signing secret: SecretPrefix and 32 random
// bytes in unpadded base64url. The whole string, prefix included, is the
// HMAC key.
func NewSecret() string {
	var b [32]byte
	rand.Read(b[:])
	return SecretPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// Signature returns the "v1=<hex>" signature of body sent at timestamp ts
// (Unix seconds) under secret.
func Signature(secret string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// Sign sets the delivery headers of body on h: id, the timestamp now and
// one signature per secret.
func Sign(h http.Header, id string, secrets []string, now time.Time, body []byte) {
	ts := now.Unix()
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		sigs[i] = Signature(s, ts, body)
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderSignature, strings.Join(sigs, " "))
}

// Errors of Verify.
var (
	ErrNoSignature = errors.New("webhook: missing signature headers")
	ErrSignature   = errors.New("webhook: no signature matches")
	ErrTimestamp   = errors.New("webhook: timestamp outside the tolerance")
)

// Verify checks that body, received with header at now, was signed with
// secret less than tolerance (0 = DefaultTolerance) before or after now.
// It returns nil, or an error wrapping ErrNoSignature, ErrTimestamp or
// ErrSignature. A receiver verifies the raw body, before parsing it, and
// uses the Space-Webhook-Id header to drop a delivery it already took.
func Verify(secret string, header http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	tsText, sigs := header.Get(HeaderTimestamp), header.Get(HeaderSignature)
	if tsText == "" || sigs == "" {
		return ErrNoSignature
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q is not Unix seconds", ErrTimestamp, tsText)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed %v from now (tolerance %v)", ErrTimestamp, -d.Truncate(time.Second), tolerance)
	}
	want := []byte(Signature(secret, ts, body))
	for _, s := range strings.Fields(sigs) {
		if hmac.Equal([]byte(s), want) {
			return nil
		}
	}
	return ErrSignature
}
