// Package e2b serves E2B's sandbox API on top of SPACE's own, so that code
// written for E2B's official SDKs runs unchanged against a SPACE server.
//
// One handler serves three things, told apart per request:
//
//   - envd, the in-sandbox API of E2B (Connect-RPC process and filesystem
//     services, /files, /health): requests that name a sandbox with the
//     E2b-Sandbox-Id header, or arrive at the host 49983-ID.DOMAIN. It is
//     served here, on the host, by translating each call onto the
//     sandbox's SPACE agent through the data plane; nothing of E2B's runs
//     in the guest.
//   - any other port of a sandbox (PORT-ID.DOMAIN, or E2b-Sandbox-Port),
//     reached through SPACE's exposed-port route and the sandbox's gateway.
//   - E2B's control-plane REST API (/sandboxes, /v2/sandboxes, ...),
//     authenticated with X-API-KEY, which is a SPACE API key: each call
//     is made to SPACE's API as that key's team.
//
// Sandbox IDs are SPACE's without their "sbx_" prefix (E2B's SDKs accept
// only lowercase letters and digits). Each sandbox's envd access token is
// an HMAC of its ID under a secret the control-plane replicas share, so
// any replica checks it without storing it.
package e2b

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"space/api"
	"space/client"
	"space/internal/errkind"
)

// EnvdVersion is the version of envd whose behaviour this package serves;
// the SDKs gate features on it (0.5.2 closeStdin, 0.5.7 octet-stream
// uploads, 0.6.2 file metadata, 0.6.3 watch events with entries, 0.6.4
// watches on network mounts).
const EnvdVersion = "0.6.4"

// EnvdPort is the port E2B's SDKs address envd on.
const EnvdPort = 49983

// idPrefix starts every SPACE sandbox ID; E2B's IDs are the rest.
const idPrefix = "sbx_"

// Sandboxes finds sandboxes for the facade's envd and port requests,
// which it authorizes by tokens bound to a sandbox's ID, not by a team's
// key (controlplane.Server is one).
type Sandboxes interface {
	// SandboxByID returns the sandbox with SPACE ID id whatever its team,
	// with a fresh data plane while its VM runs; errkind.NotFound when
	// there is no such sandbox.
	SandboxByID(ctx context.Context, id string) (api.Sandbox, error)
}

// Config configures a Server.
type Config struct {
	// API is the base URL of SPACE's REST API, which the facade calls
	// with the caller's API key (and, for envd calls, with data-plane
	// tokens). Required.
	API string
	// Sandboxes finds sandboxes for envd and port requests. Required.
	Sandboxes Sandboxes
	// Secret keys the sandboxes' envd access tokens: every replica must
	// have the same. At least 16 bytes. Required.
	Secret []byte
	// Domain is the domain of sandbox hosts (PORT-ID.DOMAIN), returned
	// to the SDKs as each sandbox's domain; "" returns none, and clients
	// then reach envd through E2B_SANDBOX_URL and its headers.
	Domain string
	// HTTPClient makes the calls to API; nil = a default client.
	HTTPClient *http.Client
	// Log receives what goes wrong; nil = slog.Default().
	Log *slog.Logger
}

// Server is the facade's HTTP handler.
type Server struct {
	cfg Config
	api *http.ServeMux
	env *http.ServeMux
	// users caches, per SPACE sandbox ID, whether the guest has the user
	// "user" that envd calls run as by default.
	users    userCache
	watchers watchers
}

// New validates cfg and returns the facade.
func New(cfg Config) (*Server, error) {
	if cfg.API == "" || cfg.Sandboxes == nil {
		return nil, fmt.Errorf("e2b: the API URL and the sandboxes are required: %w", errkind.InvalidArgument)
	}
	if len(cfg.Secret) < 16 {
		return nil, fmt.Errorf("e2b: a secret of at least 16 bytes is required: %w", errkind.InvalidArgument)
	}
	if _, err := client.New(cfg.API, ""); err != nil {
		return nil, fmt.Errorf("e2b: %w: %w", err, errkind.InvalidArgument)
	}
	if cfg.Domain != "" && (strings.ContainsAny(cfg.Domain, "/:@ ") || strings.HasPrefix(cfg.Domain, ".")) {
		return nil, fmt.Errorf("e2b: domain %q: want a DNS name such as sandbox.example.com: %w", cfg.Domain, errkind.InvalidArgument)
	}
	cfg.Domain = strings.ToLower(strings.TrimSuffix(cfg.Domain, "."))
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Server{cfg: cfg, api: http.NewServeMux(), env: http.NewServeMux()}
	s.apiRoutes()
	s.envdRoutes()
	return s, nil
}

