package workerproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/origin"
	"space/internal/sandbox"
)

// fake is a Service that answers from its arguments, counts calls, and
// can hang until the call's context ends or fail every call.
type fake struct {
	hang bool
	err  error // returned by every call, or nil

	mu sync.Mutex
	// +checklocks:mu
	calls map[string]int
	// +checklocks:mu
	origin origin.Origin // of the last call
}

func (f *fake) do(ctx context.Context, name string) error {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[name]++
	f.origin = origin.From(ctx)
	f.mu.Unlock()
	if f.hang {
		<-ctx.Done()
		return fmt.Errorf("fake %s: %w", name, ctx.Err())
	}
	return f.err
}

func (f *fake) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func info(id string) Info {
	return Info{ID: id, Team: "t", State: sandbox.Running, Spec: Spec{Template: "default", VCPUs: 1, MemoryMiB: 256},
		VM: &api.VMInfo{VMM: "qemu", StartedBy: "boot"}}
}

func (f *fake) Status(ctx context.Context) (Status, error) {
	return Status{ID: "w1", Protocol: Version, VCPUs: 4, Capabilities: Capabilities{VMM: "qemu", Accel: "tcg", NICs: []string{NICSocket}}},
		f.do(ctx, "Status")
}
func (f *fake) Sandbox(ctx context.Context, id string) (Info, error) {
	return info(id), f.do(ctx, "Sandbox")
}
func (f *fake) List(ctx context.Context) ([]Info, error) {
	return []Info{info("a"), info("b")}, f.do(ctx, "List")
}
func (f *fake) SnapshotInfo(ctx context.Context, id string) (SnapshotInfo, error) {
	return SnapshotInfo{ID: id, SandboxID: "a", Created: time.Unix(1, 0).UTC()}, f.do(ctx, "SnapshotInfo")
}
func (f *fake) Usage(ctx context.Context, id string, req UsageRequest) (api.SandboxMetrics, error) {
	return api.SandboxMetrics{SandboxID: id, IntervalSeconds: 5, Samples: []api.UsageSample{{Time: req.Start, CPUs: 1}}}, f.do(ctx, "Usage")
}
func (f *fake) Create(ctx context.Context, req CreateRequest) (Info, error) {
	inf := info(req.ID)
	inf.Spec = req.Spec
	return inf, f.do(ctx, "Create")
}
func (f *fake) Pause(ctx context.Context, id string) (Info, error) {
	inf := info(id)
	inf.State = sandbox.Paused
	return inf, f.do(ctx, "Pause")
}
func (f *fake) Resume(ctx context.Context, id string) (Info, error) {
	return info(id), f.do(ctx, "Resume")
}
func (f *fake) Delete(ctx context.Context, id string) error { return f.do(ctx, "Delete") }
func (f *fake) Snapshot(ctx context.Context, id string, req SnapshotRequest) (SnapshotInfo, error) {
	return SnapshotInfo{ID: req.SnapshotID, SandboxID: id, Created: time.Unix(2, 0).UTC()}, f.do(ctx, "Snapshot")
}
func (f *fake) Restore(ctx context.Context, id, snapshotID string) (Info, error) {
	inf := info(id)
	inf.Error = "restored from " + snapshotID
	return inf, f.do(ctx, "Restore")
}
func (f *fake) DeleteSnapshot(ctx context.Context, id string) error {
	return f.do(ctx, "DeleteSnapshot")
}
func (f *fake) SetNetwork(ctx context.Context, id string, n Network) (Info, error) {
	inf := info(id)
	inf.Spec.Network = &n
	return inf, f.do(ctx, "SetNetwork")
}
func (f *fake) SetSecrets(ctx context.Context, id string, req SecretsRequest) (Info, error) {
	inf := info(id)
	inf.Spec.Secrets = req.Secrets
	return inf, f.do(ctx, "SetSecrets")
}
func (f *fake) Lease(ctx context.Context, req LeaseRequest) (LeaseReply, error) {
	return LeaseReply{Epoch: req.Epoch, Removed: []string{"gone"}}, f.do(ctx, "Lease")
}
func (f *fake) EgressLog(ctx context.Context, id string) (string, io.ReadCloser, error) {
	if err := f.do(ctx, "EgressLog"); err != nil {
		return "", nil, err
	}
	return "log-" + id, io.NopCloser(strings.NewReader(`{"event":1}` + "\n")), nil
}

