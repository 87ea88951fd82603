package main

import (
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

// checkpointAPI plays the routes of the checkpoint verbs. Sandbox sb-1's
// policy is the last one PUT (every=5m,after_exec at first); PUT echoes
// it in the sandbox (nil when it takes none). Sandbox "stopped" answers
// failed_precondition.
type checkpointAPI struct {
	url string

	mu sync.Mutex
	// +checklocks:mu
	bodies map[string][]byte // the last body of each route pattern
	// +checklocks:mu
	policy *api.CheckpointPolicy
}

var checkpointHistory = []api.Checkpoint{
	{ID: "snp_3", SandboxID: "sb-1", CreatedAt: t0.Add(-30 * time.Second), Trigger: api.CheckpointExec,
		Command:     "sh -c 'pip install -r requirements.txt &&\n  python -m pytest tests/ --maxfail=1 -q'",
		StoredBytes: 3<<20 + 300<<10, LogicalBytes: 600 << 20, PausedMS: 31},
	{ID: "snp_2", SandboxID: "sb-1", CreatedAt: t0.Add(-5 * time.Minute), Trigger: api.CheckpointManual,
		StoredBytes: 512, LogicalBytes: 600 << 20, PausedMS: 12},
	{ID: "snp_1", SandboxID: "sb-1", CreatedAt: t0.Add(-2 * time.Hour), Trigger: api.CheckpointSchedule,
		StoredBytes: 2 << 30, LogicalBytes: 3 << 30, PausedMS: 140},
}

func newCheckpointAPI(t *testing.T) *checkpointAPI {
	t.Helper()
	f := &checkpointAPI{bodies: map[string][]byte{},
		policy: &api.CheckpointPolicy{Every: "5m0s", AfterExec: true, MinExec: "2s", Keep: 20}}
	sb := api.Sandbox{ID: "sb-1", Team: "t", Template: "default", State: "running", VCPUs: 1, MemoryMiB: 512,
		DiskMiB: 4096, CreatedAt: t0, UpdatedAt: t0}
	mux := http.NewServeMux()
	handle := func(pattern string, h func(w http.ResponseWriter, r *http.Request, body []byte)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if r.PathValue("id") == "stopped" {
				writeJSON(w, http.StatusConflict, api.Error{Error: api.ErrorBody{Code: api.CodeFailedPrecondition,
					Message: "sandbox stopped is stopped"}})
				return
			}
			body, _ := io.ReadAll(r.Body)
			f.mu.Lock()
			f.bodies[pattern] = body
			f.mu.Unlock()
			h(w, r, body)
		})
	}
	handle("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusCreated, sb)
	})
	handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request, body []byte) {
		sb := sb
		f.mu.Lock()
		sb.Checkpoints = f.policy
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, sb)
	})
	handle("GET /v1/sandboxes/{id}/checkpoints", func(w http.ResponseWriter, r *http.Request, body []byte) {
		l := api.CheckpointList{Checkpoints: checkpointHistory}
		f.mu.Lock()
		if f.policy != nil {
			l.Policy = *f.policy
		}
		f.mu.Unlock()
		if r.PathValue("id") == "empty" {
			l = api.CheckpointList{}
		}
		writeJSON(w, http.StatusOK, l)
	})
	handle("POST /v1/sandboxes/{id}/checkpoints", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusCreated, api.Checkpoint{ID: "snp_4", SandboxID: r.PathValue("id"), CreatedAt: t0,
			Trigger: api.CheckpointManual, StoredBytes: 1 << 20, LogicalBytes: 600 << 20, PausedMS: 9})
	})
	handle("PUT /v1/sandboxes/{id}/checkpoints/policy", func(w http.ResponseWriter, r *http.Request, body []byte) {
		var p api.CheckpointPolicy
		if err := json.Unmarshal(body, &p); err != nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: api.ErrorBody{Code: api.CodeInvalidArgument, Message: err.Error()}})
			return
		}
		f.mu.Lock()
		f.policy = nil
		if p.Every != "" || p.AfterExec {
			f.policy = &p
		}
		sb := sb
		sb.Checkpoints = f.policy
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, sb)
	})
	handle("POST /v1/sandboxes/{id}/restore", func(w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusOK, sb)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *checkpointAPI) env() map[string]string {
	return map[string]string{"SPACE_API_URL": f.url, "SPACE_API_KEY": "sk-test"}
}

