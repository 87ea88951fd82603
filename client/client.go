// Package client is a Go client for SPACE's REST API (see package api and
// api/openapi.yaml).
//
// A Client is safe for concurrent use. Requests have no deadline of their
// own: a command may stream for hours, so the ctx passed to each method
// governs how long it may take.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"space/api"
)

// Client talks to one SPACE API server with one API key. A sandbox's
// data-plane requests (exec, processes, files, ports) go where the server
// says (api.Sandbox.DataPlane) with the token it gave, so they do not pass
// through the control plane; against a server that names no data plane
// they go to the server with the API key.
type Client struct {
	base *url.URL // scheme, host and path prefix; no trailing slash
	key  string   // or "" (only Health works then)
	hc   *http.Client
	now  func() time.Time

	mu sync.Mutex
	// +checklocks:mu
	planes map[string]dataPlane // by sandbox ID: the latest data plane a reply named
}

// dataPlane is a sandbox's data plane, parsed.
type dataPlane struct {
	base    *url.URL // or nil: through the server, with the API key
	token   string
	expires time.Time
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests with hc instead of a
// new http.Client using http.DefaultTransport. hc should have no Timeout:
// it would cut long output streams (pass a ctx deadline instead).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// New returns a Client for the server at baseURL (e.g.
// "http://127.0.0.1:7070"; a path prefix is kept) that authenticates with
// apiKey.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("api url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("api url %q: scheme must be http or https", baseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("api url %q: no host", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	c := &Client{base: u, key: apiKey, hc: &http.Client{}, now: time.Now, planes: map[string]dataPlane{}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Error is a failure the server reported: an HTTP error status with an
// api.Error body, or an error event in an output stream (Status 0).
// Use errors.As to get at it, or the Is* helpers.
type Error struct {
	Status  int    // HTTP status; 0 for an error event in a stream
	Code    string // one of the api.Code* values
	Message string
	Field   string // the offending request field, or ""
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = strings.ReplaceAll(e.Code, "_", " ")
	}
	if e.Field != "" {
		msg = e.Field + ": " + msg
	}
	if e.Status != 0 {
		return fmt.Sprintf("%s (%s, HTTP %d)", msg, e.Code, e.Status)
	}
	return fmt.Sprintf("%s (%s)", msg, e.Code)
}

// IsNotFound reports whether err is an *Error saying that the object does
// not exist (or belongs to another team).
func IsNotFound(err error) bool { return hasCode(err, api.CodeNotFound) }

// IsConflict reports whether err is an *Error saying that the object's
// state does not allow the request (codes conflict and
// failed_precondition).
func IsConflict(err error) bool {
	return hasCode(err, api.CodeConflict) || hasCode(err, api.CodeFailedPrecondition)
}

// IsInvalid reports whether err is an *Error saying that the request is
// malformed or a value is out of bounds (Error.Field names it).
func IsInvalid(err error) bool { return hasCode(err, api.CodeInvalidArgument) }

// IsUnauthenticated reports whether err is an *Error saying that the API
// key is missing or not valid.
func IsUnauthenticated(err error) bool { return hasCode(err, api.CodeUnauthenticated) }

func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// codeForStatus guesses an error code for a reply without an api.Error
// body (from a proxy, say).
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return api.CodeInvalidArgument
	case http.StatusUnauthorized:
		return api.CodeUnauthenticated
	case http.StatusForbidden:
		return api.CodePermissionDenied
	case http.StatusNotFound:
		return api.CodeNotFound
	case http.StatusConflict:
		return api.CodeConflict
	case http.StatusRequestEntityTooLarge:
		return api.CodeTooLarge
	case http.StatusTooManyRequests:
		return api.CodeResourceExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return api.CodeUnavailable
	case http.StatusGatewayTimeout:
		return api.CodeDeadlineExceeded
	default:
		return api.CodeInternal
	}
}

// maxErrorBody bounds how much of an error reply is read.
const maxErrorBody = 64 << 10

