package client

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
)

// history is what the fake checkpoint server lists for sandbox sb-1.
var history = api.CheckpointList{
	Checkpoints: []api.Checkpoint{
		{ID: "snp_2", SandboxID: "sb-1", CreatedAt: t0, Trigger: api.CheckpointExec, Command: "make test",
			StoredBytes: 4 << 20, LogicalBytes: 600 << 20, ReadBytes: 8 << 20, PausedMS: 31},
		{ID: "snp_1", SandboxID: "sb-1", CreatedAt: t0, Trigger: api.CheckpointSchedule, StoredBytes: 90 << 20,
			LogicalBytes: 600 << 20, PausedMS: 40},
	},
	Policy: api.CheckpointPolicy{Every: "5m0s", AfterExec: true, MinExec: "2s", Keep: 20},
}

// newCheckpointServer plays the checkpoint routes. Sandbox "stopped" is
// not running (failed_precondition); a policy whose every is "bad" is
// refused (field policy.every); PUT echoes any other policy in the
// sandbox, nil when it takes none; restore echoes the checkpoint it was
// given in the sandbox's template and refuses a body that names a
// snapshot too.
func newCheckpointServer(t *testing.T) *Client {
	t.Helper()
	mux := http.NewServeMux()
	stopped := func(w http.ResponseWriter, r *http.Request) bool {
		if r.PathValue("id") != "stopped" {
			return false
		}
		writeError(w, http.StatusConflict, api.CodeFailedPrecondition, "sandbox stopped is stopped", "")
		return true
	}
	mux.HandleFunc("GET /v1/sandboxes/{id}/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "sb-1" {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "sandbox "+r.PathValue("id")+" not found", "")
			return
		}
		writeJSON(w, http.StatusOK, history)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/checkpoints", func(w http.ResponseWriter, r *http.Request) {
		if stopped(w, r) {
			return
		}
		writeJSON(w, http.StatusCreated, api.Checkpoint{ID: "snp_3", SandboxID: r.PathValue("id"), CreatedAt: t0,
			Trigger: api.CheckpointManual, StoredBytes: 1 << 20, LogicalBytes: 600 << 20, PausedMS: 12})
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/checkpoints/policy", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testKey || r.Header.Get("Content-Type") != "application/json" {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "want the key and a JSON body", "")
			return
		}
		var p api.CheckpointPolicy
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, err.Error(), "")
			return
		}
		if stopped(w, r) {
			return
		}
		if p.Every == "bad" {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, `policy.every: "bad" is not a duration like 90s, 5m or 24h`, "policy.every")
			return
		}
		sb := api.Sandbox{ID: r.PathValue("id"), State: "running", CreatedAt: t0, UpdatedAt: t0}
		if p.Every != "" || p.AfterExec {
			sb.Checkpoints = &p
		}
		writeJSON(w, http.StatusOK, sb)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/restore", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]string
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, err.Error(), "")
			return
		}
		if _, both := req["snapshot"]; both {
			writeError(w, http.StatusBadRequest, api.CodeInvalidArgument, "give a snapshot or a checkpoint, not both", "snapshot")
			return
		}
		if stopped(w, r) {
			return
		}
		writeJSON(w, http.StatusOK, api.Sandbox{ID: r.PathValue("id"), Template: req["checkpoint"], State: "running", CreatedAt: t0, UpdatedAt: t0})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, testKey)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return c
}

func TestCheckpoints(t *testing.T) {
	c := newCheckpointServer(t)
	got, err := c.Checkpoints(t.Context(), "sb-1")
	if err != nil {
		t.Fatalf("Checkpoints(sb-1) = %v", err)
	}
	if diff := cmp.Diff(history, got); diff != "" {
		t.Errorf("Checkpoints(sb-1) differs (-want +got):\n%s", diff)
	}
	if _, err := c.Checkpoints(t.Context(), "nope"); !IsNotFound(err) {
		t.Errorf("Checkpoints(nope) = %v, want IsNotFound", err)
	}
}

