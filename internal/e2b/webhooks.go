package e2b

import (
	"net/http"
	"slices"
	"time"

	"space/api"
	"space/client"
	"space/internal/webhook"
)

// E2B's webhook routes (/events/webhooks), served from SPACE's webhooks
// of format "e2b": SPACE delivers them with E2B's body and e2b-signature.
// Only those are listed here; a SPACE-format webhook is not found.

func (s *Server) webhookRoutes() {
	h := func(pattern string, f func(http.ResponseWriter, *http.Request, *client.Client)) {
		s.api.HandleFunc(pattern, s.withKey(f))
	}
	h("POST /events/webhooks", s.createWebhook)
	h("GET /events/webhooks", s.listWebhooks)
	h("GET /events/webhooks/{webhookID}", s.getWebhook)
	h("PATCH /events/webhooks/{webhookID}", s.updateWebhook)
	h("DELETE /events/webhooks/{webhookID}", s.deleteWebhook)
}

// e2bWebhook is a webhook as E2B's API shows it.
type e2bWebhook struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	Enabled   bool      `json:"enabled"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
}

// e2bWebhookRequest is the body of E2B's create and update.
type e2bWebhookRequest struct {
	Name            *string   `json:"name"`
	URL             *string   `json:"url"`
	Enabled         *bool     `json:"enabled"`
	Events          *[]string `json:"events"`
	SignatureSecret *string   `json:"signatureSecret"`
}

func e2bWebhookOf(h api.Webhook) e2bWebhook {
	events := []string{}
	for _, t := range h.Types {
		if e, ok := webhook.E2BTypes[t]; ok {
			events = append(events, e)
		}
	}
	return e2bWebhook{ID: h.ID, Name: h.Description, CreatedAt: h.CreatedAt, Enabled: h.Enabled, URL: h.URL, Events: events}
}

// spaceTypes maps E2B event types onto SPACE's, or answers 400 naming
// one that SPACE does not send.
func spaceTypes(events []string) ([]string, error) {
	var out []string
	for _, e := range events {
		found := ""
		for t, et := range webhook.E2BTypes {
			if et == e {
				found = t
			}
		}
		if found == "" {
			return nil, badRequest("events: %q is not an event type SPACE sends (it sends sandbox.lifecycle.created, killed, paused, resumed and checkpointed)", e)
		}
		if !slices.Contains(out, found) {
			out = append(out, found)
		}
	}
	return out, nil
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req e2bWebhookRequest
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	if req.URL == nil || req.SignatureSecret == nil {
		writeAPIError(w, badRequest("url and signatureSecret are required"))
		return
	}
	create := api.CreateWebhook{URL: *req.URL, Secret: *req.SignatureSecret, Format: "e2b"}
	if req.Name != nil {
		create.Description = *req.Name
	}
	if req.Events != nil {
		types, err := spaceTypes(*req.Events)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		create.Types = types
	}
	h, err := c.CreateWebhook(r.Context(), create)
	if err == nil && req.Enabled != nil && !*req.Enabled {
		h, err = c.UpdateWebhook(r.Context(), h.ID, api.UpdateWebhook{Enabled: req.Enabled})
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, e2bWebhookOf(h))
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request, c *client.Client) {
	hs, err := c.Webhooks(r.Context())
	if err != nil {
		writeAPIError(w, err)
		return
	}
	out := []e2bWebhook{}
	for _, h := range hs {
		if h.Format == "e2b" {
			out = append(out, e2bWebhookOf(h))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// pathWebhook returns the E2B webhook the path names, or answers 404.
func pathWebhook(w http.ResponseWriter, r *http.Request, c *client.Client) (api.Webhook, bool) {
	h, err := c.Webhook(r.Context(), r.PathValue("webhookID"))
	if err == nil && h.Format != "e2b" {
		err = notFound("webhook %q not found", r.PathValue("webhookID"))
	}
	if err != nil {
		writeAPIError(w, err)
		return api.Webhook{}, false
	}
	return h, true
}

func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request, c *client.Client) {
	if h, ok := pathWebhook(w, r, c); ok {
		writeJSON(w, http.StatusOK, e2bWebhookOf(h))
	}
}

func (s *Server) updateWebhook(w http.ResponseWriter, r *http.Request, c *client.Client) {
	var req e2bWebhookRequest
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	h, ok := pathWebhook(w, r, c)
	if !ok {
		return
	}
	upd := api.UpdateWebhook{URL: req.URL, Description: req.Name, Enabled: req.Enabled, Secret: req.SignatureSecret}
	if req.Events != nil {
		types, err := spaceTypes(*req.Events)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		upd.Types = &types
	}
	h, err := c.UpdateWebhook(r.Context(), h.ID, upd)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e2bWebhookOf(h))
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request, c *client.Client) {
	h, ok := pathWebhook(w, r, c)
	if !ok {
		return
	}
	if err := c.DeleteWebhook(r.Context(), h.ID); err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{})
}
