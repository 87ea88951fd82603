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

// SetSecrets replaces the secret grants of running sandbox id with the
// team's secrets names (none takes every grant away) and returns the
// sandbox. A grant kept keeps its placeholder; a new one gets a
// placeholder (in the environment of execs started from now on and in
// /etc/space/secrets/NAME) and its secret's hosts in the sandbox's
// policy, as at create; a dropped one is no longer replaced. An unknown
// secret is a not-found error (IsNotFound); a sandbox that is not running
// or has no network is a conflict error (IsConflict). On an error nothing
// changes.
func (c *Client) SetSecrets(ctx context.Context, id string, names []string) (api.Sandbox, error) {
	if names == nil {
		names = []string{} // [] clears; a missing list is refused
	}
	body, err := jsonBody(api.SecretGrants{Secrets: names})
	if err != nil {
		return api.Sandbox{}, err
	}
	var sb api.Sandbox
	err = c.call(ctx, request{method: http.MethodPut, path: sandboxPath(id, "/secrets"), body: body}, &sb)
	return sb, err
}
