package workerproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/origin"
)

// Mount serves every verb of s on mux, below PathPrefix. Requests are
// decoded strictly (see the package doc); errors are answered as the
// public API answers them (httpapi.WriteError). log receives failures to
// stream an answer; nil = discard. Authentication is the caller's: wrap
// mux.
func Mount(mux *http.ServeMux, s Service, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, v := range verbs {
		mux.HandleFunc(v.def().Pattern(), v.handler(s, log))
	}
}

// Pattern returns the ServeMux pattern d is served at.
func (d Def) Pattern() string { return d.Method + " " + PathPrefix + d.Path }

func (v *Verb[Req, Resp]) handler(s Service, log *slog.Logger) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		var req Req
		if _, none := any(req).(None); none {
			if err := noBody(r); err != nil {
				httpapi.WriteError(rw, err)
				return
			}
		} else if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		resp, err := v.serve(originOf(r), s, r.PathValue("id"), req)
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		switch out := any(resp).(type) {
		case None:
			rw.WriteHeader(v.Code)
		case EgressLog:
			defer out.Body.Close()
			rw.Header().Set("Content-Type", "application/x-ndjson")
			rw.Header().Set(EgressLogHeader, out.ID)
			rw.WriteHeader(v.Code)
			if _, err := io.Copy(rw, out.Body); err != nil {
				log.Warn("egress log", "sandbox_id", r.PathValue("id"), "err", err)
			}
		default:
			httpapi.WriteJSON(rw, v.Code, resp)
		}
	}
}

// noBody refuses a request body where the verb takes none.
func noBody(r *http.Request) error {
	n, err := r.Body.Read(make([]byte, 1))
	if n > 0 {
		return fmt.Errorf("%s %s takes no request body: %w", r.Method, r.URL.Path, errkind.InvalidArgument)
	}
	if err != nil && err != io.EOF {
		return fmt.Errorf("read body: %w", errors.Join(err, errkind.InvalidArgument))
	}
	return nil
}

// ActorHeader carries the actor of the call's origin (origin.Origin.Actor)
// to the worker, beside the request ID in origin.Header, so the worker's
// log lines of one API request carry the same request_id and actor as
// the control plane's.
const ActorHeader = "Space-Actor"

// setOrigin writes o into the headers of a call.
func setOrigin(h http.Header, o origin.Origin) {
	if o.RequestID != "" {
		h.Set(origin.Header, o.RequestID)
	}
	if a := o.Actor(); a != "" {
		h.Set(ActorHeader, a)
	}
}

// originOf is r's context with the origin its headers carry, if any.
// They are the control plane's word (the call is authenticated), kept
// only if well formed.
func originOf(r *http.Request) context.Context {
	ctx := r.Context()
	if r.Header.Get(origin.Header) == "" {
		return ctx
	}
	o := origin.Origin{RequestID: origin.RequestIDOf(r)}
	if kind, id, ok := strings.Cut(r.Header.Get(ActorHeader), ":"); ok && len(kind) <= 16 && len(id) <= 128 && printable(kind+id) {
		o.Kind, o.ID = kind, id
	}
	return origin.With(ctx, o)
}

func printable(s string) bool {
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
