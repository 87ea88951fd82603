package workerproto

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"space/internal/errkind"
	"space/internal/httpapi"
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
		resp, err := v.serve(r.Context(), s, r.PathValue("id"), req)
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
