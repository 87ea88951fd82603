package e2b

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"space/api"
	"space/client"
)

// The control-plane API, as E2B's SDKs call it (api.e2b.app's routes).

func (s *Server) apiRoutes() {
	h := func(pattern string, f func(http.ResponseWriter, *http.Request, *client.Client)) {
		s.api.HandleFunc(pattern, s.withKey(f))
	}
	h("POST /sandboxes", s.create)
	h("POST /v2/sandboxes", s.create)
	h("GET /sandboxes", s.listV1)
	h("GET /v2/sandboxes", s.listV2)
	h("GET /sandboxes/{id}", s.get)
	h("DELETE /sandboxes/{id}", s.kill)
	h("POST /sandboxes/{id}/timeout", s.setTimeout)
	h("POST /sandboxes/{id}/refreshes", s.refresh)
	h("POST /sandboxes/{id}/pause", s.pause)
	h("POST /sandboxes/{id}/resume", s.resume)
	h("POST /sandboxes/{id}/connect", s.connect)
	h("POST /v2/sandboxes/{id}/connect", s.connect)
	h("POST /sandboxes/{id}/fork", s.fork)
	h("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	h("GET /snapshots", s.listSnapshots)
	h("DELETE /templates/{id}", s.deleteSnapshot)
	h("PUT /sandboxes/{id}/network", s.setNetwork)
	h("GET /sandboxes/{id}/metrics", s.metrics)
	h("GET /teams/{teamID}/metrics", s.teamMetrics)
	h("GET /events/sandboxes", s.teamEvents)
	h("GET /events/sandboxes/{id}", s.sandboxEvents)
	s.webhookRoutes()
	s.api.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"message": "Health check successful"})
	})
	s.api.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound,
			Message: fmt.Sprintf("%s %s is not part of the E2B API that SPACE serves", r.Method, r.URL.Path)})
	})
}

// withKey gives f a client of SPACE's API with the caller's key: the
// X-API-KEY header (or a bearer token).
func (s *Server) withKey(f func(http.ResponseWriter, *http.Request, *client.Client)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-KEY")
		if key == "" {
			key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		if key == "" {
			writeJSON(w, http.StatusUnauthorized, apiError{Code: http.StatusUnauthorized, Message: "missing the X-API-KEY header (a SPACE API key)"})
			return
		}
		c, err := client.New(s.cfg.API, key, client.WithHTTPClient(s.cfg.HTTPClient))
		if err != nil {
			writeAPIError(w, err)
			return
		}
		f(w, r, c)
	}
}

// pathSandbox returns the SPACE ID of the sandbox the path names, or
// answers 404.
func pathSandbox(w http.ResponseWriter, r *http.Request) (string, bool) {
	e := r.PathValue("id")
	if i := strings.IndexByte(e, '-'); i >= 0 {
		e = e[:i] // an old SDK's "ID-clientID"
	}
	id, ok := spaceID(e)
	if !ok {
		writeAPIError(w, notFound("sandbox %q not found", r.PathValue("id")))
		return "", false
	}
	return id, true
}

// pathSandboxInfo returns the sandbox the path names, or answers the
// error.
func pathSandboxInfo(w http.ResponseWriter, r *http.Request, c *client.Client) (api.Sandbox, bool) {
	id, ok := pathSandbox(w, r)
	if !ok {
		return api.Sandbox{}, false
	}
	sb, err := c.Sandbox(r.Context(), id)
	if err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return api.Sandbox{}, false
	}
	return sb, true
}

// sandboxRequest returns the SPACE ID of the sandbox the path names and
// reads the JSON body into req; false once it has answered an error.
func sandboxRequest(w http.ResponseWriter, r *http.Request, req any) (string, bool) {
	id, ok := pathSandbox(w, r)
	if !ok {
		return "", false
	}
	if err := decodeBody(r, req); err != nil {
		writeAPIError(w, err)
		return "", false
	}
	return id, true
}

// decodeBody reads a JSON body into v; an empty body leaves v as it is.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return badRequest("request body: %v", err)
	}
	return nil
}

// snapshotIDPrefix starts SPACE's snapshot IDs.
const snapshotIDPrefix = "snp_"

