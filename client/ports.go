package client

import (
	"net/http"
	"net/http/httputil"
	"strconv"
)

// PortHandler returns a handler that passes every request it serves to
// the HTTP server listening on port in the sandbox: through the
// sandbox's data plane when the server names one (with its token,
// renewed as it nears expiry), else through the API server with the API
// key. The request's path and query follow the port's own root; the
// credentials never reach the sandbox.
func (c *Client) PortHandler(sandboxID string, port int) http.Handler {
	prefix := sandboxPath(sandboxID, "/ports/", strconv.Itoa(port), "/http")
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Path = prefix + pr.In.URL.Path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = ""
			pr.Out.Header.Del("Authorization")
		},
		Transport: portTransport{c: c, sandbox: sandboxID},
	}
}

// portTransport sends a port's request to where the sandbox's data
// plane is, and once more with a new token if the data plane refused
// the old one and the request has no body to replay.
type portTransport struct {
	c       *Client
	sandbox string
}

func (t portTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		base, auth, err := t.c.route(req.Context(), t.sandbox)
		if err != nil {
			return nil, err
		}
		out := req.Clone(req.Context())
		out.URL.Scheme, out.URL.Host = base.Scheme, base.Host
		out.URL.Path = base.Path + req.URL.Path
		setAuth(out.Header, auth)
		rt := t.c.hc.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		resp, err := rt.RoundTrip(out)
		if err != nil || resp.StatusCode != http.StatusUnauthorized || attempt > 1 || (req.Body != nil && req.Body != http.NoBody) {
			return resp, err
		}
		resp.Body.Close()
		t.c.forget(t.sandbox)
	}
}