// body returns the last body sent to pattern ("" for none).
func (f *checkpointAPI) body(pattern string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(f.bodies[pattern])
}

// lastCreate decodes the last create's body.
func (f *checkpointAPI) lastCreate(t *testing.T) api.CreateSandbox {
	t.Helper()
	var req api.CreateSandbox
	if err := json.Unmarshal([]byte(f.body("POST /v1/sandboxes")), &req); err != nil {
		t.Fatalf("create body %q: %v", f.body("POST /v1/sandboxes"), err)
	}
	return req
}

func TestSandboxCreateCheckpoints(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want api.CreateSandbox
	}{
		{"no flags: the server's default", nil, api.CreateSandbox{}},
		{"every", []string{"--checkpoint-every", "5m"}, api.CreateSandbox{Checkpoints: &api.CheckpointPolicy{Every: "5m0s"}}},
		{"every flag", []string{"--checkpoint-every", "90s", "--checkpoint-after-exec", "--checkpoint-min-exec", "10s",
			"--checkpoint-keep", "5", "--checkpoint-keep-for", "24h"},
			api.CreateSandbox{Checkpoints: &api.CheckpointPolicy{Every: "1m30s", AfterExec: true, MinExec: "10s", Keep: 5, KeepFor: "24h0m0s"}}},
		{"after every command", []string{"--checkpoint-after-exec", "--checkpoint-min-exec", "0"},
			api.CreateSandbox{Checkpoints: &api.CheckpointPolicy{AfterExec: true, MinExec: "0s"}}},
		{"one flag", []string{"--checkpoints", "every=5m,after_exec,keep=20,keep_for=24h"},
			api.CreateSandbox{Checkpoints: &api.CheckpointPolicy{Every: "5m", AfterExec: true, Keep: 20, KeepFor: "24h"}}},
		{"off", []string{"--checkpoints", "off"}, api.CreateSandbox{Checkpoints: &api.CheckpointPolicy{}}},
		{"from a checkpoint", []string{"--from-checkpoint", "snp_2"}, api.CreateSandbox{FromCheckpoint: "snp_2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCheckpointAPI(t)
			g, stdout, _ := newTestGlobals(t, f.env())
			args := append([]string{"sandbox", "create"}, tt.args...)
			if _, err := run(t.Context(), g, args); err != nil {
				t.Fatalf("run(%q) = %v", args, err)
			}
			if diff := cmp.Diff(tt.want, f.lastCreate(t)); diff != "" {
				t.Errorf("run(%q) sent a create differing (-want +got):\n%s", args, diff)
			}
			if got := stdout.String(); got != "sb-1\n" {
				t.Errorf("run(%q) printed %q, want the ID", args, got)
			}
		})
	}
	// Off is an explicit empty policy, not an absent one (the default).
	f := newCheckpointAPI(t)
	g, _, _ := newTestGlobals(t, f.env())
	if _, err := run(t.Context(), g, []string{"sandbox", "create", "--checkpoints", "off"}); err != nil {
		t.Fatalf("run(sandbox create --checkpoints off) = %v", err)
	}
	if got, want := f.body("POST /v1/sandboxes"), `"checkpoints":{}`; !strings.Contains(got, want) {
		t.Errorf("sandbox create --checkpoints off sent %s, want it to contain %s", got, want)
	}
}

