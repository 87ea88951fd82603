package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/webhook"

	"github.com/prometheus/client_golang/prometheus"
)

// WebhookConfig configures the delivery of the teams' webhooks (package
// webhook). The zero value is the production setting.
type WebhookConfig struct {
	// AllowPrivate lets webhooks reach private, loopback, link-local and
	// this host's own addresses, over http too: an administrator's
	// choice for receivers on the control plane's own network. false =
	// only https to public addresses.
	AllowPrivate bool
	// DisableAfter is how many failed attempts in a row disable a
	// webhook; 0 = webhook.DefaultDisableAfter, negative = never.
	DisableAfter int
	// Poll, FirstBackoff and MaxBackoff are the dispatcher's timings
	// (webhook.Config); 0 = its defaults. For tests.
	Poll, FirstBackoff, MaxBackoff time.Duration
}

// maxWebhooks bounds a team's webhooks: each has a goroutine on the
// leader.
const maxWebhooks = 20

// newWebhooks makes the server's webhook guard, sender and dispatcher.
func (s *Server) newWebhooks(reg prometheus.Registerer) error {
	s.hookGuard = &webhook.Guard{AllowPrivate: s.cfg.Webhooks.AllowPrivate}
	var err error
	s.hookSender, err = webhook.NewSender(webhook.SenderConfig{Guard: s.hookGuard, Now: s.now, UserAgent: "space-webhooks/" + s.cfg.Version})
	if err != nil {
		return err
	}
	m, err := webhook.NewMetrics(reg)
	if err != nil {
		return err
	}
	wc := s.cfg.Webhooks
	s.hooks, err = webhook.New(webhook.Config{
		Metrics: m,
		Source:  webhook.StoreEvents{Store: s.cfg.Store}, Hooks: s.cfg.Store, Sender: s.hookSender,
		Poll: wc.Poll, FirstBackoff: wc.FirstBackoff, MaxBackoff: wc.MaxBackoff, DisableAfter: wc.DisableAfter,
		Log: s.cfg.Log,
	})
	return err
}

// runWebhooks delivers webhooks until ctx ends: the leader's work.
func (s *Server) runWebhooks(ctx context.Context) {
	if err := s.hooks.Run(ctx); err != nil {
		s.log.Error("webhook delivery", "err", err)
	}
}

func webhookView(w store.Webhook) api.Webhook {
	types := w.Types
	if types == nil {
		types = []string{}
	}
	format := "space"
	if w.Format != "" {
		format = w.Format
	}
	return api.Webhook{
		ID: w.ID, URL: w.URL, Types: types, Description: w.Description, Format: format, Enabled: w.Enabled,
		DisabledReason: w.DisabledReason, Cursor: strconv.FormatInt(w.Cursor, 10), Failures: w.Failures,
		CreatedAt: w.Created, UpdatedAt: w.Updated,
	}
}

func deliveryView(d store.WebhookDelivery) api.WebhookDelivery {
	id := "ping"
	if d.EventSeq != 0 {
		id = webhook.EventID(d.EventSeq)
	}
	return api.WebhookDelivery{
		ID: d.ID, EventID: id, EventType: d.EventType, Attempt: d.Attempt, Time: d.Time,
		StatusCode: d.StatusCode, Error: d.Error, DurationMS: d.Duration.Milliseconds(), Delivered: d.Delivered,
	}
}

// webhookFormat is the store's format of an API's, or an error naming
// the field.
func webhookFormat(f string) (string, error) {
	switch f {
	case "", "space":
		return "", nil
	case store.WebhookFormatE2B:
		return f, nil
	}
	return "", httpapi.Invalid("format", "%.32q: want space or e2b", f)
}

// checkWebhookSecret refuses a secret a user chose that is too short or
// not printable ASCII.
func checkWebhookSecret(secret string) error {
	if len(secret) < 16 || len(secret) > 256 || strings.ContainsFunc(secret, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return httpapi.Invalid("secret", "want 16 to 256 printable ASCII characters without spaces")
	}
	return nil
}