// templateName maps E2B template names onto SPACE's: "base" is SPACE's
// default template, which has what E2B's base image offers to code.
func templateName(e2b string) string {
	switch e2b {
	case "", "base":
		return "default"
	}
	return e2b
}

// e2bTemplate is the inverse of templateName.
func e2bTemplate(space string) string {
	if space == "default" {
		return "base"
	}
	return space
}

// hidden labels carry what the facade keeps about a sandbox; they are
// not shown as its metadata.
const (
	labelPrefix = "e2b.space/"
	// labelPublic "true" opens the sandbox's ports on the facade to anyone
	// who names the sandbox: set by a facade create unless it asked for
	// allowPublicTraffic false, or by the owner through SPACE's API.
	// Without it a port needs the traffic or the access token.
	labelPublic     = labelPrefix + "public-traffic"
	labelAutoResume = labelPrefix + "auto-resume"
)

func metadataOf(labels map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range labels {
		if !strings.HasPrefix(k, labelPrefix) {
			m[k] = v
		}
	}
	return m
}

type networkConfig struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    *string  `json:"maskRequestHost,omitempty"`
}

type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	AutoPause           bool              `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	Secure       *bool           `json:"secure"`
	MCP          json.RawMessage `json:"mcp"`
	VolumeMounts json.RawMessage `json:"volumeMounts"`
	IAM          json.RawMessage `json:"iam"`
}

// defaultTimeout is E2B's sandbox timeout when a create names none.
const defaultTimeout = 300

func (s *Server) create(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	cr, err := s.createRequest(req)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	sb, err := c.CreateSandbox(r.Context(), cr)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxView(sb))
}

// createRequest maps an E2B create onto SPACE's, refusing what SPACE
// does not do rather than ignoring it.
func (s *Server) createRequest(req newSandbox) (api.CreateSandbox, error) {
	switch {
	case len(req.MCP) > 0 && string(req.MCP) != "null":
		return api.CreateSandbox{}, badRequest("mcp: MCP gateways in sandboxes are not supported by SPACE")
	case len(req.VolumeMounts) > 0 && string(req.VolumeMounts) != "null" && string(req.VolumeMounts) != "[]":
		return api.CreateSandbox{}, badRequest("volumeMounts: volumes are not supported by SPACE")
	case len(req.IAM) > 0 && string(req.IAM) != "null":
		return api.CreateSandbox{}, badRequest("iam: IAM roles are not supported by SPACE")
	case req.AutoPauseMemory != nil && !*req.AutoPauseMemory:
		return api.CreateSandbox{}, badRequest("autoPauseMemory: SPACE always keeps memory when it pauses a sandbox")
	}
	timeout := int64(defaultTimeout)
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		return api.CreateSandbox{}, badRequest("timeout: %d seconds: want more than 0", timeout)
	}
	labels := map[string]string{}
	for k, v := range req.Metadata {
		if strings.HasPrefix(k, labelPrefix) {
			return api.CreateSandbox{}, badRequest("metadata key %q: the prefix %s is reserved", k, labelPrefix)
		}
		labels[k] = v
	}
	cr := api.CreateSandbox{
		Template: templateName(req.TemplateID), TimeoutSeconds: timeout,
		Env: req.EnvVars, OnTimeout: "delete",
	}
	// E2B starts a sandbox from a snapshot by giving its ID as the
	// template; SPACE's snapshot IDs cannot be template names.
	if strings.HasPrefix(req.TemplateID, snapshotIDPrefix) {
		cr.Template, cr.FromSnapshot = "", req.TemplateID
	}
	if req.AutoPause {
		cr.OnTimeout = "suspend"
	}
	if req.AutoResume != nil && req.AutoResume.Enabled {
		labels[labelAutoResume] = "true"
	}
	n, public, err := networkOf(req.AllowInternetAccess, req.Network)
	if err != nil {
		return api.CreateSandbox{}, err
	}
	cr.Network = n
	if cr.FromSnapshot != "" {
		// A copy of a snapshot has the snapshot's environment and network.
		if len(req.EnvVars) > 0 || req.Network != nil || req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
			return api.CreateSandbox{}, badRequest("template %s is a snapshot: a sandbox started from it keeps its envVars and network (set neither)", req.TemplateID)
		}
		cr.Env, cr.Network = nil, nil
	}
	if public {
		labels[labelPublic] = "true"
	}
	if len(labels) > 0 {
		cr.Labels = labels
	}
	return cr, nil
}

// networkOf maps E2B's network settings onto SPACE's allow-list. E2B
// allows everything unless told otherwise; SPACE's gateway allows by
// rule, and "all IPv4 addresses" (0.0.0.0/0) is what it can say of
// everything: names are reached through rules that name them (allowOut).
// public tells whether the sandbox's ports are open to anyone (E2B's
// default) rather than behind the traffic token.
func networkOf(internet *bool, n *networkConfig) (_ *api.Network, public bool, _ error) {
	allowAll := internet == nil || *internet
	var allow []string
	public = true
	if n != nil {
		if n.MaskRequestHost != nil {
			return nil, false, badRequest("network.maskRequestHost is not supported by SPACE")
		}
		public = n.AllowPublicTraffic == nil || *n.AllowPublicTraffic
		for _, d := range n.DenyOut {
			if d != "0.0.0.0/0" {
				return nil, false, badRequest("network.denyOut %q: SPACE's gateway allows by rule; deny everything (0.0.0.0/0) and allow what is needed with allowOut", d)
			}
			allowAll = false
		}
		allow = append(allow, n.AllowOut...)
	}
	if allowAll {
		allow = append([]string{"0.0.0.0/0"}, allow...)
	}
	return &api.Network{Allow: allow}, public, nil
}

// sandboxView is E2B's Sandbox (the reply of a create or connect).
type sandboxView struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// clientID is what E2B's deprecated clientID field says.
const clientID = "space"

func (s *Server) sandboxView(sb api.Sandbox) sandboxView {
	v := sandboxView{
		SandboxID: e2bID(sb.ID), TemplateID: e2bTemplate(sb.Template), Alias: e2bTemplate(sb.Template),
		ClientID: clientID, EnvdVersion: EnvdVersion, EnvdAccessToken: s.accessToken(sb.ID),
	}
	if !publicPorts(sb) {
		t := s.trafficToken(sb.ID)
		v.TrafficAccessToken = &t
	}
	if s.cfg.Domain != "" {
		d := s.cfg.Domain
		v.Domain = &d
	}
	return v
}

// e2bState is E2B's state of a SPACE sandbox: running, or paused (which
// E2B's connect resumes) for every state a resume continues from.
func e2bState(st string) string {
	if st == "running" {
		return "running"
	}
	return "paused"
}

// listedSandbox is E2B's ListedSandbox; detail adds SandboxDetail's
// fields.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	StartedAt   string            `json:"startedAt"`
	EndAt       string            `json:"endAt"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	started     time.Time
}