// serve serves s's verbs over TLS and returns a client of them.
func serve(t *testing.T, s Service, cfg Config) (*Client, *httptest.Server) {
	t.Helper()
	mux := http.NewServeMux()
	Mount(mux, s, nil)
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	if cfg.ID == "" {
		cfg.ID = "w1"
	}
	tlsCfg := srv.Client().Transport.(*http.Transport).TLSClientConfig
	c, err := NewClient(RemoteConfig{Config: cfg, Base: srv.URL, Token: "tok", Transport: TransportConfig{TLS: tlsCfg}})
	if err != nil {
		t.Fatalf("setup: NewClient = %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, srv
}

// TestVerbsComplete checks the verb table: each Service method is one
// verb, each route is defined once, and the definitions are sane.
func TestVerbsComplete(t *testing.T) {
	st := reflect.TypeFor[Service]()
	var methods []string
	for i := range st.NumMethod() {
		methods = append(methods, st.Method(i).Name)
	}
	var names []string
	patterns := map[string]string{}
	for _, d := range Defs() {
		names = append(names, d.Name)
		if prev, dup := patterns[d.Pattern()]; dup {
			t.Errorf("verbs %s and %s share route %s", prev, d.Name, d.Pattern())
		}
		patterns[d.Pattern()] = d.Name
		if d.Timeout <= 0 || d.Code/100 != 2 || !strings.HasPrefix(d.Path, "/") {
			t.Errorf("verb %s = %+v: want a deadline, a 2xx code and an absolute path", d.Name, d)
		}
		if w := strings.ReplaceAll(d.Path, "{id}", ""); strings.ContainsAny(w, "{}") {
			t.Errorf("verb %s path %s: want no wildcard but {id}", d.Name, d.Path)
		}
		if d.Method == http.MethodGet && !d.Idempotent {
			t.Errorf("verb %s is a GET that is not idempotent", d.Name)
		}
	}
	slices.Sort(methods)
	slices.Sort(names)
	if diff := cmp.Diff(methods, names); diff != "" {
		t.Errorf("verbs differ from Service's methods (-methods +verbs):\n%s", diff)
	}
	for _, name := range []string{"Create", "Snapshot", "Restore"} {
		if d := defOf(t, name); d.Idempotent {
			t.Errorf("verb %s is idempotent, want not: a repeat does it again or conflicts", name)
		}
	}
	Mount(http.NewServeMux(), &fake{}, nil) // panics on a route defined twice
}

func defOf(t *testing.T, name string) Def {
	t.Helper()
	for _, d := range Defs() {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no verb %s", name)
	return Def{}
}

// TestClientRoundTrip checks every verb answers over HTTP what the
// service answers in process.
func TestClientRoundTrip(t *testing.T) {
	f := &fake{}
	remote, _ := serve(t, f, Config{})
	local, err := NewLocal(f, Config{ID: "w1"})
	if err != nil {
		t.Fatalf("setup: NewLocal = %v", err)
	}
	ctx := t.Context()
	spec := Spec{Template: "default", VCPUs: 2, MemoryMiB: 512, Network: &Network{Allow: []string{"example.com"}}}
	grants := []SecretGrant{{Name: "k", Placeholder: "SPACE_SECRET_0123456789abcdef", Hosts: []string{"example.com"}}}
	calls := map[string]func(Service) (any, error){
		"Status":       func(s Service) (any, error) { return s.Status(ctx) },
		"List":         func(s Service) (any, error) { return s.List(ctx) },
		"Sandbox":      func(s Service) (any, error) { return s.Sandbox(ctx, "sbx_1") },
		"SnapshotInfo": func(s Service) (any, error) { return s.SnapshotInfo(ctx, "snp_1") },
		"Create": func(s Service) (any, error) {
			return s.Create(ctx, CreateRequest{ID: "sbx_2", Team: "t", Spec: spec, SecretValues: map[string][]byte{"k": []byte("v")}})
		},
		"Pause":  func(s Service) (any, error) { return s.Pause(ctx, "sbx_1") },
		"Resume": func(s Service) (any, error) { return s.Resume(ctx, "sbx_1") },
		"Delete": func(s Service) (any, error) { return nil, s.Delete(ctx, "sbx_1") },
		"Snapshot": func(s Service) (any, error) {
			return s.Snapshot(ctx, "sbx_1", SnapshotRequest{SnapshotID: "snp_2", Local: true})
		},
		"Restore":        func(s Service) (any, error) { return s.Restore(ctx, "sbx_1", "snp_2") },
		"DeleteSnapshot": func(s Service) (any, error) { return nil, s.DeleteSnapshot(ctx, "snp_2") },
		"SetNetwork": func(s Service) (any, error) {
			return s.SetNetwork(ctx, "sbx_1", Network{Allow: []string{"a.example"}, ICMP: true})
		},
		"SetSecrets": func(s Service) (any, error) {
			return s.SetSecrets(ctx, "sbx_1", SecretsRequest{Secrets: grants, SecretValues: map[string][]byte{"k": []byte("v")}})
		},
		"Lease": func(s Service) (any, error) {
			return s.Lease(ctx, LeaseRequest{Epoch: 3, TTLMS: 5000, Keep: []string{"sbx_1"}})
		},
		"Usage": func(s Service) (any, error) {
			return s.Usage(ctx, "sbx_1", UsageRequest{Start: time.Unix(1700000000, 0).UTC()})
		},
		"EgressLog": func(s Service) (any, error) {
			id, rc, err := s.EgressLog(ctx, "sbx_1")
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			b, err := io.ReadAll(rc)
			return id + " " + string(b), err
		},
	}
	for _, d := range Defs() {
		t.Run(d.Name, func(t *testing.T) {
			c, ok := calls[d.Name]
			if !ok {
				t.Fatalf("no call of verb %s in this test", d.Name)
			}
			want, err := c(f)
			if err != nil {
				t.Fatalf("%s on the service = %v", d.Name, err)
			}
			for name, s := range map[string]Service{"remote": remote, "local": local} {
				got, err := c(s)
				if err != nil {
					t.Errorf("%s %s = %v", name, d.Name, err)
					continue
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s %s (-service +client):\n%s", name, d.Name, diff)
				}
			}
		})
	}
}

// TestStrictDecoding checks the worker side refuses unknown fields,
// trailing data and bodies where a verb takes none, before the service
// sees the call.
func TestStrictDecoding(t *testing.T) {
	f := &fake{}
	_, srv := serve(t, f, Config{})
	tests := []struct {
		name, method, path, body string
	}{
		{"unknown field", "POST", "/sandboxes", `{"id":"sbx_1","team":"t","spec":{},"surprise":1}`},
		{"unknown nested field", "POST", "/sandboxes", `{"id":"sbx_1","team":"t","spec":{"vcpu":1}}`},
		{"trailing data", "POST", "/sandboxes", `{"id":"sbx_1","team":"t","spec":{}} {}`},
		{"trailing garbage", "PUT", "/sandboxes/sbx_1/network", `{"allow":[]}x`},
		{"wrong type", "POST", "/sandboxes/sbx_1/snapshots", `{"snapshot_id":7}`},
		{"restore with snapshot options", "POST", "/sandboxes/sbx_1/restore", `{"snapshot_id":"s","local":true}`},
		{"body on a bodiless verb", "POST", "/sandboxes/sbx_1/pause", `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+PathPrefix+tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tt.method, tt.path, err)
			}
			defer resp.Body.Close()
			rerr := httpapi.ResponseError(resp)
			if resp.StatusCode != http.StatusBadRequest || !errors.Is(rerr, errkind.InvalidArgument) {
				t.Errorf("%s %s %s = %d %v, want 400 invalid_argument", tt.method, tt.path, tt.body, resp.StatusCode, rerr)
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) != 0 {
		t.Errorf("service calls after refused requests: %v, want none", f.calls)
	}
}

// TestRetry checks a client tries an idempotent verb again when the
// worker refuses connections, and a non-idempotent one only once.
func TestRetry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connections are refused
	tests := []struct {
		verb string
		call func(*Client) error
		want int
	}{
		{"Status", func(c *Client) error { _, err := c.Status(t.Context()); return err }, 3},
		{"Delete", func(c *Client) error { return c.Delete(t.Context(), "sbx_1") }, 3},
		{"Create", func(c *Client) error { _, err := c.Create(t.Context(), CreateRequest{ID: "sbx_1"}); return err }, 1},
		{"Snapshot", func(c *Client) error {
			_, err := c.Snapshot(t.Context(), "sbx_1", SnapshotRequest{SnapshotID: "s"})
			return err
		}, 1},
		{"Restore", func(c *Client) error { _, err := c.Restore(t.Context(), "sbx_1", "s"); return err }, 1},
	}
	for _, tt := range tests {
		t.Run(tt.verb, func(t *testing.T) {
			var dials atomic.Int32
			var d net.Dialer
			c, err := NewClient(RemoteConfig{
				Config: Config{ID: "w1", Backoff: time.Millisecond}, Base: "https://" + addr,
				Transport: TransportConfig{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
					dials.Add(1)
					return d.DialContext(ctx, network, a)
				}},
			})
			if err != nil {
				t.Fatalf("setup: %v", err)
			}
			err = tt.call(c)
			if !errors.Is(err, errkind.Unavailable) || !strings.Contains(fmt.Sprint(err), "connection refused") {
				t.Errorf("%s to a closed port = %v, want unavailable: connection refused", tt.verb, err)
			}
			if got := int(dials.Load()); got != tt.want {
				t.Errorf("%s to a closed port: %d connection attempts, want %d", tt.verb, got, tt.want)
			}
		})
	}
}

// TestNoRetryOfAnswers checks a worker's own error answer is never
// retried, even one saying it is unavailable.
func TestNoRetryOfAnswers(t *testing.T) {
	f := &fake{err: fmt.Errorf("vmm busy: %w", errkind.Unavailable)}
	c, _ := serve(t, f, Config{Backoff: time.Millisecond})
	_, err := c.Status(t.Context())
	if !errors.Is(err, errkind.Unavailable) || !strings.Contains(err.Error(), "vmm busy") {
		t.Errorf("Status = %v, want the worker's unavailable answer", err)
	}
	if got := f.count("Status"); got != 1 {
		t.Errorf("Status answered unavailable: %d calls, want 1", got)
	}
}

// TestDeadline checks a call of a worker that hangs fails unavailable
// at its verb's deadline, remote or local, and that a caller's shorter
// deadline wins.
func TestDeadline(t *testing.T) {
	const timeout = 200 * time.Millisecond
	f := &fake{hang: true}
	cfg := Config{Timeouts: map[string]time.Duration{"Status": timeout, "Create": timeout}}
	remote, _ := serve(t, f, cfg)
	cfg.ID = "w1"
	local, err := NewLocal(f, cfg)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	for name, c := range map[string]*Client{"remote": remote, "local": local} {
		for _, verb := range []string{"Status", "Create"} {
			t.Run(name+"/"+verb, func(t *testing.T) {
				t0 := time.Now()
				if verb == "Status" {
					_, err = c.Status(t.Context())
				} else {
					_, err = c.Create(t.Context(), CreateRequest{ID: "sbx_1"})
				}
				took := time.Since(t0)
				if !errors.Is(err, errkind.Unavailable) || !errors.Is(err, context.DeadlineExceeded) ||
					!strings.HasPrefix(fmt.Sprint(err), "worker w1: "+verb+": no answer within ") {
					t.Errorf("%s of a hung worker = %v, want unavailable and deadline exceeded, saying so", verb, err)
				}
				if took < timeout || took > timeout+5*time.Second {
					t.Errorf("%s of a hung worker took %v, want about %v", verb, took, timeout)
				}
			})
		}
	}
	t.Run("caller's deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		_, err := local.Sandbox(ctx, "sbx_1") // its own deadline is seconds
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > inspectTimeout {
			t.Errorf("Sandbox under a 50ms deadline = %v after %v, want deadline exceeded at once", err, time.Since(t0))
		}
	})
}

// TestEgressLogStream checks the egress log streams after the call
// returns: its deadline lasts until the body is closed.
func TestEgressLogStream(t *testing.T) {
	c, _ := serve(t, &fake{}, Config{})
	id, rc, err := c.EgressLog(t.Context(), "sbx_1")
	if err != nil {
		t.Fatalf("EgressLog = %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if id != "log-sbx_1" || string(b) != `{"event":1}`+"\n" || err != nil {
		t.Errorf("EgressLog = %q, %q, %v; want log-sbx_1 and one line", id, b, err)
	}
}

func TestConfigRefused(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no id", Config{}},
		{"unknown verb", Config{ID: "w", Timeouts: map[string]time.Duration{"Boot": time.Second}}},
		{"zero timeout", Config{ID: "w", Timeouts: map[string]time.Duration{"Status": 0}}},
		{"negative attempts", Config{ID: "w", Attempts: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewLocal(&fake{}, tt.cfg); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("NewLocal(%+v) = %v, want invalid argument", tt.cfg, err)
			}
		})
	}
	if _, err := NewClient(RemoteConfig{Config: Config{ID: "w"}, Base: "http://127.0.0.1:1"}); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("NewClient(http URL) = %v, want invalid argument", err)
	}
}

func TestCheckVersion(t *testing.T) {
	tests := []struct {
		v    int
		want string // in the error; "" = compatible
	}{
		{Version, ""},
		{0, "upgrade the worker"},
		{Version + 1, fmt.Sprintf("worker w1 speaks worker protocol %d, this control plane speaks %d: upgrade the control plane", Version+1, Version)},
	}
	for _, tt := range tests {
		err := CheckVersion("w1", tt.v)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckVersion(%d) = %v, want nil", tt.v, err)
		case tt.want != "" && (!errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(fmt.Sprint(err), tt.want)):
			t.Errorf("CheckVersion(%d) = %v, want failed precondition saying %q", tt.v, err, tt.want)
		}
	}
}

func TestCapabilitiesValidate(t *testing.T) {
	tests := []struct {
		name string
		caps Capabilities
		ok   bool
	}{
		{"zero", Capabilities{}, true},
		{"qemu tcg", Capabilities{VMM: "qemu", Accel: "tcg", NICs: []string{NICSocket}}, true},
		{"firecracker kvm", Capabilities{VMM: "firecracker", Accel: "kvm", NICs: []string{NICTap}}, true},
		{"fake", Capabilities{VMM: "fake", Accel: "none", Snapshots: true, ChunkedSnapshots: true}, true},
		{"unknown vmm", Capabilities{VMM: "bhyve"}, false},
		{"unknown accel", Capabilities{VMM: "qemu", Accel: "hvf"}, false},
		{"qemu without an accelerator", Capabilities{VMM: "qemu", Accel: "none"}, false},
		{"fake on kvm", Capabilities{VMM: "fake", Accel: "kvm"}, false},
		{"unknown nic", Capabilities{VMM: "qemu", NICs: []string{"vhost"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.caps.Validate()
			if tt.ok && err != nil {
				t.Errorf("Validate(%+v) = %v, want nil", tt.caps, err)
			}
			if !tt.ok && !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Validate(%+v) = %v, want invalid argument", tt.caps, err)
			}
		})
	}
}

// TestOriginTravels: a call's request ID and actor reach the worker, so
// its log lines of one API request carry the control plane's; a forged
// malformed one is dropped.
func TestOriginTravels(t *testing.T) {
	f := &fake{}
	c, _ := serve(t, f, Config{})
	ctx := origin.With(t.Context(), origin.Origin{RequestID: "req_abc", Kind: origin.KindKey, ID: "key_1"})
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := f.origin
	f.mu.Unlock()
	if got.RequestID != "req_abc" || got.Actor() != "api_key:key_1" {
		t.Errorf("origin on the worker = %+v, want req_abc and api_key:key_1", got)
	}
	if _, err := c.Status(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got = f.origin
	f.mu.Unlock()
	if got != (origin.Origin{}) {
		t.Errorf("origin of a call without one = %+v, want none", got)
	}
}