// decodeError turns a failed reply (status and the start of its body)
// into an *Error.
func decodeError(status int, body []byte) *Error {
	var eb api.Error
	if err := json.Unmarshal(body, &eb); err == nil && eb.Error.Code != "" {
		return &Error{Status: status, Code: eb.Error.Code, Message: eb.Error.Message, Field: eb.Error.Field}
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if msg == "" {
		msg = strings.ToLower(http.StatusText(status))
	}
	return &Error{Status: status, Code: codeForStatus(status), Message: msg}
}

// url returns the URL of path (which starts with "/v1/") on the API
// server with query q.
func (c *Client) url(path string, q url.Values) string { return urlOf(c.base, path, q) }

func urlOf(base *url.URL, path string, q url.Values) string {
	u := *base
	u.Path += path
	u.RawQuery = q.Encode()
	return u.String()
}

// sandboxPath returns "/v1/sandboxes/{id}" plus the elements of rest.
func sandboxPath(id string, rest ...string) string {
	return "/" + api.Version + "/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

func processPath(id string, pid int64, rest string) string {
	return sandboxPath(id, "/processes/", strconv.FormatInt(pid, 10), rest)
}

// request describes one call.
type request struct {
	method string
	path   string
	query  url.Values
	body   io.Reader // or nil
	// contentType of body; "application/json" when body is set and this
	// is empty.
	contentType   string
	contentLength int64 // of body when known, else 0
	accept        string
	header        http.Header // more request headers, or nil
	want          []int       // the success statuses; 200 when empty
	// sandbox, for a data-plane request, is the sandbox's ID: the
	// request goes to its data plane.
	sandbox string
}

// jsonBody marshals v for a request body.
func jsonBody(v any) (io.Reader, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return bytes.NewReader(b), nil
}

// do sends r and returns the reply when its status is one of r.want; the
// caller closes its body. Any other status comes back as an *Error
// (wrapped with the method and path; a transport error names them
// already). A data-plane request whose token the data plane refuses is
// sent once more with a new one when its body can be sent again.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	resp, err := c.send(ctx, r)
	if err != nil || r.sandbox == "" || resp.StatusCode != http.StatusUnauthorized {
		return c.check(r, resp, err)
	}
	replay, ok := r.body.(io.Seeker)
	if r.body != nil && !ok {
		return c.check(r, resp, err)
	}
	resp.Body.Close()
	c.forget(r.sandbox)
	if replay != nil {
		if _, err := replay.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
	}
	resp, err = c.send(ctx, r)
	return c.check(r, resp, err)
}

// send sends r to where it goes: the API server, or for a data-plane
// request the sandbox's data plane.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	base, auth, err := c.route(ctx, r.sandbox)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, r.method, urlOf(base, r.path, r.query), r.body)
	if err != nil {
		return nil, err
	}
	if r.body != nil {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
		if r.contentLength > 0 {
			req.ContentLength = r.contentLength
		}
	}
	accept := r.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	for k, v := range r.header {
		req.Header[k] = v
	}
	setAuth(req.Header, auth)
	return c.hc.Do(req)
}

// check returns resp if its status is one of r.want, else the error it
// carries.
func (c *Client) check(r request, resp *http.Response, err error) (*http.Response, error) {
	if err != nil {
		return nil, err
	}
	want := r.want
	if len(want) == 0 {
		want = []int{http.StatusOK}
	}
	if !slices.Contains(want, resp.StatusCode) {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, fmt.Errorf("%s %s: %w", r.method, r.path, decodeError(resp.StatusCode, body))
	}
	return resp, nil
}

// planeMargin is how long before its expiry a data-plane token is
// replaced: a request must reach the data plane while it is still valid.
const planeMargin = 30 * time.Second

// route returns where a request for sandbox (or "" for the management
// API) goes and the credential it carries.
func (c *Client) route(ctx context.Context, sandbox string) (*url.URL, string, error) {
	if sandbox == "" {
		return c.base, c.key, nil
	}
	c.mu.Lock()
	p, ok := c.planes[sandbox]
	c.mu.Unlock()
	if !ok || !c.now().Add(planeMargin).Before(p.expires) {
		var sb api.Sandbox
		if err := c.call(ctx, request{method: http.MethodGet, path: sandboxPath(sandbox)}, &sb); err != nil {
			// The request itself gets the server's answer.
			return c.base, c.key, nil
		}
		c.mu.Lock()
		p, ok = c.planes[sandbox]
		if !ok {
			// A server without a data plane of its own, or a sandbox
			// whose VM does not run: through the server for a while.
			p = dataPlane{expires: c.now().Add(planeMargin + noPlaneFor)}
			c.planes[sandbox] = p
		}
		c.mu.Unlock()
	}
	if p.base == nil {
		return c.base, c.key, nil
	}
	return p.base, p.token, nil
}

