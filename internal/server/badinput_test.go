package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/cgroup"
)

// cgroupProcs lists the processes in the worker's control groups.
func cgroupProcs(t *testing.T, workerID string) []int {
	t.Helper()
	h, err := cgroup.Detect()
	if err != nil {
		return nil // no cgroups: nothing to leak there
	}
	names, err := h.List("space-" + workerID)
	if err != nil {
		t.Errorf("list cgroups: %v", err)
		return nil
	}
	var pids []int
	for _, n := range names {
		g, err := h.Open(n)
		if err != nil {
			continue
		}
		p, _ := g.Procs()
		pids = append(pids, p...)
	}
	return pids
}

// TestBadInputs sends malformed and absurd requests: each gets a 4xx JSON
// error naming the problem, and nothing changes.
func TestBadInputs(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	sb, err := ts.client.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	sbPath := "/v1/sandboxes/" + sb.ID
	tests := []struct {
		name, method, path, body string
		status                   int
		code, field              string
	}{
		{"malformed json", "POST", "/v1/sandboxes", `{"vcpus":`, 400, api.CodeInvalidArgument, ""},
		{"unknown field", "POST", "/v1/sandboxes", `{"cpus":2}`, 400, api.CodeInvalidArgument, "cpus"},
		{"wrong type", "POST", "/v1/sandboxes", `{"vcpus":"two"}`, 400, api.CodeInvalidArgument, "vcpus"},
		{"memory zero", "POST", "/v1/sandboxes", `{"memory_mib":0}`, 400, api.CodeInvalidArgument, "memory_mib"},
		{"memory huge", "POST", "/v1/sandboxes", `{"memory_mib":10000000000}`, 400, api.CodeInvalidArgument, "memory_mib"},
		{"vcpus huge", "POST", "/v1/sandboxes", `{"vcpus":1000}`, 400, api.CodeInvalidArgument, "vcpus"},
		{"disk negative", "POST", "/v1/sandboxes", `{"disk_mib":-1}`, 400, api.CodeInvalidArgument, "disk_mib"},
		{"timeout zero", "POST", "/v1/sandboxes", `{"timeout_seconds":0}`, 400, api.CodeInvalidArgument, "timeout_seconds"},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, 400, api.CodeInvalidArgument, "template"},
		{"bad env", "POST", "/v1/sandboxes", `{"env":{"A=B":"c"}}`, 400, api.CodeInvalidArgument, "env"},
		{"two values", "POST", "/v1/sandboxes", `{} {}`, 400, api.CodeInvalidArgument, ""},
		{"too large", "POST", "/v1/sandboxes", `{"labels":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`, 413, api.CodeTooLarge, ""},
		{"bad id get", "GET", "/v1/sandboxes/../etc", "", 404, "", ""},
		{"malformed id", "GET", "/v1/sandboxes/sbx_NOPE", "", 404, api.CodeNotFound, ""},
		{"unknown id", "GET", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa", "", 404, api.CodeNotFound, ""},
		{"unknown id delete", "DELETE", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa", "", 404, api.CodeNotFound, ""},
		{"unknown id exec", "POST", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/exec", `{"command":["true"]}`, 404, api.CodeNotFound, ""},
		{"exec no command", "POST", sbPath + "/exec", `{}`, 400, api.CodeInvalidArgument, "command"},
		{"exec both", "POST", sbPath + "/exec", `{"command":["true"],"shell":"true"}`, 400, api.CodeInvalidArgument, "command"},
		{"exec relative cwd", "POST", sbPath + "/exec", `{"command":["true"],"cwd":"tmp"}`, 400, api.CodeInvalidArgument, "cwd"},
		{"exec unknown user", "POST", sbPath + "/exec", `{"command":["true"],"user":"nosuchuser"}`, 400, api.CodeInvalidArgument, "user"},
		{"exec unknown field", "POST", sbPath + "/exec", `{"cmd":["true"]}`, 400, api.CodeInvalidArgument, "cmd"},
		{"file relative path", "GET", sbPath + "/files?path=etc/passwd", "", 400, api.CodeInvalidArgument, "path"},
		{"file bad mode", "PUT", sbPath + "/files?path=/tmp/x&mode=999", "x", 400, api.CodeInvalidArgument, "mode"},
		{"process bad id", "GET", sbPath + "/processes/abc", "", 404, api.CodeNotFound, ""},
		{"process unknown", "GET", sbPath + "/processes/99999", "", 404, api.CodeNotFound, ""},
		{"output bad share", "GET", sbPath + "/processes/1/output?share=maybe", "", 400, api.CodeInvalidArgument, ""},
		{"attach bad share", "GET", sbPath + "/processes/1/attach?share=1", "", 400, api.CodeInvalidArgument, ""},
		{"signal out of range", "POST", sbPath + "/processes/1/signal", `{"signal":99}`, 400, api.CodeInvalidArgument, "signal"},
		{"list bad state", "GET", "/v1/sandboxes?state=dancing", "", 400, api.CodeInvalidArgument, "state"},
		{"unknown route", "GET", "/v1/nothing", "", 404, api.CodeNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := rawCall(t, ts, tt.method, tt.path, tt.body)
			if status != tt.status {
				t.Fatalf("%s %s = %d %s, want %d", tt.method, tt.path, status, body, tt.status)
			}
			if tt.code == "" {
				return
			}
			var e api.Error
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != tt.code || e.Error.Message == "" || e.Error.Field != tt.field {
				t.Errorf("%s %s body = %s, want code %s field %q", tt.method, tt.path, body, tt.code, tt.field)
			}
		})
	}
	// Nothing changed: one sandbox, still running.
	all, err := ts.client.Sandboxes(t.Context(), client.ListOptions{})
	if err != nil || len(all) != 1 || all[0].State != "running" {
		t.Errorf("after bad inputs: sandboxes = %+v, %v; want the one running", all, err)
	}
	// No key, a wrong key.
	for _, key := range []string{"", "sk_wrong"} {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", ts.url+"/v1/sandboxes", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("GET /v1/sandboxes with key %q = %d, want 401", key, resp.StatusCode)
		}
	}
}
