package origin

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRequestIDOf(t *testing.T) {
	for _, tc := range []struct {
		sent string
		keep bool
	}{
		{"abc-123_x.y:z", true},
		{"", false},
		{"has space", false},
		{"new\nline", false},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if tc.sent != "" {
			r.Header.Set(Header, tc.sent)
		}
		got := RequestIDOf(r)
		if tc.keep && got != tc.sent {
			t.Errorf("RequestIDOf(%q) = %q, want it kept", tc.sent, got)
		}
		if !tc.keep && (got == tc.sent || !strings.HasPrefix(got, "req_")) {
			t.Errorf("RequestIDOf(%q) = %q, want a new req_ ID", tc.sent, got)
		}
	}
}

func TestMiddlewareAndLog(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(LogHandler(slog.NewTextHandler(&logged, nil)))
	h := Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := SetActor(r.Context(), KindKey, "key_1")
		log.InfoContext(ctx, "did it")
	}))
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/v1/sandboxes", nil)
	r.Header.Set(Header, "client-7")
	h.ServeHTTP(w, r)
	if got := w.Header().Get(Header); got != "client-7" {
		t.Errorf("answered request ID %q, want client-7", got)
	}
	if s := logged.String(); !strings.Contains(s, "request_id=client-7") || !strings.Contains(s, "actor=api_key:key_1") {
		t.Errorf("log line %q lacks the request ID or actor", s)
	}
	if o := From(context.Background()); o != (Origin{}) {
		t.Errorf("From(empty) = %+v", o)
	}
	if a := From(Background(context.Background(), KindPolicy, "timeout")).Actor(); a != "policy:timeout" {
		t.Errorf("Background actor = %q", a)
	}
}
