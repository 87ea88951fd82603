package worker

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/workerproto"
)

// TestHandlerRoutes checks the worker's handler serves every verb of the
// worker protocol (its own JSON answer, not the mux's 404 or 405) and
// that the data-plane routes stay below workerproto.DataPattern, apart
// from the verbs.
func TestHandlerRoutes(t *testing.T) {
	w := newTestWorker(t)
	h := w.Handler("")
	verbs := map[string]bool{}
	for _, d := range workerproto.Defs() {
		verbs[d.Pattern()] = true
		path := workerproto.PathPrefix + strings.Replace(d.Path, "{id}", "sbx_aaaaaaaaaaaaaaaaaaaa", 1)
		var body *strings.Reader
		if d.Method == http.MethodPost && !strings.HasSuffix(path, "/pause") && !strings.HasSuffix(path, "/resume") || d.Method == http.MethodPut {
			body = strings.NewReader("{}")
		} else {
			body = strings.NewReader("")
		}
		req := httptest.NewRequest(d.Method, path, body)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		ct := rec.Header().Get("Content-Type")
		if rec.Code/100 != 2 && !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s %s (verb %s) = %d %s %q: not the verb's answer", d.Method, path, d.Name, rec.Code, ct, rec.Body.String())
		}
	}
	for _, r := range w.dataRoutes() {
		method, path, ok := strings.Cut(r.pattern, " ")
		if !ok {
			path = method
		}
		if !strings.HasPrefix(path, workerproto.DataPattern+"/") {
			t.Errorf("data-plane route %s is not below %s", r.pattern, workerproto.DataPattern)
		}
		if verbs[r.pattern] {
			t.Errorf("data-plane route %s is also a verb", r.pattern)
		}
	}
}

// TestStatusProtocol checks the worker states its protocol version and
// capabilities in its status.
func TestStatusProtocol(t *testing.T) {
	w, err := New(Config{ID: "unit", DataDir: t.TempDir(), RunRoot: t.TempDir(), Driver: neverBoots{}, Templates: noTemplates{}, Fencing: true,
		VMM: VMMInfo{Kind: "qemu", Version: "7.2.19", Accel: "tcg", DiffSnapshots: true}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer w.Close()
	st, err := w.Status(t.Context())
	if err != nil {
		t.Fatalf("Status = %v", err)
	}
	want := workerproto.Capabilities{VMM: "qemu", VMMVersion: "7.2.19", Accel: "tcg", NICs: []string{workerproto.NICSocket}, Fencing: true}
	if st.Protocol != workerproto.Version {
		t.Errorf("Status().Protocol = %d, want %d", st.Protocol, workerproto.Version)
	}
	// neverBoots restores nothing: no snapshots, so no diff snapshots.
	if diff := cmp.Diff(want, st.Capabilities); diff != "" {
		t.Errorf("Status().Capabilities (-want +got):\n%s", diff)
	}
	if err := st.Capabilities.Validate(); err != nil {
		t.Errorf("Status().Capabilities.Validate() = %v", err)
	}
}
