package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"space/internal/errkind"
	"space/internal/store"
)

// fakeResolver answers from a map.
type fakeResolver map[string][]string

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	as, ok := r[host]
	if !ok {
		return nil, fmt.Errorf("lookup %s: no such host", host)
	}
	var out []netip.Addr
	for _, a := range as {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

func TestCheckURL(t *testing.T) {
	own := netip.MustParseAddr("203.0.113.7") // documentation range: stands for a public address of this host
	g := &Guard{
		Resolver: fakeResolver{
			"hooks.example":    {"93.184.216.34"},
			"metadata.example": {"169.254.169.254"},
			"rebind.example":   {"93.184.216.34", "10.1.2.3"},
			"self.example":     {"203.0.113.7"},
			"v6.example":       {"2606:4700::1111"},
		},
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1"), own}, nil },
	}
	tests := []struct {
		url     string
		refused string // a part of the error; "" = allowed
	}{
		{"https://hooks.example/in", ""},
		{"https://93.184.216.34:8443/in", ""},
		{"https://[2606:4700::1111]/", ""},
		{"https://v6.example/", ""},
		{"http://hooks.example/in", "must be https"},
		{"ftp://hooks.example/", "scheme"},
		{"https://user:pw@hooks.example/", "user or password"},
		{"https:///nohost", "no host"},
		{"https://127.0.0.1/", "127.0.0.1 is a loopback address"},
		{"https://[::1]/", "loopback"},
		{"https://10.0.0.5/", "10.0.0.5 is a private address"},
		{"https://172.16.3.4/", "private"},
		{"https://192.168.1.1/", "private"},
		{"https://[fd00::1]/", "private"},
		{"https://169.254.169.254/latest/meta-data/", "cloud metadata"},
		{"https://169.254.1.1/", "link-local"},
		{"https://[fe80::1]/", "link-local"},
		{"https://0.0.0.0/", "unspecified"},
		{"https://0.1.2.3/", "reserved"},
		{"https://[::]/", "unspecified"},
		{"https://239.1.2.3/", "multicast"},
		{"https://[ff02::1]/", "link-local"},
		{"https://255.255.255.255/", "reserved"},
		{"https://100.64.0.1/", "reserved address (100.64.0.0/10)"},
		{"https://[::ffff:127.0.0.1]/", "loopback"},
		{"https://[::ffff:10.0.0.1]/", "private"},
		{"https://[::ffff:169.254.169.254]/", "cloud metadata"},
		{"https://metadata.example/", "metadata.example resolves to 169.254.169.254"},
		{"https://rebind.example/", "10.1.2.3, a private address"},
		{"https://self.example/", "an address of this host"},
		{"https://203.0.113.7/", "an address of this host"},
		{"https://nxdomain.example/", "resolve nxdomain.example"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			err := g.CheckURL(t.Context(), tt.url)
			if tt.refused == "" {
				if err != nil {
					t.Errorf("CheckURL(%s) = %v, want nil", tt.url, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.refused) || !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("CheckURL(%s) = %v, want an invalid-argument error containing %q", tt.url, err, tt.refused)
			}
		})
	}

	// The real resolver: localhost is loopback.
	if err := (&Guard{}).CheckURL(t.Context(), "https://localhost:8443/"); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("CheckURL(https://localhost:8443/) = %v, want loopback refused", err)
	}

	private := &Guard{AllowPrivate: true}
	for _, u := range []string{"http://127.0.0.1:8080/", "https://169.254.169.254/", "http://10.0.0.1/"} {
		if err := private.CheckURL(t.Context(), u); err != nil {
			t.Errorf("CheckURL(%s) with AllowPrivate = %v, want nil", u, err)
		}
	}
	if err := private.CheckURL(t.Context(), "https://u:p@10.0.0.1/"); err == nil {
		t.Errorf("CheckURL(userinfo) with AllowPrivate = nil, want refused")
	}
}

// TestSendRefusesPrivateAtDial: an address that passed registration but
// dials somewhere private (DNS rebinding) is refused when dialed.
func TestSendRefusesPrivateAtDial(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	s, err := NewSender(SenderConfig{Guard: &Guard{}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	// "localhost" stands for a name that now resolves to loopback.
	url := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	res := s.Send(t.Context(), store.Webhook{ID: "whk_x", URL: url, Secret: "whsec_x"}, Ping("team", testNow()))
	if res.Delivered() || res.Err == nil || !strings.Contains(res.Err.Error(), "loopback") || res.StatusCode != 0 {
		t.Errorf("Send(%s) = %+v, want refused as loopback", url, res)
	}
	if hits.Load() != 0 {
		t.Errorf("the loopback receiver got %d requests, want 0", hits.Load())
	}
}

// TestSendDoesNotFollowRedirects: a receiver's redirect is a failed
// attempt, and its target gets nothing.
func TestSendDoesNotFollowRedirects(t *testing.T) {
	var hits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(target.Close)
	redirect := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusTemporaryRedirect))
	t.Cleanup(redirect.Close)
	s, err := NewSender(SenderConfig{Guard: &Guard{AllowPrivate: true}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	res := s.Send(t.Context(), store.Webhook{ID: "whk_x", URL: redirect.URL, Secret: "whsec_x"}, Ping("team", testNow()))
	if res.Delivered() || res.StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("Send(redirect) = %+v, want a failed attempt with status 307", res)
	}
	if hits.Load() != 0 {
		t.Errorf("the redirect's target got %d requests, want 0", hits.Load())
	}
}
