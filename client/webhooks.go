package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"space/api"
)

// CreateWebhook registers a webhook of the caller's team and returns it
// with its signing secret: the only time the secret is sent. A refused
// URL or an unknown event type is invalid (IsInvalid, Field names it).
func (c *Client) CreateWebhook(ctx context.Context, req api.CreateWebhook) (api.Webhook, error) {
	var h api.Webhook
	body, err := jsonBody(req)
	if err != nil {
		return h, err
	}
	err = c.call(ctx, request{method: http.MethodPost, path: "/v1/webhooks", body: body,
		want: []int{http.StatusCreated}}, &h)
	return h, err
}

// Webhooks lists the caller's team's webhooks, oldest first, without
// their secrets.
func (c *Client) Webhooks(ctx context.Context) ([]api.Webhook, error) {
	var l api.WebhookList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/webhooks"}, &l)
	return l.Webhooks, err
}

// Webhook returns the caller's team's webhook id, without its secret.
func (c *Client) Webhook(ctx context.Context, id string) (api.Webhook, error) {
	var h api.Webhook
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/webhooks/" + url.PathEscape(id)}, &h)
	return h, err
}

// UpdateWebhook changes the fields of webhook id that req sets.
func (c *Client) UpdateWebhook(ctx context.Context, id string, req api.UpdateWebhook) (api.Webhook, error) {
	var h api.Webhook
	body, err := jsonBody(req)
	if err != nil {
		return h, err
	}
	err = c.call(ctx, request{method: http.MethodPatch, path: "/v1/webhooks/" + url.PathEscape(id), body: body}, &h)
	return h, err
}

// DeleteWebhook deletes the caller's team's webhook id and its log.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: "/v1/webhooks/" + url.PathEscape(id),
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
}

// WebhookDeliveries returns the last limit (0 = all kept) delivery
// attempts of webhook id, newest first.
func (c *Client) WebhookDeliveries(ctx context.Context, id string, limit int) ([]api.WebhookDelivery, error) {
	path := "/v1/webhooks/" + url.PathEscape(id) + "/deliveries"
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	var l api.WebhookDeliveryList
	err := c.call(ctx, request{method: http.MethodGet, path: path}, &l)
	return l.Deliveries, err
}

// TestWebhook sends a ping to webhook id now and returns the attempt.
func (c *Client) TestWebhook(ctx context.Context, id string) (api.WebhookDelivery, error) {
	var d api.WebhookDelivery
	err := c.call(ctx, request{method: http.MethodPost, path: "/v1/webhooks/" + url.PathEscape(id) + "/test"}, &d)
	return d, err
}
