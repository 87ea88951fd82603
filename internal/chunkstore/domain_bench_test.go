package chunkstore

import "testing"

// BenchmarkDigest compares naming a 64 KiB chunk in a domain (keyed) with
// the legacy unkeyed digest.
func BenchmarkDigest(b *testing.B) {
	data := make([]byte, DefaultChunkSize)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, domain := range []string{"", "team/bench"} {
		name := "keyed"
		if domain == "" {
			name = "legacy"
		}
		b.Run(name, func(b *testing.B) {
			var h digester
			h.init(domain)
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				h.sum(data)
			}
		})
	}
}