// noPlaneFor is how long requests for a sandbox that has no data plane go
// through the server before the client asks again.
const noPlaneFor = 30 * time.Second

// remember keeps the data plane sb names (or forgets one it no longer
// has).
func (c *Client) remember(sb api.Sandbox) {
	if sb.DataPlane == nil {
		c.forget(sb.ID)
		return
	}
	u, err := url.Parse(sb.DataPlane.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || sb.DataPlane.Token == "" {
		c.forget(sb.ID)
		return
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	c.mu.Lock()
	defer c.mu.Unlock()
	c.planes[sb.ID] = dataPlane{base: u, token: sb.DataPlane.Token, expires: sb.DataPlane.ExpiresAt}
}

// UseDataPlane makes the data-plane requests of sandbox go to dp.URL (or,
// when that is empty, to the client's own base URL) with dp.Token until
// dp.ExpiresAt, without asking the API for it first: for a holder of a
// data-plane token that has no API key.
func (c *Client) UseDataPlane(sandbox string, dp api.DataPlane) error {
	base := c.base
	if dp.URL != "" {
		u, err := url.Parse(dp.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("data plane url %q: want http(s)://host[:port][/prefix]", dp.URL)
		}
		u.Path = strings.TrimSuffix(u.Path, "/")
		u.RawPath, u.RawQuery, u.Fragment = "", "", ""
		base = u
	}
	if dp.Token == "" {
		return fmt.Errorf("data plane of %s: no token", sandbox)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.planes[sandbox] = dataPlane{base: base, token: dp.Token, expires: dp.ExpiresAt}
	return nil
}

func (c *Client) forget(sandbox string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.planes, sandbox)
}

func (c *Client) authorize(h http.Header) { setAuth(h, c.key) }

func setAuth(h http.Header, credential string) {
	h.Set("User-Agent", "space-client/"+api.Version)
	if credential != "" {
		h.Set("Authorization", "Bearer "+credential)
	}
}

// call sends r and decodes a JSON reply into out (unless out is nil, when
// the body is discarded). The error names the method and path.
func (c *Client) call(ctx context.Context, r request, out any) error {
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode reply: %w", r.method, r.path, err)
	}
	switch v := out.(type) {
	case *api.Sandbox:
		c.remember(*v)
	case *api.SandboxList:
		for _, sb := range v.Sandboxes {
			c.remember(sb)
		}
	}
	return nil
}

// Health asks whether the server is up. It needs no API key.
func (c *Client) Health(ctx context.Context) (api.Health, error) {
	var h api.Health
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/health"}, &h)
	return h, err
}

// CreateSandbox creates a sandbox and returns it. Zero fields of req take
// the server's defaults.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandbox) (api.Sandbox, error) {
	var sb api.Sandbox
	body, err := jsonBody(req)
	if err != nil {
		return sb, err
	}
	err = c.call(ctx, request{method: http.MethodPost, path: "/v1/sandboxes", body: body,
		want: []int{http.StatusCreated}}, &sb)
	return sb, err
}

// ListOptions filters Sandboxes.
type ListOptions struct {
	State  string            // only sandboxes in this state; "" = any
	Labels map[string]string // only sandboxes carrying all these labels
}

// Sandboxes lists the team's sandboxes.
func (c *Client) Sandboxes(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for _, k := range sortedKeys(opts.Labels) {
		q.Add("label", k+"="+opts.Labels[k])
	}
	var l api.SandboxList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/sandboxes", query: q}, &l)
	return l.Sandboxes, err
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Sandbox describes sandbox id.
func (c *Client) Sandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.call(ctx, request{method: http.MethodGet, path: sandboxPath(id)}, &sb)
	return sb, err
}

// DeleteSandbox stops sandbox id's VM and deletes the sandbox.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: sandboxPath(id),
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
}

// PauseSandbox stops the sandbox's vCPUs; ResumeSandbox continues them.
func (c *Client) PauseSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/pause")}, &sb)
	return sb, err
}

// SetTimeout sets sandbox id's timeout to d from now (whole seconds,
// rounded up): with on_timeout delete it is deleted then; with suspend, d
// is its new idle time.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	body, err := jsonBody(api.SetTimeout{TimeoutSeconds: int64((d + time.Second - 1) / time.Second)})
	if err != nil {
		return api.Sandbox{}, err
	}
	var sb api.Sandbox
	err = c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/timeout"), body: body}, &sb)
	return sb, err
}