func TestCreateCheckpoint(t *testing.T) {
	c := newCheckpointServer(t)
	got, err := c.CreateCheckpoint(t.Context(), "sb-1")
	if err != nil {
		t.Fatalf("CreateCheckpoint(sb-1) = %v", err)
	}
	want := api.Checkpoint{ID: "snp_3", SandboxID: "sb-1", CreatedAt: t0, Trigger: api.CheckpointManual,
		StoredBytes: 1 << 20, LogicalBytes: 600 << 20, PausedMS: 12}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CreateCheckpoint(sb-1) differs (-want +got):\n%s", diff)
	}
	if _, err := c.CreateCheckpoint(t.Context(), "stopped"); !IsConflict(err) {
		t.Errorf("CreateCheckpoint(stopped) = %v, want IsConflict", err)
	}
}

func TestSetCheckpointPolicy(t *testing.T) {
	c := newCheckpointServer(t)
	tests := []struct {
		name    string
		id      string
		p       api.CheckpointPolicy
		want    *api.CheckpointPolicy // the sandbox's Checkpoints
		wantErr *Error
	}{
		{name: "schedule", id: "sb-1", p: api.CheckpointPolicy{Every: "5m", Keep: 3, KeepFor: "24h"},
			want: &api.CheckpointPolicy{Every: "5m", Keep: 3, KeepFor: "24h"}},
		{name: "after exec", id: "sb-1", p: api.CheckpointPolicy{AfterExec: true, MinExec: "10s"},
			want: &api.CheckpointPolicy{AfterExec: true, MinExec: "10s"}},
		{name: "off", id: "sb-1", p: api.CheckpointPolicy{}},
		{name: "bad every", id: "sb-1", p: api.CheckpointPolicy{Every: "bad"},
			wantErr: &Error{Status: 400, Code: api.CodeInvalidArgument, Message: `policy.every: "bad" is not a duration like 90s, 5m or 24h`, Field: "policy.every"}},
		{name: "stopped", id: "stopped", p: api.CheckpointPolicy{Every: "1m"},
			wantErr: &Error{Status: 409, Code: api.CodeFailedPrecondition, Message: "sandbox stopped is stopped"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb, err := c.SetCheckpointPolicy(t.Context(), tt.id, tt.p)
			if tt.wantErr != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("SetCheckpointPolicy(%q, %+v) = %v, want an *Error", tt.id, tt.p, err)
				}
				if diff := cmp.Diff(tt.wantErr, e); diff != "" {
					t.Errorf("SetCheckpointPolicy(%q, %+v) error differs (-want +got):\n%s", tt.id, tt.p, diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("SetCheckpointPolicy(%q, %+v) = %v", tt.id, tt.p, err)
			}
			if diff := cmp.Diff(tt.want, sb.Checkpoints); diff != "" {
				t.Errorf("SetCheckpointPolicy(%q, %+v) policy differs (-want +got):\n%s", tt.id, tt.p, diff)
			}
		})
	}
}

func TestRestoreCheckpoint(t *testing.T) {
	c := newCheckpointServer(t)
	sb, err := c.RestoreCheckpoint(t.Context(), "sb-1", "snp_2")
	if err != nil {
		t.Fatalf("RestoreCheckpoint(sb-1, snp_2) = %v", err)
	}
	if sb.ID != "sb-1" || sb.Template != "snp_2" {
		t.Errorf("RestoreCheckpoint(sb-1, snp_2) = sandbox %s restored from %q, want sb-1 from snp_2", sb.ID, sb.Template)
	}
	if _, err := c.RestoreCheckpoint(t.Context(), "stopped", "snp_2"); !IsConflict(err) {
		t.Errorf("RestoreCheckpoint(stopped, snp_2) = %v, want IsConflict", err)
	}
}
