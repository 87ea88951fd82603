// Package httpapi is what SPACE's HTTP servers (the control plane's public
// API and the worker's API) share: the one mapping from error kinds to
// status codes and error bodies, strict JSON decoding with size limits, and
// the reverse mapping for clients of those servers.
package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"space/api"
	"space/internal/errkind"
)

// MaxJSONBody is the largest JSON request body a handler reads.
const MaxJSONBody = 1 << 20

// Errors for the conditions errkind has no kind for.
var (
	// ErrUnauthenticated is sent as 401 unauthenticated.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrTooLarge is sent as 413 request_too_large.
	ErrTooLarge = fmt.Errorf("request too large: %w", errkind.InvalidArgument)
	// ErrRangeNotSatisfiable is sent as 416 invalid_argument: no byte of
	// a requested range is in the file.
	ErrRangeNotSatisfiable = fmt.Errorf("range not satisfiable: %w", errkind.InvalidArgument)
)

// FieldError is a validation error about one request field.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Invalid returns an InvalidArgument error naming field.
func Invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format+": %w", append(args, errkind.InvalidArgument)...)}
}

// Status returns the HTTP status and API error code for err.
func Status(err error) (int, string) {
	switch {
	case errors.Is(err, ErrUnauthenticated):
		return http.StatusUnauthorized, api.CodeUnauthenticated
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge, api.CodeTooLarge
	case errors.Is(err, ErrRangeNotSatisfiable):
		return http.StatusRequestedRangeNotSatisfiable, api.CodeInvalidArgument
	}
	switch errkind.Of(err) {
	case errkind.InvalidArgument:
		return http.StatusBadRequest, api.CodeInvalidArgument
	case errkind.NotFound:
		return http.StatusNotFound, api.CodeNotFound
	case errkind.Conflict:
		return http.StatusConflict, api.CodeConflict
	case errkind.FailedPrecondition:
		return http.StatusConflict, api.CodeFailedPrecondition
	case errkind.ResourceExhausted:
		return http.StatusTooManyRequests, api.CodeResourceExhausted
	case errkind.PermissionDenied:
		return http.StatusForbidden, api.CodePermissionDenied
	case errkind.Unavailable:
		return http.StatusServiceUnavailable, api.CodeUnavailable
	case errkind.DeadlineExceeded:
		return http.StatusGatewayTimeout, api.CodeDeadlineExceeded
	}
	return http.StatusInternalServerError, api.CodeInternal
}

// Body returns the API error body for err.
func Body(err error) api.ErrorBody {
	_, code := Status(err)
	b := api.ErrorBody{Code: code, Message: err.Error()}
	var fe *FieldError
	if errors.As(err, &fe) {
		b.Field = fe.Field
	}
	return b
}

// WriteError sends err as {"error": ...} with its status.
func WriteError(w http.ResponseWriter, err error) {
	status, _ := Status(err)
	WriteJSON(w, status, api.Error{Error: Body(err)})
}

// WriteJSON sends v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // our own types: a bug
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// DecodeJSON decodes r's body into v strictly: at most MaxJSONBody bytes,
// no unknown fields, one value. Errors are InvalidArgument (or
// ErrTooLarge) and name the offending field where encoding/json does.
func DecodeJSON(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("content type %q, want application/json: %w", ct, errkind.InvalidArgument)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxJSONBody+1))
	if err != nil {
		return fmt.Errorf("read body: %w", errors.Join(err, errkind.InvalidArgument))
	}
	if len(b) > MaxJSONBody {
		return fmt.Errorf("body larger than %d bytes: %w", MaxJSONBody, ErrTooLarge)
	}
	return Unmarshal(b, v)
}

// Unmarshal decodes one JSON value strictly (see DecodeJSON).
func Unmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Invalid(te.Field, "want %s", te.Type)
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			f = strings.Trim(f, `"`)
			return Invalid(f, "unknown field")
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("empty body: %w", errkind.InvalidArgument)
		}
		return fmt.Errorf("malformed json: %v: %w", err, errkind.InvalidArgument)
	}
	if d.More() {
		return fmt.Errorf("malformed json: more than one value: %w", errkind.InvalidArgument)
	}
	return nil
}

// ResponseError turns a failed response of a SPACE server back into an
// error of the kind the server sent, or nil for a 2xx response. It reads
// (a bounded part of) the body.
func ResponseError(resp *http.Response) error {
	if resp.StatusCode/100 == 2 {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e api.Error
	if json.Unmarshal(b, &e) != nil || e.Error.Code == "" {
		return fmt.Errorf("http %s: %.200s: %w", resp.Status, bytes.TrimSpace(b), kindForStatus(resp.StatusCode))
	}
	var err error = &remoteError{body: e.Error}
	if e.Error.Field != "" {
		err = &FieldError{Field: e.Error.Field, Err: err}
	}
	return err
}

// remoteError is an error a server sent, keeping its kind.
type remoteError struct{ body api.ErrorBody }

func (e *remoteError) Error() string { return e.body.Message }
func (e *remoteError) Unwrap() error {
	switch e.body.Code {
	case api.CodeUnauthenticated:
		return ErrUnauthenticated
	case api.CodeTooLarge:
		return ErrTooLarge
	}
	return errkind.Parse(e.body.Code)
}

func kindForStatus(status int) error {
	switch status {
	case http.StatusBadRequest:
		return errkind.InvalidArgument
	case http.StatusUnauthorized:
		return ErrUnauthenticated
	case http.StatusForbidden:
		return errkind.PermissionDenied
	case http.StatusNotFound:
		return errkind.NotFound
	case http.StatusConflict:
		return errkind.Conflict
	case http.StatusTooManyRequests:
		return errkind.ResourceExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return errkind.Unavailable
	case http.StatusGatewayTimeout:
		return errkind.DeadlineExceeded
	}
	return errkind.Internal
}
