package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"space/api"
)

// AuditQuery selects audit log entries. Its zero value selects them all.
type AuditQuery struct {
	Team         string    // only this team's; "" = every team's
	After        int64     // only entries after this sequence number (a page's Next)
	Since, Until time.Time // only entries from Since and before Until; zero = no bound
	Limit        int       // at most this many (1 to 1000) for Audit; 0 = the server's default (100)
}

func (q AuditQuery) values() url.Values {
	v := url.Values{}
	if q.Team != "" {
		v.Set("team", q.Team)
	}
	if q.After > 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// Audit returns a page of the audit log's entries that q selects (admin
// keys only: others get a permission-denied error). Pass the page's Next
// as q.After for the next page; Next is 0 on the last.
func (c *Client) Audit(ctx context.Context, q AuditQuery) (api.AuditList, error) {
	var l api.AuditList
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/audit", query: q.values()}, &l)
	return l, err
}

// AuditExport streams every entry q selects (q.Limit is ignored) as
// NDJSON: an api.AuditExportHead line, then one api.AuditEntry per line.
// The caller closes it.
func (c *Client) AuditExport(ctx context.Context, q AuditQuery) (io.ReadCloser, error) {
	q.Limit = 0
	v := q.values()
	v.Set("format", "ndjson")
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/audit", query: v, accept: "application/x-ndjson"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
