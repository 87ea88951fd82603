package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

// networkAPI plays the routes of the network verbs. PUT network fails
// with failed_precondition for sandbox "nonet" and otherwise echoes the
// policy in the sandbox; GET egress answers egressLog.
type networkAPI struct {
	url string

	mu sync.Mutex
	// +checklocks:mu
	create *api.CreateSandbox // the last create's body, or nil
	// +checklocks:mu
	network *api.Network // the last PUT network's body, or nil
}

var egressLog = []api.EgressEvent{
	{Time: t0, Allowed: true, Proto: "dns", Name: "pypi.org", Addr: "198.18.0.1"},
	{Time: t0, Allowed: true, Proto: "tcp", Mode: "https", Name: "pypi.org", Addr: "151.101.0.223", Port: 443, BytesOut: 517, BytesIn: 4096},
	{Time: t0, Proto: "tcp", Addr: "10.1.2.3", Port: 22, Reason: "the policy allows no connection to this address by IP"},
}

func newNetworkAPI(t *testing.T) *networkAPI {
	t.Helper()
	f := &networkAPI{}
	sb := api.Sandbox{ID: "sb-1", Team: "t", Template: "default", State: "running", VCPUs: 1, MemoryMiB: 512,
		DiskMiB: 4096, CreatedAt: t0, UpdatedAt: t0}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandbox
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: api.ErrorBody{Code: api.CodeInvalidArgument, Message: err.Error()}})
			return
		}
		f.mu.Lock()
		f.create = &req
		f.mu.Unlock()
		sb := sb
		sb.Network = req.Network
		writeJSON(w, http.StatusCreated, sb)
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "nonet" {
			writeJSON(w, http.StatusConflict, api.Error{Error: api.ErrorBody{Code: api.CodeFailedPrecondition,
				Message: "nonet was created without network"}})
			return
		}
		var n api.Network
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: api.ErrorBody{Code: api.CodeInvalidArgument, Message: err.Error()}})
			return
		}
		f.mu.Lock()
		f.network = &n
		f.mu.Unlock()
		sb := sb
		sb.Network = &n
		writeJSON(w, http.StatusOK, sb)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/egress", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range egressLog {
			enc.Encode(ev)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *networkAPI) env() map[string]string {
	return map[string]string{"SPACE_API_URL": f.url, "SPACE_API_KEY": "sk-test"}
}

