// Package fcapi is a client for the Firecracker API served on a unix socket.
//
// Each method is one HTTP request, synchronous like the API itself: a nil
// error means Firecracker has carried the request out (204 or 200). Request
// structs mirror Firecracker's JSON with omitempty on every optional field,
// because Firecracker rejects unknown fields: set only fields the target
// version knows (see [Version]). Rejections come back as *[Error], which
// wraps an errkind; transport failures wrap errkind.Unavailable.
package fcapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"

	"space/internal/errkind"
)

const (
	// maxResponse bounds a successful response body; the largest one we
	// read (balloon statistics) is well under a kilobyte.
	maxResponse = 1 << 20
	// maxFault bounds an error body kept for the error message.
	maxFault = 4 << 10
)

// Client talks to one Firecracker process. It is safe for concurrent use;
// Firecracker itself executes requests one at a time.
type Client struct {
	sock string
	tr   *http.Transport
	hc   *http.Client
}

// New returns a client for the API socket at socketPath. It does not
// connect; the first request does.
func New(socketPath string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
		// A connection per request: a unix connect costs microseconds, and
		// a PUT is never sent on a kept-alive connection the server may
		// have dropped (Go does not retry PUTs).
		DisableKeepAlives: true,
		// Firecracker's HTTP server takes few connections; a long request
		// (a full snapshot) blocks every other one anyway.
		MaxConnsPerHost: 4,
		// No Accept-Encoding: Firecracker sends identity only.
		DisableCompression: true,
	}
	return &Client{
		sock: socketPath,
		tr:   tr,
		hc: &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// SocketPath returns the API socket the client dials.
func (c *Client) SocketPath() string { return c.sock }

// Close drops idle connections, if any. The client stays usable.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// Error is a request Firecracker answered with an error status.
type Error struct {
	Method string
	Path   string
	Status int    // HTTP status: 400 for nearly everything
	Fault  string // Firecracker's fault_message (for humans; never parse it)
	Kind   *errkind.Kind
}

func (e *Error) Error() string {
	return fmt.Sprintf("firecracker %s %s: %d: %s", e.Method, e.Path, e.Status, e.Fault)
}

// Unwrap returns the error's kind.
func (e *Error) Unwrap() error { return e.Kind }

// idPattern is what Firecracker accepts as a drive or interface id.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// ValidID checks a resource id (drive_id, iface_id): non-empty, only
// letters, digits and '_'. It returns an errkind.InvalidArgument error.
func ValidID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("firecracker resource id %q: want [A-Za-z0-9_]+: %w", id, errkind.InvalidArgument)
	}
	return nil
}

// do sends one request. A 400 becomes an *Error of kind rejected: every
// rejection is a 400, so the endpoint decides whether it usually means a
// bad value (configuration) or a wrong state (actions, snapshots).
func (c *Client) do(ctx context.Context, method, path string, in, out any, rejected *errkind.Kind) error {
	var body io.Reader = http.NoBody
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("firecracker %s %s: encode: %w", method, path, err)
		}
		// A bytes.Reader sets Content-Length: Firecracker does not decode
		// chunked bodies and would see an empty one.
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, body)
	if err != nil {
		return fmt.Errorf("firecracker %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("firecracker %s %s: %w", method, path, context.Cause(ctx))
		}
		return fmt.Errorf("firecracker %s %s: %w: %w", method, path, err, errkind.Unavailable)
	}
	defer resp.Body.Close()

	switch resp.StatusCode {
	case http.StatusOK, http.StatusNoContent:
		if out == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponse))
			return nil
		}
		if resp.StatusCode == http.StatusNoContent {
			return fmt.Errorf("firecracker %s %s: no content: %w", method, path, errkind.Internal)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
		if err != nil {
			return fmt.Errorf("firecracker %s %s: read response: %w: %w", method, path, err, errkind.Unavailable)
		}
		if len(b) > maxResponse {
			return fmt.Errorf("firecracker %s %s: response over %d bytes: %w", method, path, maxResponse, errkind.Internal)
		}
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("firecracker %s %s: decode response: %v: %w", method, path, err, errkind.Internal)
		}
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxFault))
	return &Error{Method: method, Path: path, Status: resp.StatusCode, Fault: faultMessage(b), Kind: kindOf(resp.StatusCode, rejected)}
}

func kindOf(status int, rejected *errkind.Kind) *errkind.Kind {
	switch {
	case status == http.StatusBadRequest:
		return rejected
	case status == http.StatusRequestEntityTooLarge:
		return errkind.ResourceExhausted
	case status == http.StatusNotFound:
		return errkind.NotFound
	case status >= 500:
		return errkind.Unavailable
	default:
		return errkind.Internal
	}
}

// faultMessage extracts fault_message from an error body, or returns the
// body itself (shortened) when it is not the documented JSON.
func faultMessage(b []byte) string {
	var f struct {
		FaultMessage *string `json:"fault_message"`
	}
	if err := json.Unmarshal(b, &f); err == nil && f.FaultMessage != nil {
		return *f.FaultMessage
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(no fault message)"
	}
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	return s
}

// IsRejected reports whether err is Firecracker refusing a request (as
// opposed to a transport failure or a cancelled ctx).
func IsRejected(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