// TestCheckpointUsage checks bad checkpoint flags are usage errors that
// name the flag, and send nothing.
func TestCheckpointUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		says string
	}{
		{"negative every", []string{"sandbox", "create", "--checkpoint-every", "-5s"}, "--checkpoint-every -5s: must not be negative"},
		{"every not a duration", []string{"sandbox", "create", "--checkpoint-every", "often"}, `invalid argument "often" for "--checkpoint-every"`},
		{"every too short", []string{"sandbox", "create", "--checkpoint-every", "100ms"}, "checkpoints.every: 100ms is outside 1s..168h0m0s"},
		{"keep not a number", []string{"sandbox", "create", "--checkpoint-keep", "abc"}, `invalid argument "abc" for "--checkpoint-keep"`},
		{"negative keep", []string{"sandbox", "create", "--checkpoint-keep", "-1"}, "--checkpoint-keep -1: must not be negative"},
		{"keep too many", []string{"sandbox", "create", "--checkpoint-keep", "5000"}, "checkpoints.keep: 5000 is outside 0..1000"},
		{"negative keep-for", []string{"sandbox", "create", "--checkpoint-keep-for", "-1h"}, "--checkpoint-keep-for -1h0m0s: must not be negative"},
		{"bad policy", []string{"sandbox", "create", "--checkpoints", "every=5m,often"}, `--checkpoints "every=5m,often": checkpoint policy: unknown setting "often"`},
		{"policy keep abc", []string{"sandbox", "create", "--checkpoints", "keep=abc"}, `keep="abc" is not a number`},
		{"policy negative every", []string{"sandbox", "create", "--checkpoints", "every=-5s"}, "checkpoints.every: -5s is negative"},
		{"policy both ways", []string{"sandbox", "create", "--checkpoints", "off", "--checkpoint-every", "5m"}, "give the policy one way"},
		{"two sources", []string{"sandbox", "create", "--from-snapshot", "s", "--from-checkpoint", "snp_1"}, "--from-snapshot and --from-checkpoint"},
		{"restore both", []string{"sandbox", "restore", "sb-1", "--snapshot", "s", "--checkpoint", "snp_1"}, "give --snapshot or --checkpoint"},
		{"restore neither", []string{"sandbox", "restore", "sb-1"}, "give --snapshot or --checkpoint"},
		{"policy off and every", []string{"sandbox", "checkpoints", "sb-1", "--off", "--every", "5m"}, "--off and a policy flag"},
		{"policy negative min-exec", []string{"sandbox", "checkpoints", "sb-1", "--min-exec", "-2s"}, "--min-exec -2s: must not be negative"},
		{"policy every too long", []string{"sandbox", "checkpoints", "sb-1", "--every", "200h"}, "checkpoints.every: 200h0m0s is outside 1s..168h0m0s"},
		{"policy without an ID", []string{"sandbox", "checkpoints"}, "accepts 1 arg"},
		{"checkpoint without an ID", []string{"sandbox", "checkpoint"}, "accepts 1 arg"},
		{"history with two IDs", []string{"sandbox", "history", "a", "b"}, "accepts 1 arg"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCheckpointAPI(t)
			g, _, _ := newTestGlobals(t, f.env())
			_, err := run(t.Context(), g, tt.args)
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("run(%q) = %v, want a usage error saying %q", tt.args, err, tt.says)
			}
			f.mu.Lock()
			sent := len(f.bodies)
			f.mu.Unlock()
			if sent > 0 {
				t.Errorf("run(%q) failed but sent %d requests", tt.args, sent)
			}
		})
	}
}

