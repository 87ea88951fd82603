package workerproto

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/origin"
)

// Config configures how a Client calls its worker.
type Config struct {
	// ID names the worker in errors. Required.
	ID string
	// Timeouts replace verbs' deadlines (Def.Timeout), keyed by
	// Def.Name; each must be positive. Verbs not named keep theirs. For
	// tests.
	Timeouts map[string]time.Duration
	// Attempts bounds the tries of an idempotent verb whose call failed
	// in transport; 0 = 3, 1 = no retries.
	Attempts int
	// Backoff is the wait before the first retry, doubled before each
	// further one; 0 = 100ms.
	Backoff time.Duration
}

func (cfg *Config) check() error {
	if cfg.ID == "" {
		return fmt.Errorf("worker client: id is required: %w", errkind.InvalidArgument)
	}
	for name, d := range cfg.Timeouts {
		if !knownVerb(name) || d <= 0 {
			return fmt.Errorf("worker client: timeout %s of %q: want a positive timeout of a verb: %w", d, name, errkind.InvalidArgument)
		}
	}
	if cfg.Attempts < 0 || cfg.Backoff < 0 {
		return fmt.Errorf("worker client: attempts %d, backoff %s: not negative: %w", cfg.Attempts, cfg.Backoff, errkind.InvalidArgument)
	}
	if cfg.Attempts == 0 {
		cfg.Attempts = 3
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 100 * time.Millisecond
	}
	return nil
}

func knownVerb(name string) bool {
	for _, v := range verbs {
		if v.def().Name == name {
			return true
		}
	}
	return false
}

// RemoteConfig configures a Client of a worker reached over HTTPS.
type RemoteConfig struct {
	Config
	// Base is the worker's URL, https://host:port. Required.
	Base string
	// Token is sent as the bearer token of every call; "" sends none.
	Token string
	// Transport shapes the connections (TLS, timeouts); its zero value
	// trusts the host's roots. ResponseHeaderTimeout defaults to the
	// longest verb deadline: the verbs' own deadlines come first.
	Transport TransportConfig
}

// TransportConfig shapes the HTTP connections to a worker.
type TransportConfig struct {
	// TLS verifies the worker; nil = the host's roots.
	TLS *tls.Config
	// DialTimeout bounds opening a TCP connection; 0 = 5s.
	DialTimeout time.Duration
	// KeepAlive is the TCP keep-alive period; 0 = 30s.
	KeepAlive time.Duration
	// TLSHandshakeTimeout bounds the TLS handshake; 0 = 10s.
	TLSHandshakeTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for an answer's header
	// after the request is sent; 0 = none (answers that take as long as
	// their work, data-plane streams).
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout closes a connection idle this long; 0 = 90s.
	IdleConnTimeout time.Duration
	// DialContext opens connections; nil = a net.Dialer with DialTimeout
	// and KeepAlive. For tests.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// NewTransport returns an HTTP transport to a worker shaped by cfg. It
// has no overall timeout: data-plane streams last as long as they last.
func NewTransport(cfg TransportConfig) *http.Transport {
	or := func(d, def time.Duration) time.Duration {
		if d == 0 {
			return def
		}
		return d
	}
	dial := cfg.DialContext
	if dial == nil {
		d := &net.Dialer{Timeout: or(cfg.DialTimeout, 5*time.Second), KeepAlive: or(cfg.KeepAlive, 30*time.Second)}
		dial = d.DialContext
	}
	return &http.Transport{
		DialContext:           dial,
		TLSClientConfig:       cfg.TLS,
		TLSHandshakeTimeout:   or(cfg.TLSHandshakeTimeout, 10*time.Second),
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		IdleConnTimeout:       or(cfg.IdleConnTimeout, 90*time.Second),
		ExpectContinueTimeout: time.Second,
		MaxIdleConnsPerHost:   16,
		ForceAttemptHTTP2:     true,
	}
}

// Client calls a worker's verbs, each under its deadline, retrying
// idempotent ones after transport failures (see the package doc). It
// implements Service. Errors are the worker's own, or wrap
// errkind.Unavailable when the worker was not reached or did not answer
// in time (then they also wrap context.DeadlineExceeded).
type Client struct {
	cfg Config

	// local is the Service a local Client calls, or nil.
	local Service
	// Set for a remote Client.
	base  *url.URL
	token string
	hc    *http.Client
}

var _ Service = (*Client)(nil)

// NewLocal returns a Client that calls s in this process: s's methods
// run under the verbs' deadlines.
func NewLocal(s Service, cfg Config) (*Client, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, local: s}, nil
}

