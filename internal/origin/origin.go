// Package origin says who or what caused a change: the request it came
// in (one request ID that logs, lifecycle events and the audit log all
// carry) and the actor behind it (an API key, a policy such as a
// sandbox's timeout, or the leader's background work).
//
// The control plane puts an Origin in a request's context when it
// authenticates the request; background work puts its own. Whatever
// records the change (the store's events, the audit log, a log line)
// reads it back with From.
package origin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
)

// Kinds of actors.
const (
	KindKey    = "api_key" // a request authenticated by an API key; ID is the key's ID
	KindPolicy = "policy"  // a rule the user set acting on its own (timeout, checkpoint policy); ID names it
	KindLeader = "leader"  // the control plane's background work (reconcile, recovery); ID is the replica
	KindWorker = "worker"  // a worker reported it (a VM died); ID is the worker
)

// Origin is the cause of a change.
type Origin struct {
	// RequestID is the API request the change came in, or the ID given
	// to one round of background work; "" if none.
	RequestID string
	// Kind is one of the Kind constants; "" = unknown.
	Kind string
	// ID names the actor within its kind (an API key's ID, "timeout",
	// a replica's ID).
	ID string
	// Source is the client's address of an API request ("" otherwise).
	Source string
}

// Actor is the actor as one string: "api_key:key_…", "policy:timeout",
// "leader:replica-1"; "" if the kind is unknown.
func (o Origin) Actor() string {
	if o.Kind == "" {
		return ""
	}
	if o.ID == "" {
		return o.Kind
	}
	return o.Kind + ":" + o.ID
}

type key struct{}

// With returns ctx carrying o.
func With(ctx context.Context, o Origin) context.Context {
	return context.WithValue(ctx, key{}, o)
}

// From returns the Origin ctx carries, or the zero Origin.
func From(ctx context.Context) Origin {
	o, _ := ctx.Value(key{}).(Origin)
	return o
}

// Background returns ctx carrying an Origin of kind (KindPolicy,
// KindLeader, …) and id with a new request ID, keeping nothing of an
// API request's: for work the control plane starts on its own.
func Background(ctx context.Context, kind, id string) context.Context {
	return With(ctx, Origin{RequestID: NewRequestID(), Kind: kind, ID: id})
}

// Header is the HTTP header that carries a request ID, both ways.
const Header = "X-Request-Id"

// NewRequestID returns a new random request ID ("req_" and 20 hex
// digits).
func NewRequestID() string {
	var b [10]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return "req_" + hex.EncodeToString(b[:])
}

// maxRequestID bounds a request ID a client chose.
const maxRequestID = 128

// RequestIDOf returns the request ID a client sent in the Header if it
// is well formed (1 to 128 of letters, digits, '-', '_', '.', ':'), so
// a caller can tie its own logs to ours; otherwise a new one.
func RequestIDOf(r *http.Request) string {
	id := r.Header.Get(Header)
	if id == "" || len(id) > maxRequestID {
		return NewRequestID()
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return NewRequestID()
		}
	}
	return id
}

// Middleware gives every request a request ID (the client's, if well
// formed, else a new one), answers it in the Header, and puts an Origin
// with it and the client's address in the request's context. The actor
// is filled in once the request is authenticated (SetActor).
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := Origin{RequestID: RequestIDOf(r), Source: r.RemoteAddr}
		w.Header().Set(Header, o.RequestID)
		next.ServeHTTP(w, r.WithContext(With(r.Context(), o)))
	})
}

// SetActor returns ctx with its Origin's actor set to kind and id,
// keeping its request ID and source.
func SetActor(ctx context.Context, kind, id string) context.Context {
	o := From(ctx)
	o.Kind, o.ID = kind, id
	return With(ctx, o)
}

// LogHandler wraps h so that a record logged with a context carrying
// an Origin (slog's …Context methods) gets its request_id and actor.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if o := From(ctx); o.RequestID != "" || o.Kind != "" {
		if o.RequestID != "" {
			r.AddAttrs(slog.String("request_id", o.RequestID))
		}
		if a := o.Actor(); a != "" {
			r.AddAttrs(slog.String("actor", a))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}

func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{h.Handler.WithGroup(name)}
}