func TestSandboxCheckpointsPolicy(t *testing.T) {
	f := newCheckpointAPI(t)
	space := func(args ...string) string {
		t.Helper()
		g, stdout, _ := newTestGlobals(t, f.env())
		if _, err := run(t.Context(), g, args); err != nil {
			t.Fatalf("run(%q) = %v", args, err)
		}
		return stdout.String()
	}
	if got, want := space("sandbox", "checkpoints", "sb-1"), "every 5m0s, after commands of 2s or more, keep 20\n"; got != want {
		t.Errorf("sandbox checkpoints printed %q, want %q", got, want)
	}
	if got := f.body("PUT /v1/sandboxes/{id}/checkpoints/policy"); got != "" {
		t.Errorf("sandbox checkpoints without flags sent a policy: %s", got)
	}

	// The flags given change those settings; the others are kept.
	got := space("sandbox", "checkpoints", "sb-1", "--keep", "5", "--keep-for", "24h", "--after-exec=false")
	if want := "every 5m0s, keep 5 up to 24h0m0s\n"; got != want {
		t.Errorf("sandbox checkpoints --keep 5 --keep-for 24h --after-exec=false printed %q, want %q", got, want)
	}
	var sent api.CheckpointPolicy
	if err := json.Unmarshal([]byte(f.body("PUT /v1/sandboxes/{id}/checkpoints/policy")), &sent); err != nil {
		t.Fatalf("PUT policy body: %v", err)
	}
	if diff := cmp.Diff(api.CheckpointPolicy{Every: "5m0s", MinExec: "2s", Keep: 5, KeepFor: "24h0m0s"}, sent); diff != "" {
		t.Errorf("sandbox checkpoints sent a policy differing (-want +got):\n%s", diff)
	}

	out := space("sandbox", "checkpoints", "sb-1", "--every", "0", "--after-exec", "-o", "json")
	var p api.CheckpointPolicy
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("sandbox checkpoints -o json printed %q: %v", out, err)
	}
	if diff := cmp.Diff(api.CheckpointPolicy{AfterExec: true, MinExec: "2s", Keep: 5, KeepFor: "24h0m0s"}, p); diff != "" {
		t.Errorf("sandbox checkpoints -o json printed a policy differing (-want +got):\n%s", diff)
	}

	if got, want := space("sandbox", "checkpoints", "sb-1", "--off"), "off\n"; got != want {
		t.Errorf("sandbox checkpoints --off printed %q, want %q", got, want)
	}
	if got, want := f.body("PUT /v1/sandboxes/{id}/checkpoints/policy"), "{}"; got != want {
		t.Errorf("sandbox checkpoints --off sent %s, want %s", got, want)
	}
	if got, want := space("sandbox", "checkpoints", "sb-1"), "off\n"; got != want {
		t.Errorf("sandbox checkpoints after --off printed %q, want %q", got, want)
	}
	if got, want := space("sandbox", "checkpoints", "sb-1", "--every", "1m"), "every 1m0s, keep 20\n"; got != want {
		t.Errorf("sandbox checkpoints --every 1m from off printed %q, want %q", got, want)
	}
	if got, want := space("sandbox", "get", "sb-1"), "checkpoints  every 1m0s, keep 20\n"; !strings.Contains(got, want) {
		t.Errorf("sandbox get printed %q, want it to contain %q", got, want)
	}
}

func TestSandboxCheckpointAndHistory(t *testing.T) {
	f := newCheckpointAPI(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"checkpoint", []string{"sandbox", "checkpoint", "sb-1"}, "snp_4\n"},
		{"history", []string{"sandbox", "history", "sb-1"},
			"ID     CREATED  TRIGGER   STORED  PAUSED  COMMAND\n" +
				"snp_3  30s ago  exec      3.3MiB  31ms    sh -c 'pip install -r requirements.txt && python -m pytes...\n" +
				"snp_2  5m ago   manual    512B    12ms    \n" +
				"snp_1  2h ago   schedule  2.0GiB  140ms   \n"},
		{"empty history", []string{"sandbox", "history", "empty"}, "ID  CREATED  TRIGGER  STORED  PAUSED  COMMAND\n"},
		{"restore", []string{"sandbox", "restore", "sb-1", "--checkpoint", "snp_2"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, stdout, _ := newTestGlobals(t, f.env())
			g.now = func() time.Time { return t0 }
			if _, err := run(t.Context(), g, tt.args); err != nil {
				t.Fatalf("run(%q) = %v", tt.args, err)
			}
			if diff := cmp.Diff(tt.want, stdout.String()); diff != "" {
				t.Errorf("run(%q) output differs (-want +got):\n%s", tt.args, diff)
			}
		})
	}
	if got, want := f.body("POST /v1/sandboxes/{id}/restore"), `{"checkpoint":"snp_2"}`; got != want {
		t.Errorf("sandbox restore --checkpoint sent %s, want %s", got, want)
	}
	g, _, _ := newTestGlobals(t, f.env())
	if _, err := run(t.Context(), g, []string{"sandbox", "restore", "sb-1", "--snapshot", "before"}); err != nil {
		t.Fatalf("sandbox restore --snapshot = %v", err)
	}
	if got, want := f.body("POST /v1/sandboxes/{id}/restore"), `{"snapshot":"before"}`; got != want {
		t.Errorf("sandbox restore --snapshot sent %s, want %s", got, want)
	}

	jsonTests := []struct {
		args []string
		got  func() any
		want any
	}{
		{[]string{"sandbox", "checkpoint", "sb-1", "-o", "json"}, func() any { return new(api.Checkpoint) },
			&api.Checkpoint{ID: "snp_4", SandboxID: "sb-1", CreatedAt: t0, Trigger: api.CheckpointManual,
				StoredBytes: 1 << 20, LogicalBytes: 600 << 20, PausedMS: 9}},
		{[]string{"sandbox", "history", "sb-1", "-o", "json"}, func() any { return new(api.CheckpointList) },
			&api.CheckpointList{Checkpoints: checkpointHistory, Policy: api.CheckpointPolicy{Every: "5m0s", AfterExec: true, MinExec: "2s", Keep: 20}}},
		{[]string{"sandbox", "history", "empty", "-o", "json"}, func() any { return new(api.CheckpointList) },
			&api.CheckpointList{Checkpoints: []api.Checkpoint{}}},
	}
	for _, tt := range jsonTests {
		g, stdout, _ := newTestGlobals(t, f.env())
		if _, err := run(t.Context(), g, tt.args); err != nil {
			t.Fatalf("run(%q) = %v", tt.args, err)
		}
		got := tt.got()
		dec := json.NewDecoder(stdout)
		dec.DisallowUnknownFields()
		if err := dec.Decode(got); err != nil {
			t.Fatalf("run(%q) printed %q: %v", tt.args, stdout, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("run(%q) output differs (-want +got):\n%s", tt.args, diff)
		}
	}

	g, _, stderr := newTestGlobals(t, f.env())
	args := []string{"sandbox", "checkpoint", "stopped"}
	if got := execute(t.Context(), g, args); got != exitFailure {
		t.Errorf("execute(%q) = %d, want %d", args, got, exitFailure)
	}
	if want := "sandbox stopped is stopped (failed_precondition, HTTP 409)"; !strings.Contains(stderr.String(), want) {
		t.Errorf("execute(%q) stderr = %q, want it to contain %q", args, stderr, want)
	}
}

