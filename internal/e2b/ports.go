package e2b

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"space/api"
	"space/internal/errkind"
)

// trafficTokenHeader carries a sandbox's traffic access token to its
// ports when it was created without public traffic.
const trafficTokenHeader = "E2b-Traffic-Access-Token"

// servePort proxies a request for port of E2B sandbox e2bID (from its
// host PORT-ID.DOMAIN or the E2b-Sandbox-Port header) to the server in
// the guest, through SPACE's exposed-port route and the sandbox's
// gateway. A port is open to anyone who names the sandbox only when the
// sandbox's ports are public (publicPorts); otherwise the request needs
// the sandbox's traffic token or its envd access token, which only its
// team can learn. Like E2B's proxy it answers 502 with a JSON body when
// the sandbox does not run or nothing listens on the port.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, e2bID string, port int) {
	id, ok := spaceID(e2bID)
	if !ok || port == 0 {
		sandboxGone(w, e2bID)
		return
	}
	sb, err := s.cfg.Sandboxes.SandboxByID(r.Context(), id)
	if err != nil || sb.DataPlane == nil || sb.State != "running" {
		if err != nil && !errors.Is(err, errkind.NotFound) {
			s.cfg.Log.Error("e2b: find a sandbox", "sandbox_id", id, "err", err)
		}
		sandboxGone(w, e2bID)
		return
	}
	if !publicPorts(sb) {
		tok := r.Header.Get(trafficTokenHeader)
		if subtle.ConstantTimeCompare([]byte(tok), []byte(s.trafficToken(id))) != 1 && !s.validToken(id, r.Header.Get("X-Access-Token")) {
			writeJSON(w, http.StatusForbidden, struct {
				SandboxID string `json:"sandboxId"`
				Message   string `json:"message"`
				Code      int    `json:"code"`
			}{e2bID, "Missing or invalid traffic access token (" + strings.ToLower(trafficTokenHeader) + ")", http.StatusForbidden})
			return
		}
	}
	base, err := url.Parse(s.cfg.API)
	if err == nil && sb.DataPlane.URL != "" {
		base, err = url.Parse(sb.DataPlane.URL)
	}
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{Code: http.StatusInternalServerError, Message: err.Error()})
		return
	}
	token := sb.DataPlane.Token
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			pr.Out.URL.Path = strings.TrimSuffix(base.Path, "/") + "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port) + "/http" + pr.In.URL.Path
			pr.Out.URL.RawPath = ""
			pr.Out.Host = pr.In.Host
			for _, h := range []string{"Authorization", "X-Access-Token", trafficTokenHeader, "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
				pr.Out.Header.Del(h)
			}
			pr.Out.Header.Set("Authorization", "Bearer "+token)
			pr.SetXForwarded()
		},
		Transport: s.cfg.HTTPClient.Transport,
		ModifyResponse: func(resp *http.Response) error {
			if resp.Header.Get("Space-Port") != "" || resp.StatusCode < 400 {
				resp.Header.Del("Space-Port")
				return nil
			}
			// SPACE's own refusal: nothing listens, or the sandbox went.
			msg := "The sandbox is running but port is not open"
			if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusConflict {
				msg = "The sandbox was not found"
			}
			b, _ := json.Marshal(struct {
				SandboxID string `json:"sandboxId"`
				Message   string `json:"message"`
				Port      int    `json:"port"`
				Code      int    `json:"code"`
			}{e2bID, msg, port, http.StatusBadGateway})
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(b))
			resp.StatusCode, resp.Status = http.StatusBadGateway, "502 Bad Gateway"
			resp.ContentLength = int64(len(b))
			resp.Header = http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(b))}}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			s.cfg.Log.Warn("e2b: proxy to a sandbox port", "sandbox_id", id, "port", port, "err", err)
			sandboxGone(w, e2bID)
		},
	}
	rp.ServeHTTP(w, r)
}

// publicPorts reports whether sb's ports are open on the facade without a
// token: only when it was made so (labelPublic), never by default, so a
// sandbox created through SPACE's own API keeps its ports private here as
// on SPACE's port route.
func publicPorts(sb api.Sandbox) bool { return sb.Labels[labelPublic] == "true" }