func TestSandboxCreateNetwork(t *testing.T) {
	f := newNetworkAPI(t)
	tests := []struct {
		name string
		args []string
		want *api.Network
	}{
		{"no network", nil, nil},
		{"empty network", []string{"--network"}, &api.Network{}},
		{"network off", []string{"--network-off"}, &api.Network{Off: true}},
		{"rules", []string{"--allow-host", "pypi.org:443", "--allow-cidr", "10.0.0.0/8:5432", "--allow-host", "*.github.com",
			"--allow-cidr", "203.0.113.7"},
			&api.Network{Allow: []string{"pypi.org:443", "*.github.com", "10.0.0.0/8:5432", "203.0.113.7"}}},
		{"rules with --network", []string{"--network", "--allow-host", "example.com"}, &api.Network{Allow: []string{"example.com"}}},
		{"pings", []string{"--allow-cidr", "203.0.113.7", "--allow-icmp"}, &api.Network{Allow: []string{"203.0.113.7"}, ICMP: true}},
		{"passthrough", []string{"--allow-passthrough", "pinned.example.com:443", "--allow-host", "pypi.org"},
			&api.Network{Allow: []string{"pypi.org", "pinned.example.com:443 tls=passthrough"}}},
		{"ipv6", []string{"--allow-cidr", "[2001:db8::7]:443", "--allow-cidr", "2001:db8::/32"},
			&api.Network{Allow: []string{"[2001:db8::7]:443", "2001:db8::/32"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, stdout, _ := newTestGlobals(t, f.env())
			args := append([]string{"sandbox", "create"}, tt.args...)
			if _, err := run(t.Context(), g, args); err != nil {
				t.Fatalf("run(%q) = %v", args, err)
			}
			f.mu.Lock()
			got := f.create
			f.mu.Unlock()
			if got == nil {
				t.Fatalf("run(%q) sent no create", args)
			}
			if diff := cmp.Diff(tt.want, got.Network); diff != "" {
				t.Errorf("run(%q) sent network differing (-want +got):\n%s", args, diff)
			}
			if got, want := stdout.String(), "sb-1\n"; got != want {
				t.Errorf("run(%q) printed %q, want %q", args, got, want)
			}
		})
	}
}

func TestSandboxNetwork(t *testing.T) {
	f := newNetworkAPI(t)
	g, stdout, _ := newTestGlobals(t, f.env())
	args := []string{"sandbox", "network", "sb-1", "--allow-host", "pypi.org:443", "--allow-cidr", "10.0.0.0/8", "--allow-host", "*.github.com"}
	if _, err := run(t.Context(), g, args); err != nil {
		t.Fatalf("run(%q) = %v", args, err)
	}
	f.mu.Lock()
	got := f.network
	f.mu.Unlock()
	want := &api.Network{Allow: []string{"pypi.org:443", "*.github.com", "10.0.0.0/8"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("run(%q) sent a policy differing (-want +got):\n%s", args, diff)
	}
	ts := t0.Local().Format(time.RFC3339)
	wantOut := "id        sb-1\n" +
		"team      t\n" +
		"state     running\n" +
		"template  default\n" +
		"vcpus     1\n" +
		"memory    512 MiB\n" +
		"disk      4096 MiB\n" +
		"created   " + ts + "\n" +
		"updated   " + ts + "\n" +
		"network   allow pypi.org:443, *.github.com, 10.0.0.0/8\n"
	if diff := cmp.Diff(wantOut, stdout.String()); diff != "" {
		t.Errorf("run(%q) output differs (-want +got):\n%s", args, diff)
	}

	tests := []struct {
		args []string
		want api.Network
	}{
		{[]string{"sandbox", "network", "sb-1", "-o", "json"}, api.Network{}},
		{[]string{"sandbox", "network", "sb-1", "--off", "-o", "json"}, api.Network{Off: true}},
	}
	for _, tt := range tests {
		g, stdout, _ := newTestGlobals(t, f.env())
		if _, err := run(t.Context(), g, tt.args); err != nil {
			t.Fatalf("run(%q) = %v", tt.args, err)
		}
		var sb api.Sandbox
		if err := json.Unmarshal(stdout.Bytes(), &sb); err != nil || sb.Network == nil {
			t.Fatalf("run(%q) printed %q (%v), want a sandbox with a network", tt.args, stdout, err)
		}
		if diff := cmp.Diff(tt.want, *sb.Network); diff != "" {
			t.Errorf("run(%q) printed a policy differing (-want +got):\n%s", tt.args, diff)
		}
	}

	g, _, stderr := newTestGlobals(t, f.env())
	args = []string{"sandbox", "network", "nonet", "--allow-host", "example.com"}
	if got := execute(t.Context(), g, args); got != exitFailure {
		t.Errorf("execute(%q) = %d, want %d", args, got, exitFailure)
	}
	if want := "nonet was created without network (failed_precondition, HTTP 409)"; !strings.Contains(stderr.String(), want) {
		t.Errorf("execute(%q) stderr = %q, want it to contain %q", args, stderr, want)
	}
}

func TestSandboxEgressLog(t *testing.T) {
	f := newNetworkAPI(t)
	g, stdout, _ := newTestGlobals(t, f.env())
	if _, err := run(t.Context(), g, []string{"sandbox", "egress-log", "sb-1"}); err != nil {
		t.Fatalf("run(sandbox egress-log) = %v", err)
	}
	ts := t0.Local().Format(time.RFC3339)
	pad := strings.Repeat(" ", len(ts)-len("TIME"))
	want := "TIME" + pad + "  ALLOWED  PROTO  MODE   NAME      ADDR           PORT  OUT  IN    REASON\n" +
		ts + "  yes      dns           pypi.org  198.18.0.1                      \n" +
		ts + "  yes      tcp    https  pypi.org  151.101.0.223  443   517  4096  \n" +
		ts + "  no       tcp                     10.1.2.3       22               the policy allows no connection to this address by IP\n"
	if diff := cmp.Diff(want, stdout.String()); diff != "" {
		t.Errorf("sandbox egress-log output differs (-want +got):\n%s", diff)
	}

	g, stdout, _ = newTestGlobals(t, f.env())
	if _, err := run(t.Context(), g, []string{"sandbox", "egress-log", "sb-1", "-o", "json"}); err != nil {
		t.Fatalf("run(sandbox egress-log -o json) = %v", err)
	}
	var got []api.EgressEvent
	dec := json.NewDecoder(bytes.NewReader(stdout.Bytes()))
	dec.DisallowUnknownFields()
	for {
		var ev api.EgressEvent
		if err := dec.Decode(&ev); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("sandbox egress-log -o json printed %q: %v", stdout, err)
		}
		got = append(got, ev)
	}
	if diff := cmp.Diff(egressLog, got); diff != "" {
		t.Errorf("sandbox egress-log -o json differs (-want +got):\n%s", diff)
	}
	if n := strings.Count(stdout.String(), "\n"); n != len(egressLog) {
		t.Errorf("sandbox egress-log -o json printed %d lines, want one per event (%d)", n, len(egressLog))
	}
}

func TestNetworkUsage(t *testing.T) {
	for _, args := range [][]string{
		{"sandbox", "create", "--allow-host", "10.0.0.1"},
		{"sandbox", "create", "--allow-host", "10.0.0.0/8:22"},
		{"sandbox", "create", "--allow-cidr", "pypi.org"},
		{"sandbox", "create", "--allow-cidr", "10.0.0.0/8:https"},
		{"sandbox", "network"},
		{"sandbox", "network", "sb-1", "sb-2"},
		{"sandbox", "network", "sb-1", "--allow-cidr", "*.github.com"},
		{"sandbox", "network", "sb-1", "--network-off"},
		{"sandbox", "egress-log"},
		{"sandbox", "egress-log", "sb-1", "-o", "yaml"},
	} {
		g, _, _ := newTestGlobals(t, nil)
		var ue usageError
		if _, err := run(t.Context(), g, args); !errors.As(err, &ue) {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
	}
}

func TestIsAddrRule(t *testing.T) {
	tests := []struct {
		rule string
		want bool
	}{
		{"10.0.0.1", true},
		{"10.0.0.1:443", true},
		{"10.0.0.0/8", true},
		{"10.0.0.0/8:5432", true},
		{"::1", true}, // the server refuses it, saying why
		{"pypi.org", false},
		{"pypi.org:443", false},
		{"*.github.com", false},
		{"10.0.0.0/8:https", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := isAddrRule(tt.rule); got != tt.want {
			t.Errorf("isAddrRule(%q) = %v, want %v", tt.rule, got, tt.want)
		}
	}
}
