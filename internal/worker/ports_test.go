package worker

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/server"
	"space/internal/httpapi"
)

// inProcessAgent connects a client to an agent server running in the test
// process, over a socketpair. Both end with the test.
func inProcessAgent(t *testing.T) *client.Client {
	t.Helper()
	srv, err := server.New(server.Config{Version: "test"})
	if err != nil {
		t.Fatalf("setup: server.New: %v", err)
	}
	t.Cleanup(func() { srv.Close() }) // after the client's cleanup
	return agenttest.Serve(t, func(ctx context.Context, conn *os.File) { srv.ServeConn(ctx, conn) })
}

// TestHandlePort serves GET .../ports/{port} with an in-process agent.
func TestHandlePort(t *testing.T) {
	a := inProcessAgent(t)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	defer l.Close()
	open := l.Addr().(*net.TCPAddr).Port
	c, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: listen: %v", err)
	}
	closed := c.Addr().(*net.TCPAddr).Port
	c.Close()

	tests := []struct {
		name       string
		port       string
		wantStatus int
		wantBody   any // api.PortState or api.ErrorBody.Field
	}{
		{"open", strconv.Itoa(open), http.StatusOK, api.PortState{Port: open, Open: true}},
		{"closed", strconv.Itoa(closed), http.StatusOK, api.PortState{Port: closed, Open: false}},
		{"zero", "0", http.StatusBadRequest, "port"},
		{"too big", "65536", http.StatusBadRequest, "port"},
		{"negative", "-1", http.StatusBadRequest, "port"},
		{"not a number", "http", http.StatusBadRequest, "port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", PathPrefix+"/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/ports/"+tt.port, nil)
			req.SetPathValue("port", tt.port)
			rec := httptest.NewRecorder()
			if err := handlePort(rec, req, a); err != nil {
				httpapi.WriteError(rec, err) // as withAgent does
			}
			if rec.Code != tt.wantStatus {
				t.Fatalf("GET ports/%s = %d %s, want %d", tt.port, rec.Code, rec.Body, tt.wantStatus)
			}
			var got any
			if tt.wantStatus == http.StatusOK {
				var st api.PortState
				err = json.Unmarshal(rec.Body.Bytes(), &st)
				got = st
			} else {
				var e api.Error
				err = json.Unmarshal(rec.Body.Bytes(), &e)
				got = e.Error.Field
			}
			if err != nil {
				t.Fatalf("GET ports/%s body %q: %v", tt.port, rec.Body, err)
			}
			if diff := cmp.Diff(tt.wantBody, got); diff != "" {
				t.Errorf("GET ports/%s body differs (-want +got):\n%s", tt.port, diff)
			}
		})
	}
}
