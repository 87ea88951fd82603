package e2b

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/errkind"
)

// noSandboxes finds no sandbox: the tests below never reach one.
type noSandboxes struct{}

func (noSandboxes) SandboxByID(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, fmt.Errorf("no sandboxes here: %w", errkind.NotFound)
}

func newTestServer(t *testing.T, domain string) *Server {
	t.Helper()
	s, err := New(Config{API: "http://127.0.0.1:1", Sandboxes: noSandboxes{}, Secret: []byte("0123456789abcdef"), Domain: domain})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewRefusesBadConfig(t *testing.T) {
	good := Config{API: "http://127.0.0.1:1", Sandboxes: noSandboxes{}, Secret: []byte("0123456789abcdef")}
	for name, edit := range map[string]func(*Config){
		"no API":       func(c *Config) { c.API = "" },
		"bad API":      func(c *Config) { c.API = "ftp://x" },
		"no sandboxes": func(c *Config) { c.Sandboxes = nil },
		"short secret": func(c *Config) { c.Secret = []byte("short") },
		"bad domain":   func(c *Config) { c.Domain = "http://x.test" },
	} {
		cfg := good
		edit(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New = nil error", name)
		}
	}
}

// TestRouting checks which requests go to envd, to a port, or to the API.
func TestRouting(t *testing.T) {
	s := newTestServer(t, "e2b.test")
	for _, tc := range []struct {
		host    string
		headers map[string]string
		id      string
		port    int
		sandbox bool
	}{
		{host: "api.e2b.test", sandbox: false},
		{host: "e2b.test", sandbox: false},
		{host: "127.0.0.1:3000", sandbox: false},
		{host: "49983-abc123.e2b.test", id: "abc123", port: EnvdPort, sandbox: true},
		{host: "8080-abc123.E2B.test:443", id: "abc123", port: 8080, sandbox: true},
		{host: "99999-abc.e2b.test", id: "abc", port: 0, sandbox: true},
		{host: "x-abc.e2b.test", id: "abc", port: 0, sandbox: true},
		{host: "a.b.e2b.test", sandbox: false},
		{host: "127.0.0.1", headers: map[string]string{"E2b-Sandbox-Id": "abc"}, id: "abc", port: EnvdPort, sandbox: true},
		{host: "127.0.0.1", headers: map[string]string{"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "3000"}, id: "abc", port: 3000, sandbox: true},
		{host: "e2b.test", headers: map[string]string{"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "nope"}, id: "abc", port: 0, sandbox: true},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = tc.host
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		id, port, ok := s.sandboxTarget(r)
		if ok != tc.sandbox || id != tc.id || port != tc.port {
			t.Errorf("host %q headers %v: (%q, %d, %v), want (%q, %d, %v)", tc.host, tc.headers, id, port, ok, tc.id, tc.port, tc.sandbox)
		}
	}
}

func TestIDs(t *testing.T) {
	if id, ok := spaceID("abc234xyz"); !ok || id != "sbx_abc234xyz" || e2bID(id) != "abc234xyz" {
		t.Errorf("spaceID(abc234xyz) = %q, %v", id, ok)
	}
	for _, bad := range []string{"", "ABC", "sbx_abc", "a-b", "a/b", strings.Repeat("a", 65)} {
		if _, ok := spaceID(bad); ok {
			t.Errorf("spaceID(%q) accepted", bad)
		}
	}
}

// TestAccessTokens checks that tokens are bound to a sandbox and the
// secret, and that unauthenticated envd calls are refused before a
// sandbox is looked up.
func TestAccessTokens(t *testing.T) {
	s := newTestServer(t, "")
	other, _ := New(Config{API: "http://127.0.0.1:1", Sandboxes: noSandboxes{}, Secret: []byte("another secret!!")})
	tok := s.accessToken("sbx_a")
	switch {
	case !s.validToken("sbx_a", tok):
		t.Error("a sandbox's own token is refused")
	case s.validToken("sbx_b", tok):
		t.Error("a token opens another sandbox")
	case other.validToken("sbx_a", tok):
		t.Error("a token made with another secret is accepted")
	case s.validToken("sbx_a", ""):
		t.Error("no token is accepted")
	}
	for _, path := range []string{"/process.Process/List", "/files?path=/etc/hostname", "/filesystem.Filesystem/Stat"} {
		r := httptest.NewRequest("POST", path, strings.NewReader("{}"))
		r.Header.Set("E2b-Sandbox-Id", "a")
		r.Header.Set("X-Access-Token", "spe2b_forged")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != http.StatusUnauthorized {
			t.Errorf("POST %s with a forged token = %d %s, want 401", path, w.Code, w.Body)
		}
	}
	// The health check needs the token too (E2B's SDKs send it), and then
	// says an unknown sandbox is gone.
	health := func(token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Header.Set("E2b-Sandbox-Id", "a")
		if token != "" {
			r.Header.Set("X-Access-Token", token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	if w := health(""); w.Code != http.StatusUnauthorized {
		t.Errorf("GET /health without a token = %d %s, want 401", w.Code, w.Body)
	}
	w := health(s.accessToken("sbx_a"))
	var gone struct {
		SandboxID, Message string
		Code               int
	}
	json.Unmarshal(w.Body.Bytes(), &gone)
	if w.Code != http.StatusBadGateway || gone.Code != 502 || gone.SandboxID != "a" || gone.Message != "The sandbox was not found" {
		t.Errorf("GET /health of an unknown sandbox = %d %s", w.Code, w.Body)
	}
}

// TestSignatures checks signed /files URLs as E2B's SDK makes them.
func TestSignatures(t *testing.T) {
	s := newTestServer(t, "")
	sign := func(path, op, user string, exp int64) url.Values {
		raw := path + ":" + op + ":" + user + ":" + s.accessToken("sbx_a")
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		sum := sha256.Sum256([]byte(raw))
		q.Set("signature", "v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
		return q
	}
	check := func(method string, q url.Values) error {
		return s.checkSignature(httptest.NewRequest(method, "/files?"+q.Encode(), nil), "sbx_a")
	}
	future := time.Now().Add(time.Hour).Unix()
	if err := check("GET", sign("/a.txt", "read", "", 0)); err != nil {
		t.Errorf("a read signature: %v", err)
	}
	if err := check("POST", sign("/a.txt", "write", "user", future)); err != nil {
		t.Errorf("a write signature with an expiry: %v", err)
	}
	for name, q := range map[string]url.Values{
		"a read signature used to write": sign("/a.txt", "read", "", 0),
		"expired":                        sign("/a.txt", "write", "", time.Now().Add(-time.Minute).Unix()),
	} {
		if err := check("POST", q); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	q := sign("/a.txt", "read", "", 0)
	q.Set("path", "/etc/shadow")
	if err := check("GET", q); err == nil {
		t.Error("a signature for another path: accepted")
	}
	q = sign("/a.txt", "read", "", future)
	q.Set("signature_expiration", strconv.FormatInt(future+3600, 10))
	if err := check("GET", q); err == nil {
		t.Error("a signature with its expiry moved: accepted")
	}
}

// TestConnectStream checks the envelopes of a server-streaming call.
func TestConnectStream(t *testing.T) {
	w := httptest.NewRecorder()
	st := newStream(w)
	st.Send(map[string]int{"a": 1})
	st.End(newRPCError("not_found", "gone"))
	if err := st.Send(map[string]int{"b": 2}); err == nil {
		t.Error("Send after End = nil error")
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/connect+json" || w.Code != 200 {
		t.Errorf("stream answered %d %q", w.Code, ct)
	}
	var frames []string
	var flags []byte
	b := w.Body.Bytes()
	for len(b) >= 5 {
		n := binary.BigEndian.Uint32(b[1:5])
		flags = append(flags, b[0])
		frames = append(frames, string(b[5:5+n]))
		b = b[5+n:]
	}
	want := []string{`{"a":1}`, `{"error":{"code":"not_found","message":"gone"}}`}
	if fmt.Sprint(frames) != fmt.Sprint(want) || fmt.Sprint(flags) != fmt.Sprint([]byte{0, 2}) || len(b) != 0 {
		t.Errorf("frames %q flags %v rest %d, want %q flags [0 2]", frames, flags, len(b), want)
	}

	// A request envelope, and refusals of what is not Connect JSON.
	env := func(flag byte, msg string) io.Reader {
		var h [5]byte
		h[0] = flag
		binary.BigEndian.PutUint32(h[1:], uint32(len(msg)))
		return io.MultiReader(bytes.NewReader(h[:]), strings.NewReader(msg))
	}
	var got struct{ Path string }
	r := httptest.NewRequest("POST", "/", env(0, `{"path":"/x"}`))
	r.Header.Set("Content-Type", "application/connect+json")
	if err := readStreamRequest(r, &got); err != nil || got.Path != "/x" {
		t.Errorf("readStreamRequest = %+v, %v", got, err)
	}
	for name, tc := range map[string]struct {
		ct   string
		body io.Reader
		code string
	}{
		"binary protobuf": {"application/connect+proto", env(0, "x"), "unimplemented"},
		"compressed":      {"application/connect+json", env(1, "x"), "unimplemented"},
		"truncated":       {"application/connect+json", strings.NewReader("\x00\x00\x00\x00\x09{}"), "invalid_argument"},
		"huge":            {"application/connect+json", strings.NewReader("\x00\xff\xff\xff\xff"), "resource_exhausted"},
		"bad JSON":        {"application/connect+json", env(0, "{"), "invalid_argument"},
	} {
		r := httptest.NewRequest("POST", "/", tc.body)
		r.Header.Set("Content-Type", tc.ct)
		if err := readStreamRequest(r, &got); rpcErrorOf(err).Code != tc.code {
			t.Errorf("%s: readStreamRequest = %v, want code %s", name, err, tc.code)
		}
	}
}

func TestRPCErrors(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   string
		status int
	}{
		{&client.Error{Status: 404, Code: api.CodeNotFound, Message: "no"}, "not_found", 404},
		{&client.Error{Status: 409, Code: api.CodeConflict}, "already_exists", 409},
		{&client.Error{Status: 409, Code: api.CodeFailedPrecondition}, "failed_precondition", 400},
		{&client.Error{Status: 413, Code: api.CodeTooLarge}, "resource_exhausted", 429},
		{fmt.Errorf("x: %w", errkind.InvalidArgument), "invalid_argument", 400},
		{context.DeadlineExceeded, "deadline_exceeded", 504},
		{fmt.Errorf("plain"), "internal", 500},
	} {
		re := rpcErrorOf(tc.err)
		if re.Code != tc.code || httpStatusOf(re.Code) != tc.status {
			t.Errorf("rpcErrorOf(%v) = %s (HTTP %d), want %s (HTTP %d)", tc.err, re.Code, httpStatusOf(re.Code), tc.code, tc.status)
		}
	}
}

func TestEndEvents(t *testing.T) {
	for _, tc := range []struct {
		exit api.Exit
		want string
	}{
		{api.Exit{Code: 0}, `{"exitCode":0,"exited":true,"status":"exit status 0"}`},
		{api.Exit{Code: 3}, `{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}`},
		{api.Exit{Code: 137, Signal: 9}, `{"exitCode":-1,"exited":false,"status":"signal: killed","error":"signal: killed"}`},
	} {
		b, _ := json.Marshal(endOf(tc.exit))
		if string(b) != tc.want {
			t.Errorf("endOf(%+v) = %s, want %s", tc.exit, b, tc.want)
		}
	}
}

func TestMetadataFilter(t *testing.T) {
	// As E2B's SDK sends it: each key and value escaped, the pairs joined
	// as a query string (which escapes the escapes).
	want := map[string]string{"user id": "a&b=c", "k": "v"}
	pairs := url.Values{}
	for k, v := range want {
		pairs.Set(url.PathEscape(k), url.QueryEscape(v))
	}
	got, err := parseMetadataFilter(pairs.Encode())
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseMetadataFilter(%q) = %v, %v; want %v", pairs.Encode(), got, err, want)
	}
	for _, bad := range []string{"novalue", "a=b=c", "%zz=1"} {
		if _, err := parseMetadataFilter(bad); err == nil {
			t.Errorf("parseMetadataFilter(%q) = nil error", bad)
		}
	}
}

func TestCreateRequest(t *testing.T) {
	s := newTestServer(t, "")
	f, ten := false, int64(10)
	cr, err := s.createRequest(newSandbox{TemplateID: "base", Timeout: &ten, Metadata: map[string]string{"a": "b"},
		EnvVars: map[string]string{"X": "1"}, AutoPause: true,
		Network: &networkConfig{AllowOut: []string{"pypi.org"}, AllowPublicTraffic: &f}})
	if err != nil {
		t.Fatal(err)
	}
	if cr.Template != "default" || cr.TimeoutSeconds != 10 || cr.OnTimeout != "suspend" || cr.Env["X"] != "1" ||
		cr.Labels["a"] != "b" || cr.Labels[labelPublic] != "" ||
		fmt.Sprint(cr.Network.Allow) != "[0.0.0.0/0 pypi.org]" {
		t.Errorf("createRequest = %+v (network %+v)", cr, cr.Network)
	}
	cr, _ = s.createRequest(newSandbox{TemplateID: "mine", AllowInternetAccess: &f})
	if cr.Template != "mine" || cr.TimeoutSeconds != defaultTimeout || len(cr.Network.Allow) != 0 || cr.Labels[labelPublic] != "true" {
		t.Errorf("createRequest(no internet) = %+v", cr)
	}
	for name, req := range map[string]newSandbox{
		"mcp":          {MCP: json.RawMessage(`{"x":{}}`)},
		"volumes":      {VolumeMounts: json.RawMessage(`[{"name":"v","path":"/v"}]`)},
		"denyOut":      {Network: &networkConfig{DenyOut: []string{"10.0.0.0/8"}}},
		"reserved key": {Metadata: map[string]string{labelPublic: "true"}},
		"zero timeout": {Timeout: new(int64)},
		"disk-only":    {AutoPauseMemory: &f},
		"masked host":  {Network: &networkConfig{MaskRequestHost: new(string)}},
	} {
		if _, err := s.createRequest(req); err == nil {
			t.Errorf("%s: createRequest = nil error", name)
		}
	}
}

func TestAPIKeyRequired(t *testing.T) {
	s := newTestServer(t, "")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/v2/sandboxes", nil))
	var e apiError
	json.Unmarshal(w.Body.Bytes(), &e)
	if w.Code != 401 || e.Code != 401 || e.Message == "" {
		t.Errorf("GET /v2/sandboxes without a key = %d %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/templates", nil))
	if w.Code != 404 {
		t.Errorf("GET /templates = %d %s, want 404", w.Code, w.Body)
	}
}

// fakePlane is a SPACE data plane of one sandbox, sbx_abc, that answers
// file watches with the events sent on its channel, lists two processes
// (pid 7 tagged "sink" and pid 8), passes what is written to their stdin to
// its stdin channel, and nothing else.
type fakePlane struct {
	srv    *httptest.Server
	labels map[string]string // of sbx_abc
	events chan api.FileEvent
	stdin  chan string
}

func newFakePlane(t *testing.T) *fakePlane {
	f := &fakePlane{events: make(chan api.FileEvent, 16), stdin: make(chan string, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/sbx_abc/processes", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.ProcessList{Processes: []api.Process{
			{ID: 1, PID: 7, Tag: "sink", Running: true}, {ID: 2, PID: 8, Running: true}}})
	})
	mux.HandleFunc("POST /v1/sandboxes/sbx_abc/processes/{pid}/stdin", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.stdin <- r.PathValue("pid") + ":" + string(b)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/sandboxes/sbx_abc/files/watch", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sdp1_token" || r.URL.Query().Get("path") != "/tmp/w" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error":{"code":"not_found","message":"no such directory"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.FileEvent{Type: api.FileEventStart, Path: r.URL.Query().Get("path")})
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case ev := <-f.events:
				enc.Encode(ev)
				w.(http.Flusher).Flush()
			}
		}
	})
	mux.HandleFunc("GET /v1/sandboxes/sbx_abc/ports/8000/http/{path...}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sdp1_token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Space-Port", "8000")
		fmt.Fprintf(w, "page %s", r.PathValue("path"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"code":"not_found","message":"no such path"}}`)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakePlane) SandboxByID(_ context.Context, id string) (api.Sandbox, error) {
	if id != "sbx_abc" {
		return api.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errkind.NotFound)
	}
	return api.Sandbox{ID: id, State: "running", Labels: f.labels,
		DataPlane: &api.DataPlane{URL: f.srv.URL, Token: "sdp1_token", ExpiresAt: time.Now().Add(time.Hour)}}, nil
}

// TestPortAccess checks who reaches a sandbox's port through the facade:
// anyone only when its ports were made public, otherwise only a caller
// with its traffic or access token; never with another sandbox's tokens.
func TestPortAccess(t *testing.T) {
	plane := newFakePlane(t)
	s, err := New(Config{API: plane.srv.URL, Sandboxes: plane, Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	get := func(headers map[string]string) (int, string) {
		r := httptest.NewRequest("GET", "/index.html", nil)
		r.Header.Set("E2b-Sandbox-Id", "abc")
		r.Header.Set("E2b-Sandbox-Port", "8000")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	for _, tc := range []struct {
		name    string
		labels  map[string]string
		headers map[string]string
		want    int
	}{
		{"made elsewhere, no credentials", nil, nil, http.StatusForbidden},
		{"made elsewhere, private label false", map[string]string{labelPublic: "false"}, nil, http.StatusForbidden},
		{"made elsewhere, a forged traffic token", nil, map[string]string{trafficTokenHeader: "spe2bt_00"}, http.StatusForbidden},
		{"made elsewhere, another sandbox's traffic token", nil, map[string]string{trafficTokenHeader: s.trafficToken("sbx_abd")}, http.StatusForbidden},
		{"made elsewhere, another sandbox's access token", nil, map[string]string{"X-Access-Token": s.accessToken("sbx_abd")}, http.StatusForbidden},
		{"made elsewhere, a SPACE key as bearer", nil, map[string]string{"Authorization": "Bearer sdp1_token"}, http.StatusForbidden},
		{"its traffic token", nil, map[string]string{trafficTokenHeader: s.trafficToken("sbx_abc")}, http.StatusOK},
		{"its access token", nil, map[string]string{"X-Access-Token": s.accessToken("sbx_abc")}, http.StatusOK},
		{"public", map[string]string{labelPublic: "true"}, nil, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plane.labels = tc.labels
			code, body := get(tc.headers)
			if code != tc.want {
				t.Fatalf("GET port 8000 = %d %s, want %d", code, body, tc.want)
			}
			if code == http.StatusOK && body != "page index.html" {
				t.Errorf("GET port 8000 = %q, want the page", body)
			}
		})
	}
	// The create reply hands out the traffic token only where it is needed.
	if v := s.sandboxView(api.Sandbox{ID: "sbx_abc"}); v.TrafficAccessToken == nil || *v.TrafficAccessToken != s.trafficToken("sbx_abc") {
		t.Errorf("sandboxView(private) traffic token = %v", v.TrafficAccessToken)
	}
	if v := s.sandboxView(api.Sandbox{ID: "sbx_abc", Labels: map[string]string{labelPublic: "true"}}); v.TrafficAccessToken != nil {
		t.Errorf("sandboxView(public) traffic token = %v, want none", *v.TrafficAccessToken)
	}
}

// TestWatchers drives the polling watchers (CreateWatcher,
// GetWatcherEvents, RemoveWatcher) against a fake data plane: the real
// watch under them is tested with real VMs in tests/e2b.
func TestWatchers(t *testing.T) {
	plane := newFakePlane(t)
	s, err := New(Config{API: plane.srv.URL, Sandboxes: plane, Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	call := func(method string, body any, out any) int {
		t.Helper()
		b, _ := json.Marshal(body)
		r := httptest.NewRequest("POST", "/filesystem.Filesystem/"+method, bytes.NewReader(b))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("E2b-Sandbox-Id", "abc")
		r.Header.Set("X-Access-Token", s.accessToken("sbx_abc"))
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if out != nil {
			json.Unmarshal(w.Body.Bytes(), out)
		}
		return w.Code
	}
	var created struct{ WatcherID string }
	if code := call("CreateWatcher", map[string]any{"path": "/tmp/w", "recursive": true}, &created); code != 200 || created.WatcherID == "" {
		t.Fatalf("CreateWatcher = %d %+v", code, created)
	}
	plane.events <- api.FileEvent{Type: api.FileEventCreate, Path: "/tmp/w/a.txt", Name: "a.txt"}
	plane.events <- api.FileEvent{Type: api.FileEventRemove, Path: "/tmp/w/d/b", Name: "d/b"}
	var got []filesystemEvent
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var evs struct{ Events []filesystemEvent }
		if code := call("GetWatcherEvents", map[string]string{"watcherId": created.WatcherID}, &evs); code != 200 {
			t.Fatalf("GetWatcherEvents = %d", code)
		}
		got = append(got, evs.Events...)
	}
	want := []filesystemEvent{{Name: "a.txt", Type: "EVENT_TYPE_CREATE"}, {Name: "d/b", Type: "EVENT_TYPE_REMOVE"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %+v, want %+v", got, want)
	}
	if code := call("RemoveWatcher", map[string]string{"watcherId": created.WatcherID}, nil); code != 200 {
		t.Errorf("RemoveWatcher = %d", code)
	}
	var e rpcError
	if code := call("GetWatcherEvents", map[string]string{"watcherId": created.WatcherID}, &e); code != 404 || e.Code != "not_found" {
		t.Errorf("GetWatcherEvents after RemoveWatcher = %d %+v", code, e)
	}
	if code := call("CreateWatcher", map[string]any{"path": "/nope"}, &e); code != 404 {
		t.Errorf("CreateWatcher(/nope) = %d %+v", code, e)
	}
}

func TestParseMetrics(t *testing.T) {
	out := `cpu  100 0 50 800 50 0 0 0 0 0
cpu  130 0 60 850 60 0 0 0 0 0
MemTotal:         501236 kB
MemAvailable:     401236 kB
Cached:            51200 kB
overlay 1023303680 52428800 970874880 6% /
2
`
	m, err := parseMetrics(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	// 40 busy of 100 jiffies.
	want := metric{CPUCount: 2, CPUUsedPct: 40, MemTotal: 501236 << 10, MemUsed: 100000 << 10, MemCache: 51200 << 10,
		DiskTotal: 1023303680, DiskUsed: 52428800}
	if m != want {
		t.Errorf("parseMetrics = %+v, want %+v", m, want)
	}
	if _, err := parseMetrics(strings.NewReader("nothing\n")); err == nil {
		t.Error("parseMetrics(nothing) = nil error")
	}
}

// TestStreamInputH2 streams input over HTTP/2, the way envd's clients do
// it: each message reaches the process while the call is still open.
func TestStreamInputH2(t *testing.T) {
	plane := newFakePlane(t)
	s, err := New(Config{API: plane.srv.URL, Sandboxes: plane, Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(s)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	envelope := func(msg string) []byte {
		b := make([]byte, 5, 5+len(msg))
		binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
		return append(b, msg...)
	}
	call := func(body io.Reader) (*http.Response, error) {
		r, _ := http.NewRequest("POST", srv.URL+"/process.Process/StreamInput", body)
		r.Header.Set("Content-Type", "application/connect+json")
		r.Header.Set("E2b-Sandbox-Id", "abc")
		r.Header.Set("X-Access-Token", s.accessToken("sbx_abc"))
		return srv.Client().Do(r)
	}
	pr, pw := io.Pipe()
	type result struct {
		frames []byte
		proto  string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := call(pr)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{b, resp.Proto, err}
	}()
	pw.Write(envelope(`{"start":{"process":{"tag":"sink"}}}`))
	pw.Write(envelope(`{"data":{"input":{"stdin":"` + base64.StdEncoding.EncodeToString([]byte("one")) + `"}}}`))
	select {
	case got := <-plane.stdin:
		if got != "1:one" {
			t.Errorf("first input reached %q, want process 1 (tag sink) to get %q", got, "one")
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the first input did not arrive while the call was open")
	}
	pw.Write(envelope(`{"keepalive":{}}`))
	pw.Write(envelope(`{"data":{"input":{"pty":"` + base64.StdEncoding.EncodeToString([]byte("two")) + `"}}}`))
	pw.Close()
	res := <-done
	if res.err != nil || res.proto != "HTTP/2.0" {
		t.Fatalf("StreamInput = %s, %v", res.proto, res.err)
	}
	if got := <-plane.stdin; got != "1:two" {
		t.Errorf("second input %q, want %q", got, "1:two")
	}
	if want := string(append(envelope("{}"), append([]byte{2}, envelope("{}")[1:]...)...)); string(res.frames) != want {
		t.Errorf("reply %q, want an empty message and an empty end", res.frames)
	}

	// Refusals end the stream with the error.
	for name, tc := range map[string]struct{ body, code string }{
		"input first": {`{"data":{"input":{"stdin":"eA=="}}}`, "invalid_argument"},
		"unknown tag": {`{"start":{"process":{"tag":"nope"}}}`, "not_found"},
		"two starts":  {`{"start":{"process":{"pid":8}}}` + "\x00" + `{"start":{"process":{"pid":8}}}`, "invalid_argument"},
		"no selector": {`{"start":{}}`, "invalid_argument"},
	} {
		var body []byte
		for _, m := range strings.Split(tc.body, "\x00") {
			body = append(body, envelope(m)...)
		}
		resp, err := call(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var end struct{ Error rpcError }
		if len(b) < 5 || b[0] != 2 || json.Unmarshal(b[5:], &end) != nil || end.Error.Code != tc.code {
			t.Errorf("%s: reply %q, want an end with code %s", name, b, tc.code)
		}
	}
}

// TestWatchTranslation: a SPACE write (a temporary file renamed over the
// target) shows as envd's in-place write, and the temporary file's own
// events are left out.
func TestWatchTranslation(t *testing.T) {
	tr := translator{}
	var got []string
	for _, ev := range []api.FileEvent{
		{Type: api.FileEventCreate, Name: "d/.f.txt.space-tmp-123"},
		{Type: api.FileEventWrite, Name: "d/.f.txt.space-tmp-123"},
		{Type: api.FileEventRename, Name: "d/.f.txt.space-tmp-123"},
		{Type: api.FileEventCreate, Name: "d/f.txt"},
		{Type: api.FileEventCreate, Name: "other"},
		{Type: api.FileEventCreate, Name: ".g.space-tmp-9"},
		{Type: api.FileEventRemove, Name: ".g.space-tmp-9"},
		{Type: api.FileEventCreate, Name: "g"},
		{Type: api.FileEventCreate, Name: ".h.space-tmp-x"}, // not SPACE's pattern: a user's file
	} {
		fes, err := tr.events(ev)
		if err != nil {
			t.Fatal(err)
		}
		for _, fe := range fes {
			got = append(got, fe.Type+" "+fe.Name)
		}
	}
	want := []string{"EVENT_TYPE_CREATE d/f.txt", "EVENT_TYPE_WRITE d/f.txt", "EVENT_TYPE_CREATE other", "EVENT_TYPE_CREATE g", "EVENT_TYPE_CREATE .h.space-tmp-x"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if _, err := tr.events(api.FileEvent{Type: api.FileEventOverflow}); err == nil {
		t.Error("overflow: nil error")
	}
}