// SuspendSandbox snapshots sandbox id to storage and stops its VM.
func (c *Client) SuspendSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/suspend")}, &sb)
	return sb, err
}

// ResumeSandbox continues a paused sandbox, or restores a suspended one.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var sb api.Sandbox
	err := c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/resume")}, &sb)
	return sb, err
}

// StartDetached starts req in sandbox id and returns its Process at once
// (req.Detach is implied). Read its output with Output or Attach.
func (c *Client) StartDetached(ctx context.Context, id string, req api.Exec) (api.Process, error) {
	req.Detach = true
	var p api.Process
	body, err := jsonBody(req)
	if err != nil {
		return p, err
	}
	err = c.call(ctx, request{method: http.MethodPost, sandbox: id, path: sandboxPath(id, "/exec"), body: body,
		want: []int{http.StatusCreated}}, &p)
	return p, err
}

// Processes lists the commands started in sandbox id.
func (c *Client) Processes(ctx context.Context, id string) ([]api.Process, error) {
	var l api.ProcessList
	err := c.call(ctx, request{method: http.MethodGet, sandbox: id, path: sandboxPath(id, "/processes")}, &l)
	return l.Processes, err
}

// Process describes the command pid (an api.Process.ID) in sandbox id.
func (c *Client) Process(ctx context.Context, id string, pid int64) (api.Process, error) {
	var p api.Process
	err := c.call(ctx, request{method: http.MethodGet, sandbox: id, path: processPath(id, pid, "")}, &p)
	return p, err
}

