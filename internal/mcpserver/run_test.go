package mcpserver

import (
	"bytes"
	"strings"
	"testing"
)

// TestCaptureKeepsHeadAndTail writes the same bytes in pieces of several
// sizes and checks that what is kept is the first and last half of
// maxOutput, in order, with the count of all bytes.
func TestCaptureKeepsHeadAndTail(t *testing.T) {
	const half = maxOutput / 2
	for _, total := range []int{0, 10, half, maxOutput, maxOutput + 1, 3*maxOutput + 17} {
		src := make([]byte, total)
		for i := range src {
			src[i] = 'a' + byte(i%26)
		}
		for _, piece := range []int{1, 7, 4096, half + 3, maxOutput * 4} {
			var c capture
			for rest := src; len(rest) > 0; {
				k := min(piece, len(rest))
				if n, err := c.Write(rest[:k]); n != k || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				rest = rest[k:]
			}
			got := c.String()
			if c.n != int64(total) {
				t.Errorf("total %d piece %d: counted %d", total, piece, c.n)
			}
			if total <= maxOutput {
				if got != string(src) {
					t.Errorf("total %d piece %d: kept %d bytes, want all of them", total, piece, len(got))
				}
				continue
			}
			head, tail, ok := strings.Cut(got, "\n[... ")
			_, tail, _ = strings.Cut(tail, " ...]\n")
			if !ok || !bytes.Equal([]byte(head), src[:half]) || !bytes.Equal([]byte(tail), src[total-half:]) {
				t.Errorf("total %d piece %d: kept %d head and %d tail bytes, want the first and last %d", total, piece, len(head), len(tail), half)
			}
			if !strings.Contains(got, "bytes left out") {
				t.Errorf("total %d piece %d: no marker", total, piece)
			}
		}
	}
}
