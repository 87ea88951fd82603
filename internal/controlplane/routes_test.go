package controlplane

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/store/sqlite"
)

// TestRoutesMatchOpenAPI fails when a served route is missing from
// api/openapi.yaml or the document names a route that is not served.
func TestRoutesMatchOpenAPI(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer st.Close()
	s, err := New(Config{Store: st, Templates: []string{"default"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	doc, err := api.Routes()
	if err != nil {
		t.Fatalf("api.Routes() = %v", err)
	}
	documented := map[string]bool{}
	for _, r := range doc {
		documented[r.String()] = true
	}
	served := map[string]bool{}
	for _, r := range s.Routes() {
		served[r] = true
	}
	if diff := cmp.Diff(documented, served); diff != "" {
		t.Errorf("served routes differ from api/openapi.yaml (-documented +served):\n%s", diff)
	}
}

// TestMethodNotAllowed checks a wrong method gets a JSON 405 naming the
// allowed ones.
func TestMethodNotAllowed(t *testing.T) {
	st, err := sqlite.Open(t.Context(), t.TempDir()+"/space.db")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer st.Close()
	s, err := New(Config{Store: st, Templates: []string{"default"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("PATCH", "/v1/sandboxes", nil))
	var e api.Error
	if rec.Code != 405 || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Message == "" || rec.Header().Get("Allow") == "" {
		t.Errorf("PATCH /v1/sandboxes = %d %s (Allow %q), want a JSON 405", rec.Code, rec.Body, rec.Header().Get("Allow"))
	}
}
