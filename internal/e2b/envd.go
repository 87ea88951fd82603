package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"

	"space/client"
	"space/internal/errkind"
)

// envdCall is what an envd handler works with: the sandbox, a client of
// its data plane, and the user the call runs as.
type envdCall struct {
	s       *Server
	id      string // SPACE's
	e2bID   string
	sandbox *client.Client
	user    string // as the caller named it, or "" for the default
}

type envdHandler func(w http.ResponseWriter, r *http.Request, c *envdCall)

func (s *Server) envdRoutes() {
	rpc := func(name string, h envdHandler) {
		s.env.Handle("POST /"+name, envdHandlerFunc(h))
	}
	rpc("process.Process/Start", s.processStart)
	rpc("process.Process/Connect", s.processConnect)
	rpc("process.Process/List", s.processList)
	rpc("process.Process/SendInput", s.processSendInput)
	rpc("process.Process/CloseStdin", s.processCloseStdin)
	rpc("process.Process/SendSignal", s.processSendSignal)
	rpc("process.Process/Update", s.processUpdate)
	rpc("process.Process/StreamInput", s.processStreamInput)
	rpc("filesystem.Filesystem/Stat", s.fsStat)
	rpc("filesystem.Filesystem/ListDir", s.fsListDir)
	rpc("filesystem.Filesystem/MakeDir", s.fsMakeDir)
	rpc("filesystem.Filesystem/Move", s.fsMove)
	rpc("filesystem.Filesystem/Remove", s.fsRemove)
	rpc("filesystem.Filesystem/WatchDir", s.fsWatchDir)
	rpc("filesystem.Filesystem/CreateWatcher", s.fsCreateWatcher)
	rpc("filesystem.Filesystem/GetWatcherEvents", s.fsGetWatcherEvents)
	rpc("filesystem.Filesystem/RemoveWatcher", s.fsRemoveWatcher)
	s.env.Handle("GET /files", envdHandlerFunc(s.filesGet))
	s.env.Handle("POST /files", envdHandlerFunc(s.filesPost))
}

// envdCallKey carries the *envdCall from serveEnvd to the handler.
type envdCallKey struct{}

func envdHandlerFunc(h envdHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h(w, r, r.Context().Value(envdCallKey{}).(*envdCall))
	}
}

// serveEnvd serves an envd request for E2B sandbox id: /files with a
// signature or the access token, everything else (/health too, which
// E2B's envd answers to anyone: the SDKs send the token on it as on every
// envd call) with the access token. A sandbox that does not exist or does
// not run is answered 502 once the caller has shown the token, as E2B's
// proxy does.
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request, e2bID string) {
	id, ok := spaceID(e2bID)
	if !ok {
		sandboxGone(w, e2bID)
		return
	}
	isFiles := r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost)
	switch {
	case s.validToken(id, r.Header.Get("X-Access-Token")):
	case isFiles && r.URL.Query().Get("signature") != "":
		if err := s.checkSignature(r, id); err != nil {
			writeJSON(w, http.StatusUnauthorized, apiError{Code: http.StatusUnauthorized, Message: err.Error()})
			return
		}
	default:
		writeJSON(w, http.StatusUnauthorized, apiError{Code: http.StatusUnauthorized,
			Message: "unauthorized access, please provide a valid access token or method signing if supported"})
		return
	}
	c, err := s.sandboxClient(r.Context(), id)
	if err != nil {
		if errors.Is(err, errkind.NotFound) || errors.Is(err, errkind.FailedPrecondition) {
			sandboxGone(w, e2bID)
			return
		}
		s.cfg.Log.Error("e2b: find a sandbox", "sandbox_id", id, "err", err)
		writeJSON(w, http.StatusServiceUnavailable, apiError{Code: http.StatusServiceUnavailable, Message: err.Error()})
		return
	}
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	call := &envdCall{s: s, id: id, e2bID: e2bID, sandbox: c, user: requestUser(r)}
	s.env.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), envdCallKey{}, call)))
}

// gone reports whether the call's sandbox no longer runs.
func (c *envdCall) gone() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sb, err := c.s.cfg.Sandboxes.SandboxByID(ctx, c.id)
	return errors.Is(err, errkind.NotFound) || err == nil && sb.State != "running"
}

// sandboxClient returns a client of the data plane of SPACE sandbox id;
// errkind.NotFound when there is no such sandbox, and
// errkind.FailedPrecondition when its VM does not run.
func (s *Server) sandboxClient(ctx context.Context, id string) (*client.Client, error) {
	sb, err := s.cfg.Sandboxes.SandboxByID(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.DataPlane == nil || sb.State != "running" {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, sb.State, errkind.FailedPrecondition)
	}
	c, err := client.New(s.cfg.API, "", client.WithHTTPClient(s.cfg.HTTPClient))
	if err != nil {
		return nil, err
	}
	if err := c.UseDataPlane(id, *sb.DataPlane); err != nil {
		return nil, err
	}
	return c, nil
}

// requestUser is the user an envd call names: Basic authentication with
// the user name and no password on RPCs, ?username= on /files.
func requestUser(r *http.Request) string {
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic "); ok {
		if b, err := base64.StdEncoding.DecodeString(v); err == nil {
			name, _, _ := strings.Cut(string(b), ":")
			return name
		}
	}
	return ""
}

// defaultUser is the user of calls that name none, as in E2B's
// templates: "user" where the guest has one, else the template's own
// default (root in SPACE's).
const defaultUser = "user"

// user returns the user a call runs as, and that user's home.
func (c *envdCall) userAndHome(ctx context.Context) (string, string) {
	u := c.user
	if u == "" {
		has, ok := c.s.users.get(c.id)
		if !ok {
			_, err := c.sandbox.ListFiles(ctx, c.id, "/home/"+defaultUser)
			has = err == nil
			if err == nil || client.IsNotFound(err) {
				c.s.users.put(c.id, has)
			}
		}
		if has {
			u = defaultUser
		}
	}
	switch u {
	case "", "root":
		return u, "/root"
	}
	return u, "/home/" + u
}

// absPath resolves p against the call's user's home, as envd does.
func (c *envdCall) absPath(ctx context.Context, p string) (string, error) {
	if p == "" {
		return "", newRPCError("invalid_argument", "path is empty")
	}
	if strings.HasPrefix(p, "~/") || p == "~" {
		_, home := c.userAndHome(ctx)
		p = home + strings.TrimPrefix(p, "~")
	}
	if !path.IsAbs(p) {
		_, home := c.userAndHome(ctx)
		p = path.Join(home, p)
	}
	return path.Clean(p), nil
}

func unimplemented(what string) error {
	return newRPCError("unimplemented", "%s is not supported by SPACE's envd", what)
}

func notFoundf(format string, args ...any) error {
	return &rpcError{Code: "not_found", Message: fmt.Sprintf(format, args...)}
}