// NewClient returns a Client of the worker at cfg.Base. Call Close to
// release its idle connections.
func NewClient(cfg RemoteConfig) (*Client, error) {
	if err := cfg.Config.check(); err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Base)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("worker %s address %q: want https://host:port (workers serve TLS): %w", cfg.ID, cfg.Base, errkind.InvalidArgument)
	}
	tc := cfg.Transport
	if tc.ResponseHeaderTimeout == 0 {
		for _, d := range Defs() {
			tc.ResponseHeaderTimeout = max(tc.ResponseHeaderTimeout, d.Timeout)
		}
	}
	return &Client{cfg: cfg.Config, base: u, token: cfg.Token, hc: &http.Client{Transport: NewTransport(tc)}}, nil
}

// ID returns the worker's ID.
func (c *Client) ID() string { return c.cfg.ID }

// Close closes a remote Client's idle connections.
func (c *Client) Close() error {
	if c.hc != nil {
		c.hc.CloseIdleConnections()
	}
	return nil
}

func (c *Client) Status(ctx context.Context) (Status, error) {
	return call(ctx, c, &statusVerb, "", None{})
}
func (c *Client) List(ctx context.Context) ([]Info, error) {
	return call(ctx, c, &listVerb, "", None{})
}
func (c *Client) Sandbox(ctx context.Context, id string) (Info, error) {
	return call(ctx, c, &sandboxVerb, id, None{})
}
func (c *Client) Usage(ctx context.Context, id string, req UsageRequest) (api.SandboxMetrics, error) {
	return call(ctx, c, &usageVerb, id, req)
}
func (c *Client) SnapshotInfo(ctx context.Context, snapshotID string) (SnapshotInfo, error) {
	return call(ctx, c, &snapshotInfoVerb, snapshotID, None{})
}
func (c *Client) Create(ctx context.Context, req CreateRequest) (Info, error) {
	return call(ctx, c, &createVerb, "", req)
}
func (c *Client) Pause(ctx context.Context, id string) (Info, error) {
	return call(ctx, c, &pauseVerb, id, None{})
}
func (c *Client) Resume(ctx context.Context, id string) (Info, error) {
	return call(ctx, c, &resumeVerb, id, None{})
}
func (c *Client) Lease(ctx context.Context, req LeaseRequest) (LeaseReply, error) {
	return call(ctx, c, &leaseVerb, "", req)
}
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := call(ctx, c, &deleteVerb, id, None{})
	return err
}
func (c *Client) Snapshot(ctx context.Context, id string, req SnapshotRequest) (SnapshotInfo, error) {
	return call(ctx, c, &snapshotVerb, id, req)
}
func (c *Client) Restore(ctx context.Context, id, snapshotID string) (Info, error) {
	return call(ctx, c, &restoreVerb, id, RestoreRequest{SnapshotID: snapshotID})
}
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	_, err := call(ctx, c, &deleteSnapshotVerb, snapshotID, None{})
	return err
}
func (c *Client) SetNetwork(ctx context.Context, id string, n Network) (Info, error) {
	return call(ctx, c, &setNetworkVerb, id, n)
}
func (c *Client) SetSecrets(ctx context.Context, id string, req SecretsRequest) (Info, error) {
	return call(ctx, c, &setSecretsVerb, id, req)
}

// EgressLog's deadline lasts until rc is closed.
func (c *Client) EgressLog(ctx context.Context, id string) (string, io.ReadCloser, error) {
	l, err := call(ctx, c, &egressLogVerb, id, None{})
	return l.ID, l.Body, err
}

func (c *Client) timeout(d *Def) time.Duration {
	if t, ok := c.cfg.Timeouts[d.Name]; ok {
		return t
	}
	return d.Timeout
}

