package e2b

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"space/client"
	"space/internal/errkind"
)

// The Connect protocol (connectrpc.com's, version 1) with JSON messages,
// as envd's clients speak it: a unary call is a POST of one JSON message
// answered with one; a server-streaming call is a POST of one enveloped
// message answered by enveloped messages and a final end-of-stream
// envelope that carries the error, if any. An envelope is a flags byte,
// a 4-byte big-endian length and the message.

const (
	envelopeEndStream  = 0x02
	envelopeCompressed = 0x01
	// maxRequestMessage bounds a request message (SendInput's bytes, in
	// base64, are the largest).
	maxRequestMessage = 32 << 20
)

// rpcError is a Connect error: a code from the Connect protocol's list
// and a message.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

func newRPCError(code, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// rpcErrorOf maps an error of SPACE's (an errkind, a client.Error, a
// context's end) onto the Connect code a client of envd expects.
func rpcErrorOf(err error) *rpcError {
	var re *rpcError
	if errors.As(err, &re) {
		return re
	}
	code := "internal"
	var ce *client.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		code = "canceled"
	case errors.As(err, &ce):
		code = connectCode(ce.Code)
	case errors.Is(err, errkind.NotFound):
		code = "not_found"
	case errors.Is(err, errkind.InvalidArgument):
		code = "invalid_argument"
	case errors.Is(err, errkind.FailedPrecondition):
		code = "failed_precondition"
	case errors.Is(err, errkind.Conflict):
		code = "already_exists"
	case errors.Is(err, errkind.Unavailable):
		code = "unavailable"
	case errors.Is(err, errkind.PermissionDenied):
		code = "permission_denied"
	}
	msg := err.Error()
	if ce != nil {
		msg = ce.Message
	}
	return &rpcError{Code: code, Message: msg}
}

// connectCode maps an api.Code* onto a Connect code.
func connectCode(apiCode string) string {
	switch apiCode {
	case "invalid_argument", "not_found", "permission_denied", "failed_precondition",
		"unauthenticated", "unavailable", "deadline_exceeded", "internal", "resource_exhausted":
		return apiCode
	case "conflict":
		return "already_exists"
	case "request_too_large":
		return "resource_exhausted"
	}
	return "unknown"
}

// httpStatusOf is the HTTP status of a unary Connect error.
func httpStatusOf(code string) int {
	switch code {
	case "canceled":
		return 499
	case "invalid_argument", "failed_precondition", "out_of_range":
		return http.StatusBadRequest
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	case "not_found":
		return http.StatusNotFound
	case "already_exists", "aborted":
		return http.StatusConflict
	case "permission_denied":
		return http.StatusForbidden
	case "resource_exhausted":
		return http.StatusTooManyRequests
	case "unimplemented":
		return http.StatusNotImplemented
	case "unavailable":
		return http.StatusServiceUnavailable
	case "unauthenticated":
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// writeRPCError answers a unary call with err.
func writeRPCError(w http.ResponseWriter, err error) {
	re := rpcErrorOf(err)
	b, _ := json.Marshal(re)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatusOf(re.Code))
	w.Write(b)
}

// rpcDeadline applies the call's Connect-Timeout-Ms header to ctx, and
// returns it (0 when absent) for the caller to pass on.
func rpcDeadline(ctx context.Context, r *http.Request) (context.Context, context.CancelFunc, time.Duration, error) {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, cancel, 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || len(v) > 10 {
		return nil, nil, 0, newRPCError("invalid_argument", "Connect-Timeout-Ms %.16q: want up to 10 digits", v)
	}
	d := time.Duration(ms) * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, cancel, d, nil
}

// readUnary decodes the JSON message of a unary call into v.
func readUnary(r *http.Request, v any) error {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		return newRPCError("unimplemented", "content type %.64q: this server speaks the Connect protocol with JSON (application/json)", r.Header.Get("Content-Type"))
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		return newRPCError("unimplemented", "content encoding %.32q is not supported", enc)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxRequestMessage+1))
	if err != nil {
		return newRPCError("canceled", "read the request: %v", err)
	}
	if len(b) > maxRequestMessage {
		return newRPCError("resource_exhausted", "request message larger than %d bytes", maxRequestMessage)
	}
	return decodeMessage(b, v)
}

// readStreamRequest decodes the one enveloped message of a
// server-streaming call into v.
func readStreamRequest(r *http.Request, v any) error {
	if err := checkStreamType(r); err != nil {
		return err
	}
	err := readEnvelope(r.Body, v)
	if err == io.EOF {
		return newRPCError("invalid_argument", "the request has no message")
	}
	return err
}