func TestBytesText(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0B"}, {1023, "1023B"}, {1024, "1.0KiB"}, {1536, "1.5KiB"}, {5 << 20, "5.0MiB"},
		{3 << 30, "3.0GiB"}, {2 << 40, "2.0TiB"}, {4096 << 40, "4096.0TiB"},
	}
	for _, tt := range tests {
		if got := bytesText(tt.n); got != tt.want {
			t.Errorf("bytesText(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestServerFlagsUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		says string
	}{
		{"bad policy", []string{"--checkpoints", "every=often"}, `--checkpoints "every=often": policy.every: "often" is not a duration`},
		{"negative every", []string{"--checkpoints", "every=-5s"}, "policy.every: -5s is negative"},
		{"unknown setting", []string{"--checkpoints", "sometimes"}, `unknown setting "sometimes"`},
		{"keep abc", []string{"--checkpoints", "keep=abc"}, `keep="abc" is not a number`},
		{"zero gc interval", []string{"--chunk-gc-interval", "0"}, "--chunk-gc-interval 0s: want a positive duration"},
		{"negative gc interval", []string{"--chunk-gc-interval", "-1m"}, "--chunk-gc-interval -1m0s: want a positive duration"},
		{"gc interval not a duration", []string{"--chunk-gc-interval", "often"}, `invalid argument "often" for "--chunk-gc-interval"`},
		{"on-timeout later", []string{"--on-timeout", "later"}, `--on-timeout "later": want delete or suspend`},
		{"timeout too long", []string{"--timeout", "200h"}, "--timeout 200h0m0s: want 1s..168h0m0s"},
		{"timeout zero", []string{"--timeout", "0"}, "--timeout 0s: want 1s..168h0m0s"},
		{"webhooks disabled at once", []string{"--webhook-disable-after", "0"}, "--webhook-disable-after 0: want a number of failed attempts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _, _ := newTestGlobals(t, nil)
			args := append([]string{"server", "--vmm", "fake", "--listen", "127.0.0.1:0"}, tt.args...)
			_, err := run(t.Context(), g, args)
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("run(%q) = %v, want a usage error saying %q", args, err, tt.says)
			}
		})
	}
}