// call makes one call of verb v under its deadline, trying an
// idempotent verb again after a transport failure.
func call[Req, Resp any](ctx context.Context, c *Client, v *Verb[Req, Resp], id string, req Req) (Resp, error) {
	var zero Resp
	if strings.Contains(v.Path, "{id}") && id == "" {
		return zero, fmt.Errorf("worker %s: %s: empty id: %w", c.cfg.ID, v.Name, errkind.InvalidArgument)
	}
	timeout := c.timeout(&v.Def)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl).Round(time.Millisecond)
	}
	attempts := 1
	if v.Idempotent {
		attempts = c.cfg.Attempts
	}
	wait := c.cfg.Backoff
	for i := 1; ; i++ {
		var resp Resp
		var err error
		if c.local != nil {
			resp, err = v.serve(ctx, c.local, id, req)
		} else {
			resp, err = roundTrip(ctx, c, v, id, req)
		}
		if err == nil {
			// A stream's deadline lasts until its body is closed.
			if l, ok := any(&resp).(*EgressLog); ok {
				l.Body = &cancelOnClose{ReadCloser: l.Body, cancel: cancel}
			} else {
				cancel()
			}
			return resp, nil
		}
		var te *transportError
		if ctx.Err() == nil && i < attempts && errors.As(err, &te) {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
				wait *= 2
				continue
			case <-ctx.Done():
				t.Stop()
			}
		}
		ctxErr := ctx.Err()
		cancel()
		switch {
		case errors.Is(ctxErr, context.DeadlineExceeded):
			// Whatever came back came too late: a transport error, or
			// an answer the worker wrote after it saw our cancel (HTTP/2
			// can still deliver that one).
			return zero, fmt.Errorf("worker %s: %s: no answer within %v: %w", c.cfg.ID, v.Name, timeout, &deadlineError{err})
		case errors.As(err, &te):
			return zero, fmt.Errorf("worker %s: %s: %w", c.cfg.ID, v.Name, err)
		}
		return zero, err // the worker's own
	}
}

// maxAnswer bounds a decoded answer.
const maxAnswer = 64 << 20

// roundTrip sends one call of v over HTTP.
func roundTrip[Req, Resp any](ctx context.Context, c *Client, v *Verb[Req, Resp], id string, req Req) (Resp, error) {
	var zero Resp
	var body io.Reader = http.NoBody
	_, noReq := any(req).(None)
	if !noReq {
		b, err := json.Marshal(req)
		if err != nil {
			return zero, fmt.Errorf("worker %s: %s: encode request: %w", c.cfg.ID, v.Name, err)
		}
		body = bytes.NewReader(b)
	}
	u := c.base.JoinPath(PathPrefix, strings.Replace(v.Path, "{id}", url.PathEscape(id), 1))
	hr, err := http.NewRequestWithContext(ctx, v.Method, u.String(), body)
	if err != nil {
		return zero, fmt.Errorf("worker %s: %s: %w", c.cfg.ID, v.Name, err)
	}
	if c.token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.token)
	}
	setOrigin(hr.Header, origin.From(ctx))
	if !noReq {
		hr.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(hr)
	if err != nil {
		return zero, &transportError{err}
	}
	if err := httpapi.ResponseError(resp); err != nil {
		resp.Body.Close()
		return zero, err // the worker's own answer
	}
	var out Resp
	switch o := any(&out).(type) {
	case *None:
		resp.Body.Close()
	case *EgressLog:
		o.ID, o.Body = resp.Header.Get(EgressLogHeader), resp.Body
	default:
		defer resp.Body.Close()
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&out); err != nil {
			return zero, &transportError{fmt.Errorf("decode answer: %w", err)}
		}
	}
	return out, nil
}

// transportError is a call that failed before the worker's answer was
// read: it was not reached, or the connection broke. It is Unavailable.
type transportError struct{ err error }

func (e *transportError) Error() string   { return e.err.Error() }
func (e *transportError) Unwrap() []error { return []error{e.err, errkind.Unavailable} }

// deadlineError is a call that did not end before its deadline: the
// worker is Unavailable.
type deadlineError struct{ err error }

func (e *deadlineError) Error() string { return e.err.Error() }
func (e *deadlineError) Unwrap() []error {
	return []error{e.err, errkind.Unavailable, context.DeadlineExceeded}
}

// cancelOnClose ends a stream's deadline when the stream is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
