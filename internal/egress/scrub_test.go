package egress

import (
	"encoding/base64"
	"io"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
)

// TestScrubber checks that every form of a secret's value is replaced by
// its placeholder in a stream read a byte at a time (a match split
// across reads) and in one read, and that other bytes pass unchanged.
func TestScrubber(t *testing.T) {
	const value = `v@lue/with "odd" <chars>&more`
	s := newScrubber([]Secret{{Placeholder: "PH", Value: []byte(value)}})
	forms := []string{value, url.QueryEscape(value), url.PathEscape(value), `v@lue/with \"odd\" \u003cchars\u003e\u0026more`,
		`v@lue/with \"odd\" <chars>&more`, "v@lue/with &#34;odd&#34; &lt;chars&gt;&amp;more", base64.StdEncoding.EncodeToString([]byte(value))}
	in := "start " + strings.Join(forms, " | ") + " end" + value
	want := "start " + strings.TrimSuffix(strings.Repeat("PH | ", len(forms)), " | ") + " endPH"
	for name, r := range map[string]io.Reader{"byte by byte": iotest.OneByteReader(strings.NewReader(in)), "whole": strings.NewReader(in)} {
		b, err := io.ReadAll(s.reader(io.NopCloser(r), nil))
		if err != nil || string(b) != want {
			t.Errorf("%s: scrubbed %q = %q, %v; want %q", name, in, b, err, want)
		}
	}
	if got := s.string("no secret here"); got != "no secret here" {
		t.Errorf("string(no secret) = %q", got)
	}
	if newScrubber([]Secret{{Placeholder: "PH", Value: []byte("abc")}}) != nil {
		t.Errorf("a 3-byte value is scrubbed (it would match by chance)")
	}
}
