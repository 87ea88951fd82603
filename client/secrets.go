package client

import (
	"context"
	"net/http"
	"net/url"

	"space/api"
)

// CreateSecret stores a secret of the caller's team and returns its
// description; the server never sends the value back. A taken name is a
// conflict error (IsConflict); a bad field is invalid (IsInvalid, Field
// names it); a server without a secrets key answers failed_precondition.
func (c *Client) CreateSecret(ctx context.Context, req api.CreateSecret) (api.Secret, error) {
	var sc api.Secret
	body, err := jsonBody(req)
	if err != nil {
		return sc, err
	}
	err = c.call(ctx, request{method: http.MethodPost, path: "/v1/secrets", body: body,
		want: []int{http.StatusCreated}}, &sc)
	return sc, err
}

// Secrets lists the caller's team's secrets by name, without values.
func (c *Client) Secrets(ctx context.Context) ([]api.Secret, error) {
	var l api.SecretList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/secrets"}, &l)
	return l.Secrets, err
}

// DeleteSecret deletes the caller's team's secret name.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: "/v1/secrets/" + url.PathEscape(name),
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
}
