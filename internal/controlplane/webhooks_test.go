package controlplane

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"space/api"
	"space/internal/testenv"
	"space/internal/webhook"
)

// hookReceiver is a webhook receiver on loopback that keeps the
// deliveries it got.
type hookReceiver struct {
	srv *httptest.Server

	mu sync.Mutex
	// +checklocks:mu
	got []hookDelivery
}

type hookDelivery struct {
	header http.Header
	body   []byte
	ev     webhook.Event
}

func newHookReceiver(t *testing.T) *hookReceiver {
	t.Helper()
	rc := &hookReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev webhook.Event
		_ = json.Unmarshal(body, &ev)
		rc.mu.Lock()
		rc.got = append(rc.got, hookDelivery{header: r.Header.Clone(), body: body, ev: ev})
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *hookReceiver) deliveries() []hookDelivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

// typesOf lists the types of the events about sandbox id that rc got.
func (rc *hookReceiver) typesOf(id string) []string {
	var out []string
	for _, d := range rc.deliveries() {
		if d.ev.SandboxID == id {
			out = append(out, d.ev.Type)
		}
	}
	return out
}

// webhookServer is a leading server with wk as its worker whose webhooks
// may reach loopback and retry within milliseconds.
func webhookServer(t *testing.T, wk Worker) (*Server, func(method, path, body string) (int, []byte)) {
	t.Helper()
	s, _, do := configuredServer(t, wk, Config{Webhooks: WebhookConfig{
		AllowPrivate: true, Poll: 10 * time.Millisecond, FirstBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.Eventually(t, 10*time.Second, s.Leading)
	return s, do
}

func createHook(t *testing.T, do func(method, path, body string) (int, []byte), body string) api.Webhook {
	t.Helper()
	code, resp := do("POST", "/v1/webhooks", body)
	var h api.Webhook
	if code != http.StatusCreated || json.Unmarshal(resp, &h) != nil {
		t.Fatalf("setup: POST /v1/webhooks %s = %d %s", body, code, resp)
	}
	return h
}

// TestWebhookDeliversLifecycle: a sandbox created through the API
// reaches the team's webhook as "created" then "running", signed with the
// secret its creation answered; the delivery log lists the attempts.
func TestWebhookDeliversLifecycle(t *testing.T) {
	_, do := webhookServer(t, &failsNthCreate{})
	rc := newHookReceiver(t)
	hook := createHook(t, do, `{"url":"`+rc.srv.URL+`/in","types":["created","running"],"description":"ci"}`)
	if !strings.HasPrefix(hook.Secret, webhook.SecretPrefix) || !hook.Enabled || hook.Cursor != "0" || !slices.Equal(hook.Types, []string{"created", "running"}) {
		t.Fatalf("POST /v1/webhooks = %+v, want enabled, a whsec_ secret, the types asked", hook)
	}

	sb := mustCreate(t, do)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(rc.typesOf(sb.ID)) >= 2 })
	if got, want := rc.typesOf(sb.ID), []string{"created", "running"}; !slices.Equal(got, want) {
		t.Errorf("webhook got %v for %s, want %v", got, sb.ID, want)
	}
	for _, d := range rc.deliveries() {
		if err := webhook.Verify(hook.Secret, d.header, d.body, time.Now(), 0); err != nil {
			t.Errorf("Verify(%s) = %v, want nil", d.ev.ID, err)
		}
		if d.header.Get(webhook.HeaderID) != d.ev.ID || !strings.HasPrefix(d.ev.ID, "evt_") || d.ev.Team != DefaultTeam || d.ev.Actor == "" || d.ev.RequestID == "" {
			t.Errorf("delivery %+v: want id evt_… in header and body, team %s, an actor and a request ID", d.ev, DefaultTeam)
		}
	}
	// The secret is shown once.
	code, body := do("GET", "/v1/webhooks/"+hook.ID, "")
	var got api.Webhook
	if code != 200 || json.Unmarshal(body, &got) != nil || got.Secret != "" || got.ID != hook.ID {
		t.Errorf("GET /v1/webhooks/%s = %d %s, want it without its secret", hook.ID, code, body)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		_, body := do("GET", "/v1/webhooks/"+hook.ID+"/deliveries", "")
		var log api.WebhookDeliveryList
		return json.Unmarshal(body, &log) == nil && len(log.Deliveries) == 2 &&
			log.Deliveries[0].Delivered && log.Deliveries[0].StatusCode == 200 && log.Deliveries[0].EventType == "running" &&
			log.Deliveries[1].EventType == "created" && log.Deliveries[1].Attempt == 1
	})

	// A test sends a ping now.
	code, body = do("POST", "/v1/webhooks/"+hook.ID+"/test", "")
	var ping api.WebhookDelivery
	if code != 200 || json.Unmarshal(body, &ping) != nil || !ping.Delivered || ping.EventType != "ping" {
		t.Errorf("POST /test = %d %s, want a delivered ping", code, body)
	}
	last := rc.deliveries()[len(rc.deliveries())-1]
	if last.ev.Type != "ping" || webhook.Verify(hook.Secret, last.header, last.body, time.Now(), 0) != nil {
		t.Errorf("receiver's last delivery = %+v, want a signed ping", last.ev)
	}
}

