package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"space/api"
)

// BuildOptions are the parameters of a template build besides its build
// context.
type BuildOptions struct {
	// File is the spec file's path in the build context (slash-separated);
	// "" = "space.yaml".
	File string
	// Name names the template; "" = the spec's name field.
	Name string
}

// errBuildCut is returned when a build's stream ends before its done (or
// error) event.
var errBuildCut = fmt.Errorf("build stream ended before the build finished: %w", io.ErrUnexpectedEOF)

// BuildTemplate builds a template from buildContext, a tar stream holding
// the spec file and what it copies (see PackContext), and returns the new
// template version. progress, if not nil, gets every event of the build
// as it happens except the final one. A build that fails comes back as
// an *Error (a failed run step: code failed_precondition) with its report,
// which says which step failed and its exit code; a stream that ends
// before the build does satisfies errors.Is(err, io.ErrUnexpectedEOF).
// Ending ctx cancels the build.
func (c *Client) BuildTemplate(ctx context.Context, buildContext io.Reader, opts BuildOptions, progress func(api.BuildEvent)) (api.Template, api.BuildReport, error) {
	q := url.Values{}
	if opts.File != "" {
		q.Set("file", opts.File)
	}
	if opts.Name != "" {
		q.Set("name", opts.Name)
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/templates", query: q, body: buildContext,
		contentType: "application/x-tar", accept: "application/x-ndjson"})
	if err != nil {
		return api.Template{}, api.BuildReport{}, err
	}
	defer resp.Body.Close()
	var (
		t   api.Template
		rep api.BuildReport
	)
	err = readNDJSON(ctx, resp.Body, errBuildCut, func(ev api.BuildEvent) (bool, error) {
		if ev.Report != nil {
			rep = *ev.Report
		}
		switch ev.Type {
		case "done":
			if ev.Template == nil {
				return true, errors.New("build: done event without a template")
			}
			t = *ev.Template
			return true, nil
		case "error":
			return true, eventError(ev.Error)
		}
		if progress != nil {
			progress(ev)
		}
		return false, nil
	})
	return t, rep, err
}

// Templates lists the server's built-in templates (the default first),
// then every version of the team's own.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var l api.TemplateList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/templates"}, &l)
	return l.Templates, err
}

// Template describes a template: ref "name" gets all its versions,
// "name:version" that one.
func (c *Client) Template(ctx context.Context, ref string) ([]api.Template, error) {
	var l api.TemplateList
	err := c.call(ctx, request{method: http.MethodGet, path: templatePath(ref)}, &l)
	return l.Templates, err
}

// DeleteTemplate deletes a template version ("name:version") or every
// version of one ("name"). A template that sandboxes run from, or that is
// being built, is a conflict (IsConflict).
func (c *Client) DeleteTemplate(ctx context.Context, ref string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: templatePath(ref),
		want: []int{http.StatusNoContent, http.StatusOK}}, nil)
}

func templatePath(ref string) string { return "/" + api.Version + "/templates/" + url.PathEscape(ref) }
