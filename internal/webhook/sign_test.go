package webhook

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestVerify(t *testing.T) {
	secret, other := NewSecret(), NewSecret()
	if !strings.HasPrefix(secret, SecretPrefix) || len(secret) != len(SecretPrefix)+43 || secret == other {
		t.Fatalf("NewSecret() = %q, %q: want distinct whsec_ + 43 base64url characters", secret, other)
	}
	body := []byte(`{"id":"evt_7","type":"sandbox.created"}`)
	signed := time.Unix(1_700_000_000, 0)
	header := func(secrets ...string) http.Header {
		h := http.Header{}
		Sign(h, "evt_7", secrets, signed, body)
		return h
	}
	tests := []struct {
		name   string
		secret string
		header http.Header
		body   []byte
		now    time.Time
		want   error
	}{
		{"good", secret, header(secret), body, signed.Add(time.Minute), nil},
		{"good while rotating", secret, header(other, secret), body, signed, nil},
		{"wrong secret", other, header(secret), body, signed, ErrSignature},
		{"body changed", secret, header(secret), []byte(`{"id":"evt_8"}`), signed, ErrSignature},
		{"stale", secret, header(secret), body, signed.Add(DefaultTolerance + time.Second), ErrTimestamp},
		{"from the future", secret, header(secret), body, signed.Add(-DefaultTolerance - time.Second), ErrTimestamp},
		{"unsigned", secret, http.Header{}, body, signed, ErrNoSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Verify(tt.secret, tt.header, tt.body, tt.now, 0); !errors.Is(got, tt.want) {
				t.Errorf("Verify() = %v, want %v", got, tt.want)
			}
		})
	}

	h := header(secret)
	if got := h.Get(HeaderID); got != "evt_7" {
		t.Errorf("%s = %q, want evt_7", HeaderID, got)
	}
	h.Set(HeaderTimestamp, "1700000001") // a timestamp not the one signed
	if err := Verify(secret, h, body, signed, 0); !errors.Is(err, ErrSignature) {
		t.Errorf("Verify(timestamp changed) = %v, want %v", err, ErrSignature)
	}
}