// streamCall is a streaming call under way: its response stream, and the
// call's context, bounded by its Connect-Timeout-Ms (timeout; 0 = none).
type streamCall struct {
	st      *stream
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration
}

// beginStream starts a streaming call: it decodes the call's one request
// message into req (with req nil, a client stream, whose messages the
// caller reads, it checks the content type only) and applies the call's
// deadline. On failure the stream is ended with the error and ok is
// false; otherwise the caller must call cancel.
func beginStream(w http.ResponseWriter, r *http.Request, req any) (sc streamCall, ok bool) {
	sc.st = newStream(w)
	err := checkStreamType(r)
	if err == nil && req != nil {
		err = readStreamRequest(r, req)
	}
	if err == nil {
		sc.ctx, sc.cancel, sc.timeout, err = rpcDeadline(r.Context(), r)
	}
	if err != nil {
		sc.st.End(err)
		return sc, false
	}
	return sc, true
}

// checkStreamType checks a streaming call's request is in Connect's
// streaming JSON.
func checkStreamType(r *http.Request) error {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/connect+json" {
		return newRPCError("unimplemented", "content type %.64q: this server speaks the Connect protocol with JSON (application/connect+json)", r.Header.Get("Content-Type"))
	}
	return nil
}

// readEnvelope decodes the next enveloped message of a streaming
// request's body into v, or returns io.EOF where the body ends between
// messages.
func readEnvelope(body io.Reader, v any) error {
	var head [5]byte
	if _, err := io.ReadFull(body, head[:]); err != nil {
		if err == io.EOF {
			return io.EOF
		}
		return newRPCError("invalid_argument", "read the request envelope: %v", err)
	}
	if head[0]&envelopeCompressed != 0 {
		return newRPCError("unimplemented", "compressed request messages are not supported")
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxRequestMessage {
		return newRPCError("resource_exhausted", "request message of %d bytes, more than %d", n, maxRequestMessage)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(body, b); err != nil {
		return newRPCError("invalid_argument", "read the request message: %v", err)
	}
	return decodeMessage(b, v)
}

func decodeMessage(b []byte, v any) error {
	if len(b) == 0 {
		b = []byte("{}")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return newRPCError("invalid_argument", "decode the request message: %v", err)
	}
	return nil
}

// writeUnary answers a unary call with the message v.
func writeUnary(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeRPCError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// stream is the response side of a server-streaming call. Send is safe
// for concurrent use (keepalives come from their own goroutine).
type stream struct {
	mu sync.Mutex
	// +checklocks:mu
	w http.ResponseWriter
	// +checklocks:mu
	rc *http.ResponseController
	// +checklocks:mu
	started bool
	// +checklocks:mu
	ended bool
}

func newStream(w http.ResponseWriter) *stream {
	s := &stream{}
	s.mu.Lock()
	s.w, s.rc = w, http.NewResponseController(w)
	s.mu.Unlock()
	return s
}

// start sends the response headers (once).
// +checklocks:s.mu
func (s *stream) start() {
	if s.started {
		return
	}
	s.started = true
	s.w.Header().Set("Content-Type", "application/connect+json")
	s.w.WriteHeader(http.StatusOK)
}

// Send writes one message and flushes it.
func (s *stream) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.envelope(0, b)
}

func (s *stream) envelope(flags byte, b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return errors.New("stream ended")
	}
	s.start()
	if flags&envelopeEndStream != 0 {
		s.ended = true
	}
	var head [5]byte
	head[0] = flags
	binary.BigEndian.PutUint32(head[1:], uint32(len(b)))
	if _, err := s.w.Write(head[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// End ends the stream, with err (nil for success) in its end message.
func (s *stream) End(err error) {
	end := struct {
		Error *rpcError `json:"error,omitempty"`
	}{}
	if err != nil {
		end.Error = rpcErrorOf(err)
	}
	b, _ := json.Marshal(end)
	s.envelope(envelopeEndStream, b)
}

// keepalive sends msg every interval (the call's Keepalive-Ping-Interval
// header, in seconds; none without it) until ctx ends.
func (s *stream) keepalive(ctx context.Context, r *http.Request, msg any) {
	secs, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval"))
	if err != nil || secs <= 0 {
		return
	}
	t := time.NewTicker(time.Duration(min(secs, 3600)) * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.Send(msg) != nil {
				return
			}
		}
	}
}
