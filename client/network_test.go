package client

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

// egressEvents is the log the fake network server has for sandbox sb-1.
var egressEvents = []api.EgressEvent{
	{Time: t0, Allowed: true, Proto: "dns", Name: "pypi.org", Addr: "198.18.0.1"},
	{Time: t0, Allowed: true, Proto: "tcp", Name: "pypi.org", Addr: "151.101.0.223", Port: 443, BytesOut: 517, BytesIn: 4096},
	{Time: t0, Proto: "dns", Name: "evil.example", Reason: "the policy does not allow evil.example"},
	{Time: t0, Proto: "udp", Addr: "8.8.8.8", Port: 53, Reason: "UDP goes only to the gateway's DNS"},
}

// newNetworkServer plays the network routes. PUT answers by sandbox ID:
// "nonet" has no network (failed_precondition), a rule "bad" is refused
// (field allow), anything else is set and echoed in the sandbox. GET
// egress answers sb-1 with egressEvents, "empty" with nothing, "cut" with
// a line cut short, and "stopped" with failed_precondition.
func newNetworkServer(t *testing.T) *Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey || r.Header.Get("Content-Type") != "application/json" {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "want the key and a JSON body", "")
			return
		}
		var n api.Network
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, err.Error(), "")
			return
		}
		if r.PathValue("id") == "nonet" {
			writeError(w, http.StatusConflict, api.CodeFailedPrecondition, "nonet was created without network", "")
			return
		}
		for _, rule := range n.Allow {
			if rule == "bad" {
				writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, `rule "bad": not a host name`, "allow")
				return
			}
		}
		writeJSON(w, http.StatusOK, api.Sandbox{ID: r.PathValue("id"), State: "running", Network: &n, CreatedAt: t0, UpdatedAt: t0})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/egress", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "application/x-ndjson" {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "want Accept: application/x-ndjson", "")
			return
		}
		switch r.PathValue("id") {
		case "stopped":
			writeError(w, http.StatusConflict, api.CodeFailedPrecondition, "sandbox stopped is stopped", "")
			return
		case "empty":
			w.Header().Set("Content-Type", "application/x-ndjson")
			return
		case "cut":
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, `{"time":"2026-01-02T03:04:05Z","allowed":tr`)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ev := range egressEvents {
			enc.Encode(ev)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, testKey)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return c
}

func TestSetNetwork(t *testing.T) {
	c := newNetworkServer(t)
	tests := []struct {
		name    string
		id      string
		n       api.Network
		want    api.Sandbox
		wantErr *Error
	}{
		{name: "rules", id: "sb-1", n: api.Network{Allow: []string{"pypi.org:443", "*.github.com", "10.0.0.0/8:5432"}},
			want: api.Sandbox{ID: "sb-1", State: "running", CreatedAt: t0, UpdatedAt: t0,
				Network: &api.Network{Allow: []string{"pypi.org:443", "*.github.com", "10.0.0.0/8:5432"}}}},
		{name: "off", id: "sb-1", n: api.Network{Off: true},
			want: api.Sandbox{ID: "sb-1", State: "running", CreatedAt: t0, UpdatedAt: t0, Network: &api.Network{Off: true}}},
		{name: "bad rule", id: "sb-1", n: api.Network{Allow: []string{"bad"}},
			wantErr: &Error{Status: 400, Code: api.CodeInvalidArgument, Message: `rule "bad": not a host name`, Field: "allow"}},
		{name: "no network", id: "nonet", n: api.Network{},
			wantErr: &Error{Status: 409, Code: api.CodeFailedPrecondition, Message: "nonet was created without network"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.SetNetwork(t.Context(), tt.id, tt.n)
			if tt.wantErr != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("SetNetwork(%q, %+v) = %v, want an *Error", tt.id, tt.n, err)
				}
				if diff := cmp.Diff(tt.wantErr, e); diff != "" {
					t.Errorf("SetNetwork(%q, %+v) error differs (-want +got):\n%s", tt.id, tt.n, diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("SetNetwork(%q, %+v) = %v", tt.id, tt.n, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("SetNetwork(%q, %+v) differs (-want +got):\n%s", tt.id, tt.n, diff)
			}
		})
	}
	if _, err := c.SetNetwork(t.Context(), "nonet", api.Network{}); !IsConflict(err) {
		t.Errorf("SetNetwork(nonet) = %v, want IsConflict", err)
	}
}

func TestEgressLog(t *testing.T) {
	c := newNetworkServer(t)
	tests := []struct {
		name    string
		id      string
		want    []api.EgressEvent
		wantErr string // a substring, or ""
	}{
		{name: "events", id: "sb-1", want: egressEvents},
		{name: "empty", id: "empty"},
		{name: "cut", id: "cut", wantErr: "GET /v1/sandboxes/cut/egress: decode event 1: unexpected EOF"},
		{name: "stopped", id: "stopped", wantErr: "sandbox stopped is stopped (failed_precondition, HTTP 409)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.EgressLog(t.Context(), tt.id)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("EgressLog(%q) = %v, want an error containing %q", tt.id, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("EgressLog(%q) = %v", tt.id, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("EgressLog(%q) differs (-want +got):\n%s", tt.id, diff)
			}
		})
	}
}