type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string         `json:"envdAccessToken"`
	Domain              *string        `json:"domain"`
	AllowInternetAccess *bool          `json:"allowInternetAccess"`
	Network             *networkConfig `json:"network,omitempty"`
	Lifecycle           struct {
		AutoResume bool   `json:"autoResume"`
		OnTimeout  string `json:"onTimeout"`
	} `json:"lifecycle"`
}

// farFuture is the end of a sandbox that has no timeout.
var farFuture = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

func listedOf(sb api.Sandbox) listedSandbox {
	end := farFuture
	if sb.ExpiresAt != nil {
		end = *sb.ExpiresAt
	}
	return listedSandbox{
		SandboxID: e2bID(sb.ID), TemplateID: e2bTemplate(sb.Template), Alias: e2bTemplate(sb.Template),
		ClientID: clientID, CPUCount: sb.VCPUs, MemoryMB: sb.MemoryMiB, DiskSizeMB: sb.DiskMiB,
		StartedAt: sb.CreatedAt.UTC().Format(time.RFC3339Nano), EndAt: end.UTC().Format(time.RFC3339Nano),
		EnvdVersion: EnvdVersion, Metadata: metadataOf(sb.Labels), State: e2bState(sb.State), started: sb.CreatedAt,
	}
}

func (s *Server) detailOf(sb api.Sandbox) sandboxDetail {
	d := sandboxDetail{listedSandbox: listedOf(sb), EnvdAccessToken: s.accessToken(sb.ID)}
	if s.cfg.Domain != "" {
		dom := s.cfg.Domain
		d.Domain = &dom
	}
	if sb.Network != nil {
		all := slices.Contains(sb.Network.Allow, "0.0.0.0/0")
		d.AllowInternetAccess = &all
		d.Network = &networkConfig{AllowOut: slices.DeleteFunc(slices.Clone(sb.Network.Allow), func(r string) bool { return r == "0.0.0.0/0" })}
		if !all {
			d.Network.DenyOut = []string{"0.0.0.0/0"}
		}
		if !publicPorts(sb) {
			f := false
			d.Network.AllowPublicTraffic = &f
		}
	}
	d.Lifecycle.AutoResume = sb.Labels[labelAutoResume] == "true"
	d.Lifecycle.OnTimeout = "kill"
	if sb.OnTimeout == "suspend" {
		d.Lifecycle.OnTimeout = "pause"
	}
	return d
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, c *client.Client) {
	sb, ok := pathSandboxInfo(w, r, c)
	if !ok {
		return
	}
	if sb.State == "deleted" || sb.State == "failed" {
		writeAPIError(w, notFound("sandbox %q not found", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, s.detailOf(sb))
}

// sandboxErr words SPACE's not-found as E2B's API does.
func sandboxErr(err error, r *http.Request) error {
	if client.IsNotFound(err) {
		return notFound("sandbox %q not found", r.PathValue("id"))
	}
	return err
}

// listed lists the team's sandboxes that E2B lists (not deleted or
// failed), in the states asked for, carrying the metadata asked for,
// newest first.
func listed(ctx context.Context, c *client.Client, states []string, metadata map[string]string) ([]listedSandbox, error) {
	var opts client.ListOptions
	opts.Labels = metadata
	all, err := c.Sandboxes(ctx, opts)
	if err != nil {
		return nil, err
	}
	var out []listedSandbox
	for _, sb := range all {
		switch sb.State {
		case "deleted", "failed", "deleting":
			continue
		}
		l := listedOf(sb)
		if len(states) > 0 && !slices.Contains(states, l.State) {
			continue
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b listedSandbox) int {
		if c := b.started.Compare(a.started); c != 0 {
			return c
		}
		return strings.Compare(a.SandboxID, b.SandboxID)
	})
	return out, nil
}

// parseMetadataFilter reads the metadata query parameter as E2B's API
// does: the SDK escapes each key and value, joins them as a query string
// and escapes that again, so the parameter is unescaped once, split into
// key=value pairs at & and =, and each of those unescaped.
func parseMetadataFilter(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	q, err := url.QueryUnescape(q)
	if err != nil {
		return nil, badRequest("metadata %.100q: %v", q, err)
	}
	m := map[string]string{}
	for _, kv := range strings.Split(q, "&") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.Contains(v, "=") {
			return nil, badRequest("metadata %.100q: want key=value pairs joined by &", q)
		}
		var err1, err2 error
		k, err1 = url.QueryUnescape(k)
		v, err2 = url.QueryUnescape(v)
		if err := errors.Join(err1, err2); err != nil {
			return nil, badRequest("metadata %.100q: %v", q, err)
		}
		m[k] = v
	}
	return m, nil
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request, c *client.Client) {
	md, err := parseMetadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		writeAPIError(w, err)
		return
	}
	out, err := listed(r.Context(), c, []string{"running"}, md)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(out))
}