// Signal sends signal sig (a Linux signal number) to the command pid in
// sandbox id.
func (c *Client) Signal(ctx context.Context, id string, pid int64, sig int) error {
	body, err := jsonBody(api.Signal{Signal: sig})
	if err != nil {
		return err
	}
	return c.call(ctx, request{method: http.MethodPost, sandbox: id, path: processPath(id, pid, "/signal"), body: body,
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
}

// WriteStdin writes data to the stdin of the running command pid in
// sandbox id without attaching to it (in requests of up to
// api.MaxStdinWrite bytes), then closes its stdin when eof is set. The
// command must have been started with its stdin open (ExecStream with
// KeepStdinOpen, or Attach); otherwise the error is a conflict
// (IsConflict).
func (c *Client) WriteStdin(ctx context.Context, id string, pid int64, data []byte, eof bool) error {
	for {
		n := min(len(data), api.MaxStdinWrite)
		last := n == len(data)
		var q url.Values
		if eof && last {
			q = url.Values{"eof": {"true"}}
		}
		err := c.call(ctx, request{method: http.MethodPost, sandbox: id, path: processPath(id, pid, "/stdin"), query: q,
			body: bytes.NewReader(data[:n]), contentType: "application/octet-stream", contentLength: int64(n),
			want: []int{http.StatusNoContent}}, nil)
		if err != nil || last {
			return err
		}
		data = data[n:]
	}
}

// ResizeProcess sets the terminal size of the running command pid in
// sandbox id, which must run on a terminal.
func (c *Client) ResizeProcess(ctx context.Context, id string, pid int64, size api.WinSize) error {
	body, err := jsonBody(size)
	if err != nil {
		return err
	}
	return c.call(ctx, request{method: http.MethodPost, sandbox: id, path: processPath(id, pid, "/resize"), body: body,
		want: []int{http.StatusNoContent}}, nil)
}

// PortOpen reports whether something in sandbox sandboxID accepts TCP
// connections on port (1..65535) of its loopback, 127.0.0.1 or ::1. A
// closed port is (false, nil); a sandbox that is not running, or whose
// agent predates port probes, is a conflict error (IsConflict).
func (c *Client) PortOpen(ctx context.Context, sandboxID string, port int) (bool, error) {
	var st api.PortState
	err := c.call(ctx, request{method: http.MethodGet, sandbox: sandboxID, path: sandboxPath(sandboxID, "/ports/", strconv.Itoa(port))}, &st)
	return st.Open, err
}

// CreateAPIKey creates an API key. The returned key's Secret is the only
// copy the server hands out.
func (c *Client) CreateAPIKey(ctx context.Context, req api.CreateAPIKey) (api.APIKey, error) {
	var k api.APIKey
	body, err := jsonBody(req)
	if err != nil {
		return k, err
	}
	err = c.call(ctx, request{method: http.MethodPost, path: "/v1/apikeys", body: body,
		want: []int{http.StatusCreated}}, &k)
	return k, err
}

// APIKeys lists the API keys of team, or of the caller's team when team
// is "" (another team needs an admin key). Secrets are never included.
func (c *Client) APIKeys(ctx context.Context, team string) ([]api.APIKey, error) {
	q := url.Values{}
	if team != "" {
		q.Set("team", team)
	}
	var l api.APIKeyList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/apikeys", query: q}, &l)
	return l.Keys, err
}

// DeleteAPIKey revokes the API key with ID id.
func (c *Client) DeleteAPIKey(ctx context.Context, id string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: "/v1/apikeys/" + url.PathEscape(id),
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
}

// Workers lists the workers the control plane knows, with their capacity,
// use, health and capabilities (an admin key).
func (c *Client) Workers(ctx context.Context) ([]api.Worker, error) {
	var l api.WorkerList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/workers"}, &l)
	return l.Workers, err
}

// Quota returns the caller's team's limits and usage.
func (c *Client) Quota(ctx context.Context) (api.QuotaUsage, error) {
	return c.TeamQuota(ctx, "")
}

// TeamQuota returns a team's limits and usage; team "" is the caller's,
// another needs an admin key.
func (c *Client) TeamQuota(ctx context.Context, team string) (api.QuotaUsage, error) {
	var q api.QuotaUsage
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/quota", query: teamQuery(team)}, &q)
	return q, err
}

// SetQuota replaces a team's limits (admin key; team "" is the caller's)
// and returns them with the team's usage. 0 in a field means unlimited.
func (c *Client) SetQuota(ctx context.Context, team string, q api.Quota) (api.QuotaUsage, error) {
	body, err := jsonBody(q)
	if err != nil {
		return api.QuotaUsage{}, err
	}
	var out api.QuotaUsage
	err = c.call(ctx, request{method: http.MethodPut, path: "/v1/quota", query: teamQuery(team), body: body}, &out)
	return out, err
}

func teamQuery(team string) url.Values {
	if team == "" {
		return nil
	}
	return url.Values{"team": {team}}
}

// CreateSnapshot takes a live snapshot of sandbox id; name is optional.
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (api.Snapshot, error) {
	body, err := jsonBody(api.CreateSnapshot{Name: name})
	if err != nil {
		return api.Snapshot{}, err
	}
	var sn api.Snapshot
	err = c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/snapshots"), body: body, want: []int{http.StatusCreated}}, &sn)
	return sn, err
}

// Snapshots lists the team's snapshots, or those of sandboxID if it is
// not "".
func (c *Client) Snapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error) {
	var q url.Values
	if sandboxID != "" {
		q = url.Values{"sandbox": {sandboxID}}
	}
	var out api.SnapshotList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/snapshots", query: q}, &out)
	return out.Snapshots, err
}

// Snapshot describes a snapshot by ID or name.
func (c *Client) Snapshot(ctx context.Context, ref string) (api.Snapshot, error) {
	var sn api.Snapshot
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/snapshots/" + url.PathEscape(ref)}, &sn)
	return sn, err
}

// DeleteSnapshot deletes a snapshot by ID or name.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: "/v1/snapshots/" + url.PathEscape(ref),
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
}

// RestoreSandbox rolls sandbox id back to a snapshot (ID or name) in place.
func (c *Client) RestoreSandbox(ctx context.Context, id, snapshot string) (api.Sandbox, error) {
	body, err := jsonBody(api.RestoreSandbox{Snapshot: snapshot})
	if err != nil {
		return api.Sandbox{}, err
	}
	var sb api.Sandbox
	err = c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/restore"), body: body}, &sb)
	return sb, err
}

// ForkSandbox makes count running copies of sandbox id and returns them.
func (c *Client) ForkSandbox(ctx context.Context, id string, count int) ([]api.Sandbox, error) {
	body, err := jsonBody(api.ForkSandbox{Count: count})
	if err != nil {
		return nil, err
	}
	var out api.SandboxList
	err = c.call(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/fork"), body: body, want: []int{http.StatusCreated}}, &out)
	return out.Sandboxes, err
}
