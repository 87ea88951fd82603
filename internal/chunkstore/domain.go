package chunkstore

import (
	"fmt"

	"github.com/zeebo/blake3"

	"space/internal/errkind"
)

// digestKeyContext is the BLAKE3 key-derivation context of chunk digests:
// a domain's key is DeriveKey(digestKeyContext, domain). Changing it
// renames every chunk, so it never changes.
const digestKeyContext = "space chunkstore 2026-12-07 chunk digest key v1"

// maxDomainLen bounds a dedup domain's length.
const maxDomainLen = 256

// CheckDomain reports whether domain may be a PutOptions.Domain: 1 to 256
// printable ASCII characters (no spaces). The legacy domain "" is
// readable, never writable. The error wraps errkind.InvalidArgument.
func CheckDomain(domain string) error {
	ok := domain != "" && len(domain) <= maxDomainLen
	for i := 0; ok && i < len(domain); i++ {
		ok = '!' <= domain[i] && domain[i] <= '~'
	}
	if !ok {
		return fmt.Errorf("dedup domain %.64q: want 1-%d printable ASCII characters: %w", domain, maxDomainLen, errkind.InvalidArgument)
	}
	return nil
}

// TeamDomain returns the dedup domain of team's snapshots (and of
// whatever else is the team's own, such as a base image made from its
// build context).
func TeamDomain(team string) string { return "team/" + team }

// SumIn returns the digest of b in dedup domain domain: the BLAKE3-256
// of b keyed with the domain's key, or, for the legacy domain "", Sum(b).
// Chunks of one domain are named by SumIn of that domain (see the package
// doc).
func SumIn(domain string, b []byte) Digest {
	var h digester
	h.init(domain)
	return h.sum(b)
}

// digester computes the digests of one domain. The zero value, and one
// initialized with the legacy domain "", computes Sum. It is not safe for
// concurrent use: each goroutine has its own.
type digester struct {
	keyed *blake3.Hasher // or nil: unkeyed (the legacy domain)
}

// init makes h compute digests in domain.
func (h *digester) init(domain string) {
	if domain == "" {
		h.keyed = nil
		return
	}
	var key [32]byte
	blake3.DeriveKey(digestKeyContext, []byte(domain), key[:])
	h.keyed, _ = blake3.NewKeyed(key[:]) // never fails: the key is 32 bytes
}

// sum returns the digest of b.
func (h *digester) sum(b []byte) Digest {
	if h.keyed == nil {
		return Sum(b)
	}
	h.keyed.Reset()
	h.keyed.Write(b)
	var d Digest
	h.keyed.Sum(d[:0])
	return d
}