// nonNil makes an empty list encode as [], not null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// maxPage is the most sandboxes one page lists.
const maxPage = 100

func (s *Server) listV2(w http.ResponseWriter, r *http.Request, c *client.Client) {
	q := r.URL.Query()
	md, err := parseMetadataFilter(q.Get("metadata"))
	if err != nil {
		writeAPIError(w, err)
		return
	}
	var states []string
	for _, v := range q["state"] {
		for st := range strings.SplitSeq(v, ",") {
			if st != "running" && st != "paused" {
				writeAPIError(w, badRequest("state %q: want running or paused", st))
				return
			}
			states = append(states, st)
		}
	}
	limit := maxPage
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxPage {
			writeAPIError(w, badRequest("limit %q: want 1 to %d", v, maxPage))
			return
		}
	}
	out, err := listed(r.Context(), c, states, md)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if t := q.Get("template"); t != "" {
		out = slices.DeleteFunc(out, func(l listedSandbox) bool { return l.TemplateID != t })
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeAPIError(w, badRequest("startedAfter %q: want an RFC 3339 time", v))
			return
		}
		out = slices.DeleteFunc(out, func(l listedSandbox) bool { return l.started.Before(t) })
	}
	asc := false
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		asc = true
		slices.SortStableFunc(out, func(a, b listedSandbox) int {
			if c := a.started.Compare(b.started); c != 0 {
				return c
			}
			return strings.Compare(a.SandboxID, b.SandboxID)
		})
	default:
		writeAPIError(w, badRequest("order %q: want asc or desc", q.Get("order")))
		return
	}
	if tok := q.Get("nextToken"); tok != "" {
		at, after, err := parseCursor(tok)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		out = slices.DeleteFunc(out, func(l listedSandbox) bool {
			next := l.started.Before(at)
			if asc {
				next = l.started.After(at)
			}
			return !(next || l.started.Equal(at) && l.SandboxID > after)
		})
	}
	if len(out) > limit {
		last := out[limit-1]
		w.Header().Set("X-Next-Token", base64.URLEncoding.EncodeToString([]byte(last.started.UTC().Format(time.RFC3339Nano)+"__"+last.SandboxID)))
		out = out[:limit]
	}
	writeJSON(w, http.StatusOK, nonNil(out))
}

