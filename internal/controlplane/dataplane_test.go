package controlplane

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"space/api"
)

// echoingWorker is an instantWorker whose data plane answers with the
// path it was asked.
type echoingWorker struct{ instantWorker }

func (w *echoingWorker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(rw, "worker saw %s %s", r.Method, r.URL.Path)
}

// TestDataPlaneToken checks a sandbox names its data plane with a token,
// and that a request with the token is served without the store: it
// still works once the store is closed.
func TestDataPlaneToken(t *testing.T) {
	s, st, key := registerServer(t)
	s.AddWorker(&echoingWorker{})
	s.mu.Lock()
	s.seen["instant"] = time.Now().Add(time.Hour)
	s.mu.Unlock()
	h := s.Handler()
	do := func(auth, method, path, body string) (int, string) {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+auth)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	code, body := do(key, "POST", "/v1/sandboxes", `{}`)
	var sb api.Sandbox
	if code != 201 || json.Unmarshal([]byte(body), &sb) != nil || sb.DataPlane == nil {
		t.Fatalf("create = %d %s, want a sandbox with a data plane", code, body)
	}
	dp := sb.DataPlane
	if dp.URL != "" || !strings.HasPrefix(dp.Token, "sdp1_") || dp.ExpiresAt.Before(time.Now().Add(DefaultDataPlaneTTL-time.Minute)) {
		t.Errorf("data plane = %+v, want this server (url \"\"), an sdp1_ token, valid for %s", dp, DefaultDataPlaneTTL)
	}
	code, body = do(key, "POST", "/v1/sandboxes", `{}`)
	var other api.Sandbox
	if code != 201 || json.Unmarshal([]byte(body), &other) != nil {
		t.Fatalf("create = %d %s", code, body)
	}
	st.Close() // from here on, nothing may need the database
	want := "worker saw POST /worker/v1/sandboxes/" + sb.ID + "/exec"
	if code, body := do(dp.Token, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"argv":["true"]}`); code != 200 || body != want {
		t.Errorf("exec with the token = %d %q, want 200 %q", code, body, want)
	}
	if code, body := do(dp.Token, "POST", "/v1/sandboxes/"+other.ID+"/exec", `{}`); code != 404 {
		t.Errorf("exec in another sandbox with the token = %d %s, want 404", code, body)
	}
	if code, body := do(dp.Token, "DELETE", "/v1/sandboxes/"+sb.ID, ``); code != 404 || !strings.Contains(body, "no data-plane route") {
		t.Errorf("delete with a data-plane token = %d %s, want 404: the token opens the data plane only", code, body)
	}
	if code, body := do("sdp1_forged", "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/x", ``); code != 401 {
		t.Errorf("forged token = %d %s, want 401", code, body)
	}
}
