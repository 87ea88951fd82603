package main

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"space/api"
	"space/internal/controlplane"
	"space/internal/store/sqlite"
)

// TestAuditVerbs runs the audit verbs against a real control plane (on a
// SQLite file, no workers): ls shows what the key verbs did, verify
// passes on the server's log and on an export, and fails naming the
// entry once a row is edited in the database.
func TestAuditVerbs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "space.db")
	st, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	cp, err := controlplane.New(controlplane.Config{Store: st, Templates: []string{"default"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	admin, err := cp.Bootstrap(t.Context(), false)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	srv := httptest.NewServer(cp.Handler())
	t.Cleanup(srv.Close)
	env := map[string]string{"SPACE_API_URL": srv.URL, "SPACE_API_KEY": admin}
	run := func(args ...string) (code int, stdout, stderr string) {
		t.Helper()
		g, out, errb := newTestGlobals(t, env)
		code = execute(t.Context(), g, args)
		return code, out.String(), errb.String()
	}

	for _, name := range []string{"ci", "deploy"} {
		if code, _, stderr := run("apikey", "create", "--name", name); code != 0 {
			t.Fatalf("setup: apikey create = %d %s", code, stderr)
		}
	}
	resp, err := http.Post(srv.URL+"/v1/sandboxes", "application/json", strings.NewReader(`{}`))
	if err != nil || resp.StatusCode != 401 {
		t.Fatalf("setup: POST without a key = %v, %v; want 401", resp, err)
	}
	resp.Body.Close()

	code, stdout, stderr := run("audit", "ls")
	if code != 0 {
		t.Fatalf("audit ls = %d %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "SEQ") || !strings.Contains(lines[1], "/v1/apikeys") ||
		!strings.Contains(lines[3], "unauthenticated") || !strings.Contains(lines[3], "401") {
		t.Errorf("audit ls =\n%s\nwant a header, two key creates and a 401", stdout)
	}
	code, stdout, stderr = run("audit", "ls", "--json", "--limit", "2")
	var l api.AuditList
	if code != 0 || json.Unmarshal([]byte(stdout), &l) != nil || len(l.Entries) != 2 || l.Entries[1].Seq != 2 {
		t.Errorf("audit ls --json --limit 2 = %d %s %s, want entries 1 and 2", code, stdout, stderr)
	}

	if code, stdout, stderr := run("audit", "verify"); code != 0 || stdout != "audit log intact: 3 entries from seq 1 to 3\n" {
		t.Errorf("audit verify = %d %q %q, want 3 entries intact", code, stdout, stderr)
	}
	code, export, stderr := run("audit", "export")
	if code != 0 {
		t.Fatalf("audit export = %d %s", code, stderr)
	}
	file := filepath.Join(t.TempDir(), "audit.ndjson")
	if err := os.WriteFile(file, []byte(export), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if code, stdout, stderr := run("audit", "verify", "--file", file); code != 0 || !strings.Contains(stdout, "intact: 3 entries") {
		t.Errorf("audit verify --file = %d %q %q, want 3 entries intact", code, stdout, stderr)
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE audit_log SET key_id = 'key_someone_else' WHERE seq = 2`); err != nil {
		t.Fatalf("setup: %v", err)
	}
	code, stdout, stderr = run("audit", "verify")
	if code != exitFailure || stdout != "" || !strings.Contains(stderr, "seq 2:") || !strings.Contains(stderr, "edited") {
		t.Errorf("audit verify after an UPDATE of seq 2 = %d %q %q, want failure naming seq 2", code, stdout, stderr)
	}
	// The export taken before still verifies offline.
	if code, _, stderr := run("audit", "verify", "--file", file); code != 0 {
		t.Errorf("audit verify --file (the earlier export) = %d %s", code, stderr)
	}
	// An export with a line taken out does not.
	cut := strings.Split(export, "\n")
	os.WriteFile(file, []byte(strings.Join(append(cut[:2:2], cut[3:]...), "\n")), 0o600)
	if code, _, stderr := run("audit", "verify", "--file", file); code != exitFailure || !strings.Contains(stderr, "seq 3:") {
		t.Errorf("audit verify --file (entry 2 cut) = %d %s, want failure naming seq 3", code, stderr)
	}
	// One the server could not finish.
	os.WriteFile(file, []byte(strings.Join(append(cut[:2:2], `{"error":{"code":"unavailable","message":"store gone"}}`), "\n")), 0o600)
	if code, _, stderr := run("audit", "verify", "--file", file); code != exitFailure || !strings.Contains(stderr, "cut short after entry 1: store gone") {
		t.Errorf("audit verify --file (ends with an error line) = %d %s, want failure: cut short", code, stderr)
	}
	os.WriteFile(file, []byte(strings.Join(cut[1:], "\n")), 0o600)
	if code, _, stderr := run("audit", "verify", "--file", file); code != exitFailure || !strings.Contains(stderr, "anchor") {
		t.Errorf("audit verify --file (no anchor line) = %d %s, want failure about the anchor", code, stderr)
	}
}