// TestWebhookHungReceiver: a receiver that never answers delays neither
// a create through the API nor another webhook's deliveries.
func TestWebhookHungReceiver(t *testing.T) {
	_, do := webhookServer(t, &failsNthCreate{})
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) })
	rc := newHookReceiver(t)
	createHook(t, do, `{"url":"`+hung.URL+`"}`)
	createHook(t, do, `{"url":"`+rc.srv.URL+`"}`)

	mustCreate(t, do) // the hung receiver now holds an attempt
	start := time.Now()
	sb := mustCreate(t, do)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("create took %v while a receiver hung, want well under 2s", d)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Contains(rc.typesOf(sb.ID), "running") })
}

// TestWebhookAPIRefuses: bad input is a 400 naming the field, and
// changes nothing; another team's webhook is not found.
func TestWebhookAPIRefuses(t *testing.T) {
	s, _, do := configuredServer(t, &failsNthCreate{}, Config{}) // private targets not allowed
	for _, tt := range []struct{ name, body, want string }{
		{"loopback", `{"url":"https://127.0.0.1:8443/"}`, "127.0.0.1 is a loopback address"},
		{"localhost", `{"url":"https://localhost/"}`, "loopback"},
		{"metadata", `{"url":"https://169.254.169.254/latest/meta-data/"}`, "cloud metadata"},
		{"private", `{"url":"https://10.0.0.7/hook"}`, "10.0.0.7 is a private address"},
		{"http", `{"url":"http://hooks.example.com/"}`, "must be https"},
		{"no url", `{}`, "url"},
		{"unknown type", `{"url":"https://93.184.216.34/","types":["created","exploded"]}`, `unknown event type \"exploded\"`},
		{"type e2b lacks", `{"url":"https://93.184.216.34/","format":"e2b","types":["running"]}`, `\"running\" has no E2B counterpart`},
		{"format", `{"url":"https://93.184.216.34/","format":"slack"}`, "want space or e2b"},
		{"short secret", `{"url":"https://93.184.216.34/","secret":"hunter2"}`, "16 to 256 printable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do("POST", "/v1/webhooks", tt.body)
			if code != 400 || !strings.Contains(string(body), tt.want) {
				t.Errorf("POST /v1/webhooks %s = %d %s, want 400 containing %q", tt.body, code, body, tt.want)
			}
		})
	}
	if _, body := do("GET", "/v1/webhooks", ""); !strings.Contains(string(body), `"webhooks":[]`) {
		t.Errorf("GET /v1/webhooks after refusals = %s, want none", body)
	}

	// A public address literal needs no DNS.
	hook := createHook(t, do, `{"url":"https://93.184.216.34/hook"}`)
	if code, body := do("PATCH", "/v1/webhooks/"+hook.ID, `{"url":"https://192.168.0.1/"}`); code != 400 || !strings.Contains(string(body), "private") {
		t.Errorf("PATCH to a private url = %d %s, want 400", code, body)
	}
	code, body := do("PATCH", "/v1/webhooks/"+hook.ID, `{"enabled":false,"types":["deleted"]}`)
	var upd api.Webhook
	if code != 200 || json.Unmarshal(body, &upd) != nil || upd.Enabled || !slices.Equal(upd.Types, []string{"deleted"}) || upd.URL != hook.URL {
		t.Errorf("PATCH enabled false = %d %s", code, body)
	}

	code, body = do("POST", "/v1/apikeys", `{"team":"other","name":"o"}`)
	var other api.APIKey
	if code != 201 || json.Unmarshal(body, &other) != nil {
		t.Fatalf("setup: POST /v1/apikeys = %d %s", code, body)
	}
	h := s.Handler()
	as := func(method, path, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+other.Secret)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/webhooks/" + hook.ID, ""},
		{"PATCH", "/v1/webhooks/" + hook.ID, `{"enabled":true}`},
		{"DELETE", "/v1/webhooks/" + hook.ID, ""},
		{"GET", "/v1/webhooks/" + hook.ID + "/deliveries", ""},
		{"POST", "/v1/webhooks/" + hook.ID + "/test", ""},
	} {
		if code := as(c.method, c.path, c.body); code != 404 {
			t.Errorf("%s %s as another team = %d, want 404", c.method, c.path, code)
		}
	}
	if code, _ := do("DELETE", "/v1/webhooks/"+hook.ID, ""); code != 204 {
		t.Errorf("DELETE = %d, want 204", code)
	}
	if code, _ := do("GET", "/v1/webhooks/"+hook.ID, ""); code != 404 {
		t.Errorf("GET after DELETE = %d, want 404", code)
	}
}
