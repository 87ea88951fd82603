package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// A scrubber replaces, in what a secret's host sends back, every form of
// the secret's value the gateway may have put into a request (raw, query-
// or path-escaped) and the forms an echo commonly gives it back in (JSON
// string escaping, HTML escaping, base64), by the secret's placeholder:
// an endpoint that echoes its request must not hand the value to the
// guest. What it cannot catch (a value the upstream transforms otherwise,
// split, re-cased or compressed in a way the gateway cannot undo) is a
// residual risk the docs name.
type scrubber struct {
	pairs  []scrubPair // longest match first
	maxLen int         // the longest match
	m      *Metrics    // counts what is replaced; or nil
}

type scrubPair struct{ from, to []byte }

// minScrubbed is the shortest value scrubbed: a shorter one would match
// by chance all over a response, and is no credential.
const minScrubbed = 4

// newScrubber scrubs the values of secrets; nil when there is nothing
// to scrub.
func newScrubber(secrets []Secret) *scrubber {
	seen := map[string]bool{}
	s := &scrubber{}
	for _, sec := range secrets {
		v := string(sec.Value)
		if len(v) < minScrubbed {
			continue
		}
		for _, f := range valueForms(v) {
			if seen[f] {
				continue
			}
			seen[f] = true
			s.pairs = append(s.pairs, scrubPair{from: []byte(f), to: []byte(sec.Placeholder)})
			s.maxLen = max(s.maxLen, len(f))
		}
	}
	if len(s.pairs) == 0 {
		return nil
	}
	slices.SortFunc(s.pairs, func(a, b scrubPair) int { return len(b.from) - len(a.from) })
	return s
}

// valueForms are the forms of v a response may carry it in.
func valueForms(v string) []string {
	js, _ := json.Marshal(v)
	var noHTML bytes.Buffer
	enc := json.NewEncoder(&noHTML)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return []string{
		v, url.QueryEscape(v), url.PathEscape(v), strings.ReplaceAll(url.QueryEscape(v), "+", "%20"),
		string(js[1 : len(js)-1]), strings.TrimSuffix(strings.TrimSpace(noHTML.String()), `"`)[1:],
		html.EscapeString(v),
		base64.StdEncoding.EncodeToString([]byte(v)), base64.RawStdEncoding.EncodeToString([]byte(v)),
		base64.URLEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v)),
	}
}

// string scrubs s.
func (s *scrubber) string(v string) string {
	for _, p := range s.pairs {
		if n := strings.Count(v, string(p.from)); n > 0 {
			s.m.scrub(n)
			v = strings.ReplaceAll(v, string(p.from), string(p.to))
		}
	}
	return v
}

// header scrubs h's values in place.
func (s *scrubber) header(h http.Header) {
	for k, vs := range h {
		for i, v := range vs {
			h[k][i] = s.string(v)
		}
	}
}

// replace scrubs buf and returns how much of the result may be sent:
// out holds the scrubbed bytes before keep, and keep the bytes that
// must wait for more (a match may still start in them), unless final.
func (s *scrubber) replace(buf []byte, final bool) (out, keep []byte) {
	safe := len(buf)
	if !final {
		safe = max(0, len(buf)-(s.maxLen-1))
	}
	var o []byte
	pos := 0
	for pos < safe {
		at, p := -1, scrubPair{}
		for _, c := range s.pairs { // the earliest match; at one place the longest
			if i := bytes.Index(buf[pos:], c.from); i >= 0 && (at < 0 || pos+i < at) {
				at, p = pos+i, c
			}
		}
		if at < 0 || at >= safe {
			break
		}
		o = append(o, buf[pos:at]...)
		o = append(o, p.to...)
		s.m.scrub(1)
		pos = at + len(p.from)
	}
	if pos < safe {
		o = append(o, buf[pos:safe]...)
		pos = safe
	}
	return o, buf[pos:]
}

// reader scrubs what r reads and then, once r is done, trailer (nil for
// none): a response's trailers are known only after its body.
func (s *scrubber) reader(r io.ReadCloser, trailer http.Header) io.ReadCloser {
	return &scrubReader{s: s, r: r, trailer: trailer}
}

type scrubReader struct {
	s       *scrubber
	r       io.ReadCloser
	trailer http.Header
	pending []byte // read, not yet scrubbed
	out     []byte // scrubbed, not yet returned
	err     error  // from r, once pending is drained
}

func (sr *scrubReader) Read(p []byte) (int, error) {
	for len(sr.out) == 0 {
		if sr.err != nil {
			return 0, sr.err
		}
		buf := make([]byte, 32<<10)
		n, err := sr.r.Read(buf)
		sr.pending = append(sr.pending, buf[:n]...)
		if err != nil {
			sr.err = err
			sr.s.header(sr.trailer)
		}
		var out []byte
		out, sr.pending = sr.s.replace(sr.pending, err != nil)
		sr.pending = append([]byte(nil), sr.pending...)
		sr.out = out
	}
	n := copy(p, sr.out)
	sr.out = sr.out[n:]
	return n, nil
}

func (sr *scrubReader) Close() error { return sr.r.Close() }

// maskRWC is the upstream's side of an upgraded connection (a
// WebSocket) to a secret's host: what it reads is scrubbed with masks
// of the same length, so that framing stays intact.
type maskRWC struct {
	io.ReadWriteCloser
	r io.Reader
}

func (s *scrubber) maskRWC(rwc io.ReadWriteCloser) io.ReadWriteCloser {
	masked := &scrubber{maxLen: s.maxLen}
	for _, p := range s.pairs {
		masked.pairs = append(masked.pairs, scrubPair{from: p.from, to: bytes.Repeat([]byte{'*'}, len(p.from))})
	}
	return &maskRWC{ReadWriteCloser: rwc, r: masked.reader(io.NopCloser(rwc), nil)}
}

func (m *maskRWC) Read(p []byte) (int, error) { return m.r.Read(p) }