func parseCursor(tok string) (time.Time, string, error) {
	b, err := base64.URLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", badRequest("nextToken: %v", err)
	}
	ts, id, ok := strings.Cut(string(b), "__")
	t, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return time.Time{}, "", badRequest("nextToken: not a token this server gave")
	}
	return t, id, nil
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, c *client.Client) {
	id, ok := pathSandbox(w, r)
	if !ok {
		return
	}
	if err := c.DeleteSandbox(r.Context(), id); err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	s.users.forget(id)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	id, ok := sandboxRequest(w, r, &req)
	if !ok {
		return
	}
	if req.Timeout == nil || *req.Timeout < 0 {
		writeAPIError(w, badRequest("timeout: want a number of seconds"))
		return
	}
	if _, err := c.SetTimeout(r.Context(), id, time.Duration(*req.Timeout)*time.Second); err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh is the older SDKs' keep-alive: extend the timeout to at least
// duration seconds from now (never shorten it).
func (s *Server) refresh(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req struct {
		Duration int64 `json:"duration"`
	}
	id, ok := sandboxRequest(w, r, &req)
	if !ok {
		return
	}
	if err := extend(r.Context(), c, id, time.Duration(cmp.Or(req.Duration, 60))*time.Second); err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend sets sandbox id's timeout to d from now unless it ends later
// already.
func extend(ctx context.Context, c *client.Client, id string, d time.Duration) error {
	sb, err := c.Sandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.ExpiresAt != nil && sb.ExpiresAt.After(time.Now().Add(d)) {
		return nil
	}
	_, err = c.SetTimeout(ctx, id, d)
	return err
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, c *client.Client) {
	sb, ok := pathSandboxInfo(w, r, c)
	if !ok {
		return
	}
	id := sb.ID
	if sb.State == "suspended" {
		writeAPIError(w, &statusError{http.StatusConflict, fmt.Sprintf("sandbox %q is already paused", r.PathValue("id"))})
		return
	}
	if _, err := c.SuspendSandbox(r.Context(), id); err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeTimeout is E2B's timeout of a resumed sandbox when none is given.
const resumeTimeout = 15

// wake resumes sandbox id if it does not run, and sets its timeout to
// timeout seconds from now (only ever longer for one that ran). It
// reports whether it resumed the sandbox.
func wake(ctx context.Context, c *client.Client, id string, timeout int64) (api.Sandbox, bool, error) {
	sb, err := c.Sandbox(ctx, id)
	if err != nil {
		return sb, false, err
	}
	d := time.Duration(timeout) * time.Second
	if sb.State == "running" {
		if err := extend(ctx, c, id, d); err != nil {
			return sb, false, err
		}
		sb, err = c.Sandbox(ctx, id)
		return sb, false, err
	}
	if sb, err = c.ResumeSandbox(ctx, id); err != nil {
		return sb, false, err
	}
	sb, err = c.SetTimeout(ctx, id, d)
	return sb, true, err
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req struct {
		Timeout *int64 `json:"timeout"`
		Memory  *bool  `json:"memory"`
	}
	id, ok := sandboxRequest(w, r, &req)
	if !ok {
		return
	}
	if req.Memory != nil && !*req.Memory {
		writeAPIError(w, badRequest("memory: SPACE always resumes a sandbox with its memory"))
		return
	}
	timeout := int64(defaultTimeout)
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	sb, resumed, err := wake(r.Context(), c, id, timeout)
	if err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandboxView(sb))
}

// resume is the older SDKs' resume of a paused sandbox (409 if it runs).
func (s *Server) resume(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req struct {
		Timeout   *int64 `json:"timeout"`
		AutoPause *bool  `json:"autoPause"`
	}
	id, ok := sandboxRequest(w, r, &req)
	if !ok {
		return
	}
	sb, err := c.Sandbox(r.Context(), id)
	if err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	if sb.State == "running" {
		writeAPIError(w, &statusError{http.StatusConflict, fmt.Sprintf("sandbox %q is already running", r.PathValue("id"))})
		return
	}
	timeout := int64(resumeTimeout)
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	sb, _, err = wake(r.Context(), c, id, timeout)
	if err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxView(sb))
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	id, ok := sandboxRequest(w, r, &req)
	if !ok {
		return
	}
	n := 1
	if req.Count != nil {
		n = *req.Count
	}
	forks, err := c.ForkSandbox(r.Context(), id, n)
	if err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	type result struct {
		Sandbox *sandboxView `json:"sandbox,omitempty"`
		Error   *apiError    `json:"error,omitempty"`
	}
	out := make([]result, 0, len(forks))
	for _, f := range forks {
		if req.Timeout != nil && *req.Timeout > 0 {
			if sb, err := c.SetTimeout(r.Context(), f.ID, time.Duration(*req.Timeout)*time.Second); err == nil {
				f = sb
			} else {
				s.cfg.Log.Warn("e2b: set the timeout of a fork", "sandbox_id", f.ID, "err", err)
			}
		}
		v := s.sandboxView(f)
		out = append(out, result{Sandbox: &v})
	}
	writeJSON(w, http.StatusCreated, out)
}

type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotOf(sn api.Snapshot) snapshotInfo {
	names := []string{}
	if sn.Name != "" {
		names = append(names, sn.Name)
	}
	return snapshotInfo{SnapshotID: sn.ID, Names: names}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req struct {
		Name string `json:"name"`
	}
	id, ok := sandboxRequest(w, r, &req)
	if !ok {
		return
	}
	sn, err := c.CreateSnapshot(r.Context(), id, req.Name)
	if err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	writeJSON(w, http.StatusCreated, snapshotOf(sn))
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, c *client.Client) {
	q := r.URL.Query()
	var sandbox string
	if v := q.Get("sandboxID"); v != "" {
		id, ok := spaceID(v)
		if !ok {
			writeJSON(w, http.StatusOK, []snapshotInfo{})
			return
		}
		sandbox = id
	}
	sns, err := c.Snapshots(r.Context(), sandbox)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	out := []snapshotInfo{}
	for _, sn := range sns {
		if name := q.Get("name"); name != "" && sn.Name != name {
			continue
		}
		out = append(out, snapshotOf(sn))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot deletes a snapshot (E2B's snapshots are templates, and
// deleted as such); SPACE's templates are not deleted here.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, c *client.Client) {
	ref := r.PathValue("id")
	if err := c.DeleteSnapshot(r.Context(), ref); err != nil {
		if client.IsNotFound(err) {
			err = notFound("snapshot %q not found", ref)
		}
		writeAPIError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req struct {
		AllowInternetAccess *bool `json:"allow_internet_access"`
		networkConfig
	}
	id, ok := sandboxRequest(w, r, &req)
	if !ok {
		return
	}
	if req.AllowPublicTraffic != nil {
		writeAPIError(w, badRequest("allowPublicTraffic is set when the sandbox is created"))
		return
	}
	n, _, err := networkOf(req.AllowInternetAccess, &req.networkConfig)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if _, err := c.SetNetwork(r.Context(), id, *n); err != nil {
		writeAPIError(w, sandboxErr(err, r))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