// ServeHTTP routes a request to envd, a sandbox port or the control-plane
// API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := s.sandboxTarget(r); ok {
		if port == EnvdPort {
			s.serveEnvd(w, r, id)
		} else {
			s.servePort(w, r, id, port)
		}
		return
	}
	s.api.ServeHTTP(w, r)
}

// sandboxTarget tells which sandbox and port a request is for: its host
// PORT-ID.DOMAIN, or else its E2b-Sandbox-Id and E2b-Sandbox-Port
// headers. ok is false for the control-plane API. id is an E2B ID (not
// yet checked); a malformed host or port is answered later as a sandbox
// that was not found.
func (s *Server) sandboxTarget(r *http.Request) (id string, port int, ok bool) {
	if s.cfg.Domain != "" {
		host := strings.ToLower(r.Host)
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		// PORT-ID.DOMAIN; other names under it (api.DOMAIN) are the API's.
		if label, found := strings.CutSuffix(host, "."+s.cfg.Domain); found && !strings.Contains(label, ".") {
			if p, sid, found := strings.Cut(label, "-"); found {
				n, err := strconv.Atoi(p)
				if err != nil || n < 1 || n > 65535 {
					n = 0
				}
				return sid, n, true
			}
		}
	}
	if sid := r.Header.Get("E2b-Sandbox-Id"); sid != "" {
		n := EnvdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			v, err := strconv.Atoi(p)
			if err != nil || v < 1 || v > 65535 {
				v = 0
			}
			n = v
		}
		return sid, n, true
	}
	return "", 0, false
}

// spaceID returns the SPACE ID of E2B sandbox ID id, or false when id
// cannot be one.
func spaceID(id string) (string, bool) {
	if id == "" || len(id) > 64 {
		return "", false
	}
	for _, c := range id {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return "", false
		}
	}
	return idPrefix + id, true
}

// e2bID returns the E2B ID of SPACE sandbox ID id.
func e2bID(id string) string { return strings.TrimPrefix(id, idPrefix) }

// accessToken returns the envd access token of SPACE sandbox id.
func (s *Server) accessToken(id string) string {
	m := hmac.New(sha256.New, s.cfg.Secret)
	m.Write([]byte("space e2b envd access token v1\x00" + id))
	return "spe2b_" + hex.EncodeToString(m.Sum(nil))
}

// trafficToken returns the token that opens the ports of SPACE sandbox
// id when it was created without public traffic.
func (s *Server) trafficToken(id string) string {
	m := hmac.New(sha256.New, s.cfg.Secret)
	m.Write([]byte("space e2b traffic token v1\x00" + id))
	return "spe2bt_" + hex.EncodeToString(m.Sum(nil))
}

// validToken reports whether tok is the access token of SPACE sandbox id.
func (s *Server) validToken(id, tok string) bool {
	return hmac.Equal([]byte(tok), []byte(s.accessToken(id)))
}

// apiError is the body of every control-plane error, as E2B's API sends.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeAPIError answers a control-plane call with err: a SPACE API error
// keeps its status and message.
func writeAPIError(w http.ResponseWriter, err error) {
	status, msg := http.StatusInternalServerError, err.Error()
	var ce *client.Error
	var se *statusError
	switch {
	case errors.As(err, &se):
		status, msg = se.status, se.msg
	case errors.As(err, &ce):
		status = cmp.Or(ce.Status, http.StatusBadGateway)
		msg = ce.Message
		if ce.Field != "" {
			msg = ce.Field + ": " + msg
		}
	case errors.Is(err, context.Canceled):
		status = 499
	}
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// statusError is a control-plane refusal of the facade's own.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &statusError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &statusError{http.StatusNotFound, fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":500,"message":"encode the reply"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// sandboxGone answers a request for a sandbox that does not exist or does
// not run, as E2B's proxy does: 502 with a JSON body the SDKs recognise.
func sandboxGone(w http.ResponseWriter, id string) {
	writeJSON(w, http.StatusBadGateway, struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}{id, "The sandbox was not found", http.StatusBadGateway})
}

// userCache remembers whether sandboxes have the default user, for at
// most maxCachedUsers of them: forgotten all at once when full, since
// sandboxes deleted elsewhere are never removed one by one.
type userCache struct {
	mu sync.Mutex
	// +checklocks:mu
	has map[string]bool
}

const maxCachedUsers = 10000

func (u *userCache) get(id string) (has, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	has, ok = u.has[id]
	return has, ok
}

func (u *userCache) put(id string, has bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.has == nil || len(u.has) >= maxCachedUsers {
		u.has = map[string]bool{}
	}
	u.has[id] = has
}

func (u *userCache) forget(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.has, id)
}