// checkWebhookTypes refuses an unknown or repeated event type, naming it;
// an E2B webhook takes only the types E2B has.
func checkWebhookTypes(types []string, format string) error {
	if len(types) > len(sandbox.EventTypes) {
		return httpapi.Invalid("types", "%d types; there are only %d", len(types), len(sandbox.EventTypes))
	}
	seen := map[string]bool{}
	for _, t := range types {
		if !sandbox.ValidEventType(t) {
			return httpapi.Invalid("types", "unknown event type %.64q (known: %v)", t, sandbox.EventTypes)
		}
		if _, ok := webhook.E2BTypes[t]; format == store.WebhookFormatE2B && !ok {
			return httpapi.Invalid("types", "event type %q has no E2B counterpart", t)
		}
		if seen[t] {
			return httpapi.Invalid("types", "%q is listed twice", t)
		}
		seen[t] = true
	}
	return nil
}

// checkWebhookURL refuses a URL the guard refuses, naming the address.
func (s *Server) checkWebhookURL(ctx context.Context, url string) error {
	if url == "" || len(url) > 2048 {
		return httpapi.Invalid("url", "%d bytes, want 1 to 2048", len(url))
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // bounds the DNS lookup
	defer cancel()
	if err := s.hookGuard.CheckURL(ctx, url); err != nil {
		return &httpapi.FieldError{Field: "url", Err: err}
	}
	return nil
}

func (s *Server) handleCreateWebhook(w http.ResponseWriter, r *http.Request) {
	var req api.CreateWebhook
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if len(req.Description) > 256 {
		httpapi.WriteError(w, httpapi.Invalid("description", "longer than 256 bytes"))
		return
	}
	format, err := webhookFormat(req.Format)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if err := checkWebhookTypes(req.Types, format); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	secret := req.Secret
	if secret == "" {
		secret = webhook.NewSecret()
	} else if err := checkWebhookSecret(secret); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	types := req.Types
	if len(types) == 0 && format == store.WebhookFormatE2B {
		types = e2bEventTypes() // every type E2B has, not every type
	}
	if err := s.checkWebhookURL(r.Context(), req.URL); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	team := callerOf(r).team
	have, err := s.cfg.Store.ListWebhooks(r.Context(), team)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if len(have) >= maxWebhooks {
		httpapi.WriteError(w, fmt.Errorf("team %s has %d webhooks, the most it may have (delete one first): %w", team, len(have), errkind.ResourceExhausted))
		return
	}
	hook, err := s.cfg.Store.CreateWebhook(r.Context(), store.Webhook{
		ID: store.NewWebhookID(), TeamID: team, URL: req.URL, Types: types, Description: req.Description,
		Secret: secret, Format: format, Enabled: true, Cursor: s.eventCursor(r.Context(), team),
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := webhookView(hook)
	out.Secret = hook.Secret
	httpapi.WriteJSON(w, http.StatusCreated, out)
}

// eventCursor is the cursor of the team's latest event, where a new
// webhook starts: it gets what happens from now on, not the past.
func (s *Server) eventCursor(ctx context.Context, team string) int64 {
	var last int64
	for {
		evs, err := s.cfg.Store.ListEvents(ctx, store.EventQuery{TeamID: team, After: last})
		if err != nil || len(evs) == 0 {
			return last // on error: from the oldest kept, at least once
		}
		last = evs[len(evs)-1].Seq
		if len(evs) < store.MaxEventLimit {
			return last
		}
	}
}

// webhookOf returns the caller's webhook named in the path, or writes 404.
func (s *Server) webhookOf(w http.ResponseWriter, r *http.Request) (store.Webhook, bool) {
	id := r.PathValue("wid")
	if !store.ValidWebhookID(id) {
		httpapi.WriteError(w, fmt.Errorf("webhook %.80q: %w", id, store.ErrNotFound))
		return store.Webhook{}, false
	}
	hook, err := s.cfg.Store.Webhook(r.Context(), callerOf(r).team, id)
	if err != nil {
		httpapi.WriteError(w, err)
		return store.Webhook{}, false
	}
	return hook, true
}

func (s *Server) handleListWebhooks(w http.ResponseWriter, r *http.Request) {
	all, err := s.cfg.Store.ListWebhooks(r.Context(), callerOf(r).team)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.WebhookList{Webhooks: make([]api.Webhook, 0, len(all))}
	for _, h := range all {
		out.Webhooks = append(out.Webhooks, webhookView(h))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetWebhook(w http.ResponseWriter, r *http.Request) {
	if hook, ok := s.webhookOf(w, r); ok {
		httpapi.WriteJSON(w, http.StatusOK, webhookView(hook))
	}
}

func (s *Server) handleUpdateWebhook(w http.ResponseWriter, r *http.Request) {
	var req api.UpdateWebhook
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	hook, ok := s.webhookOf(w, r)
	if !ok {
		return
	}
	if req.URL != nil {
		if err := s.checkWebhookURL(r.Context(), *req.URL); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		hook.URL = *req.URL
	}
	if req.Types != nil {
		if err := checkWebhookTypes(*req.Types, hook.Format); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		hook.Types = *req.Types
		if len(hook.Types) == 0 && hook.Format == store.WebhookFormatE2B {
			hook.Types = e2bEventTypes()
		}
	}
	if req.Secret != nil {
		if err := checkWebhookSecret(*req.Secret); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		hook.Secret = *req.Secret
	}
	if req.Description != nil {
		if len(*req.Description) > 256 {
			httpapi.WriteError(w, httpapi.Invalid("description", "longer than 256 bytes"))
			return
		}
		hook.Description = *req.Description
	}
	if req.Enabled != nil {
		if *req.Enabled && !hook.Enabled {
			hook.DisabledReason = ""
		}
		hook.Enabled = *req.Enabled
	}
	hook, err := s.cfg.Store.UpdateWebhook(r.Context(), hook)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, webhookView(hook))
}

func (s *Server) handleDeleteWebhook(w http.ResponseWriter, r *http.Request) {
	hook, ok := s.webhookOf(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Store.DeleteWebhook(r.Context(), hook.TeamID, hook.ID); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleWebhookDeliveries(w http.ResponseWriter, r *http.Request) {
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.WebhookDeliveriesKept {
			httpapi.WriteError(w, httpapi.Invalid("limit", "%.20q: want 1 to %d", v, store.WebhookDeliveriesKept))
			return
		}
		limit = n
	}
	hook, ok := s.webhookOf(w, r)
	if !ok {
		return
	}
	all, err := s.cfg.Store.WebhookDeliveries(r.Context(), hook.TeamID, hook.ID, limit)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.WebhookDeliveryList{Deliveries: make([]api.WebhookDelivery, 0, len(all))}
	for _, d := range all {
		out.Deliveries = append(out.Deliveries, deliveryView(d))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// handleTestWebhook sends a ping to the webhook now (enabled or not) and
// answers how it went; the attempt is logged but moves no cursor and
// counts no failure.
func (s *Server) handleTestWebhook(w http.ResponseWriter, r *http.Request) {
	hook, ok := s.webhookOf(w, r)
	if !ok {
		return
	}
	res := s.hookSender.Send(r.Context(), hook, webhook.Ping(hook.TeamID, s.now()))
	d := store.WebhookDelivery{WebhookID: hook.ID, EventType: webhook.PingType, Attempt: 1,
		StatusCode: res.StatusCode, Duration: res.Duration, Delivered: res.Delivered()}
	if res.Err != nil {
		d.Error = store.TruncatedDeliveryError(res.Err.Error())
	}
	if _, err := s.cfg.Store.AddWebhookDelivery(r.Context(), d, 0); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("log webhook test", "webhook_id", hook.ID, "err", err)
	}
	d.Time = s.now().UTC()
	httpapi.WriteJSON(w, http.StatusOK, deliveryView(d))
}

// e2bEventTypes lists the SPACE event types that have an E2B
// counterpart, in the order of sandbox.EventTypes.
func e2bEventTypes() []string {
	var out []string
	for _, t := range sandbox.EventTypes {
		if _, ok := webhook.E2BTypes[t]; ok {
			out = append(out, t)
		}
	}
	return out
}
