package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const (
	placeholder = "SPACE_SECRET_3f9a_PLACEHOLDER"
	secretValue = "s3cr3t-value-that-stays-outside"
)

// request sends one HTTPS request from the guest through addr with SNI
// sni and the given Host, trusting roots; it returns the status line and
// body.
func request(g *guest, addr netip.Addr, roots *x509.CertPool, sni, host, target, headers, body string) (string, error) {
	c, err := g.dial(addr, 443)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots})
	fmt.Fprintf(tc, "POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		target, host, headers, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + string(b), nil
}

// TestSecretInjection checks that a secret bound to api.test reaches the
// upstream (header, query, JSON body, and a header of its own) only on
// requests to api.test, whose TLS the gateway terminates with the
// sandbox's CA and re-establishes with the upstream verified for real;
// other hosts see the placeholder; a Host that disagrees with the SNI and
// a redirect to another host get nothing.
func TestSecretInjection(t *testing.T) {
	ca, err := NewCA("sandbox test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, g, u, log := setupWith(t, func(c *Config) {
		c.CA = ca
		c.Policy.Secrets = []Secret{{Name: "api-key", Placeholder: placeholder, Value: []byte(secretValue),
			Hosts: []string{"api.test"}, Header: "X-Api-Key", Format: "Key {}"}}
	}, "api.test", "other.test")
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AddCert(ca.Cert)
	api, _, _ := g.resolve(t, gatewayIP, "api.test")
	other, _, _ := g.resolve(t, gatewayIP, "other.test")

	got, err := request(g, api[0], sandboxRoots, "api.test", "api.test", "/v1?key="+placeholder,
		"Authorization: Bearer "+placeholder+"\r\n", `{"token":"`+placeholder+`"}`)
	if err != nil || got != "200 OK hello api.test" {
		t.Fatalf("request to api.test = %q, %v", got, err)
	}
	reqs := u.Requests()
	r := reqs[len(reqs)-1]
	body := r.Body
	if r.Header.Get("Authorization") != "Bearer "+secretValue || r.RawQuery != "key="+secretValue ||
		body != `{"token":"`+secretValue+`"}` || r.Header.Get("X-Api-Key") != "Key "+secretValue {
		t.Errorf("upstream got Authorization %q, key %q, body %q, X-Api-Key %q; want the secret in each",
			r.Header.Get("Authorization"), r.RawQuery, body, r.Header.Get("X-Api-Key"))
	}
	ev := log.find(t, func(e Event) bool { return e.Name == "api.test" && e.Injected })
	if !ev.Allowed || strings.Contains(fmt.Sprint(ev), secretValue) {
		t.Errorf("audit: %+v", ev)
	}

	// Another host: its requests go on untouched, the placeholder with them.
	if got, err := request(g, other[0], sandboxRoots, "other.test", "other.test", "/x?key="+placeholder,
		"Authorization: Bearer "+placeholder+"\r\n", placeholder); err != nil || got != "200 OK hello other.test" {
		t.Fatalf("request to other.test = %q, %v", got, err)
	}
	reqs = u.Requests()
	r = reqs[len(reqs)-1]
	body = r.Body
	if r.Header.Get("Authorization") != "Bearer "+placeholder || body != placeholder || r.Header.Get("X-Api-Key") != "" {
		t.Errorf("other.test got Authorization %q, body %q, X-Api-Key %q; want the placeholder only",
			r.Header.Get("Authorization"), body, r.Header.Get("X-Api-Key"))
	}

	// Host other.test inside TLS to api.test: refused before anything is sent.
	n := len(u.Requests())
	if got, err := request(g, api[0], sandboxRoots, "api.test", "other.test", "/", "", placeholder); err == nil && !strings.HasPrefix(got, "421") {
		t.Errorf("a request for other.test inside api.test's TLS = %q", got)
	}
	if len(u.Requests()) != n {
		t.Errorf("the upstream saw a request whose Host disagreed with its SNI")
	}

	// A redirect comes back as it is: the gateway follows nothing.
	if got, err := request(g, api[0], sandboxRoots, "api.test", "api.test", "/redirect", "", "{}"); err != nil || !strings.HasPrefix(got, "302") {
		t.Errorf("redirect = %q, %v", got, err)
	}
	for _, r := range u.Requests() {
		if r.Host == "other.test" && r.Path == "/landed" {
			t.Errorf("the gateway followed a redirect")
		}
		if r.Host != "api.test" && (strings.Contains(fmt.Sprint(r.Header, r.RawQuery), secretValue) || strings.Contains(r.Body, secretValue)) {
			t.Errorf("the secret reached %s", r.Host)
		}
	}
}
