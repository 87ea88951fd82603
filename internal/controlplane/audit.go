package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"space/api"
	"space/internal/audit"
	"space/internal/dataplane"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/origin"
	"space/internal/store"
)

// DefaultAuditRetention is how long audit entries are kept unless
// Config.AuditRetention says otherwise.
const DefaultAuditRetention = 365 * 24 * time.Hour

// auditWriteTimeout bounds one append: the answer it follows is complete
// but for the end of its body, which waits for it.
const auditWriteTimeout = 10 * time.Second

// auditAppender is the store's side of the audit log that recording
// needs.
type auditAppender interface {
	AppendAudit(ctx context.Context, e store.AuditEntry) (store.AuditEntry, error)
}

// auditor records API calls in the audit log (store.Audit): every call
// whose method changes something (not GET, HEAD or OPTIONS, and the GET
// routes in mutatingGets), and every call answered 401 or 403, whatever
// its method. An entry names the route's template, the path's values
// and the key; never the body, the query or a header. It is appended
// once the handler returns, so it has the status code; a failed append
// is logged and counted, and changes nothing of the answer the client
// already has.
type auditor struct {
	store  auditAppender
	log    *slog.Logger
	errors prometheus.Counter // space_audit_write_errors_total
}

// mutatingGets are the GET routes that change a sandbox: WebSockets that
// run a command or write to one's stdin.
var mutatingGets = map[string]bool{
	"/v1/sandboxes/{id}/exec/ws":                true,
	"/v1/sandboxes/{id}/processes/{pid}/attach": true,
}

func newAuditor(reg prometheus.Registerer, st auditAppender, log *slog.Logger) (*auditor, error) {
	a := &auditor{store: st, log: log, errors: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "space_audit_write_errors_total",
		Help: "Audit log entries that could not be written (the call they record was answered regardless).",
	})}
	if err := reg.Register(a.errors); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return a, nil
}

// auditNote is what a request's handlers tell the auditor: the caller,
// once authenticate knows it, and the ID a create made. One request's
// handlers run one at a time, so it needs no lock.
type auditNote struct {
	keyID, team string
	created     string // or ""
}

type auditNoteKey struct{}

// noteCaller tells the auditor of ctx's request who made it.
func noteCaller(ctx context.Context, c caller) {
	if n, ok := ctx.Value(auditNoteKey{}).(*auditNote); ok {
		n.keyID, n.team = c.keyID, c.team
	}
}

// noteCreated tells the auditor of ctx's request the ID of what it
// created.
func noteCreated(ctx context.Context, id string) {
	if n, ok := ctx.Value(auditNoteKey{}).(*auditNote); ok {
		n.created = id
	}
}

// wildcardRE finds a route template's wildcards; "{path...}" spans
// segments and is not recorded (it is a sandbox's own URL, which may
// carry anything).
var wildcardRE = regexp.MustCompile(`\{([a-z]+)(\.\.\.)?\}`)

// wrap records the calls of h, the handler of route (a template) and
// method, in the audit log. A public route (no API key) records only its
// refusals: a worker's registration is its heartbeat.
func (a *auditor) wrap(route, method string, public bool, h http.HandlerFunc) http.HandlerFunc {
	var names []string
	for _, m := range wildcardRE.FindAllStringSubmatch(route, -1) {
		if m[2] == "" {
			names = append(names, m[1])
		}
	}
	mutating := !public && (method != http.MethodGet && method != http.MethodHead && method != http.MethodOptions || mutatingGets[route])
	return func(w http.ResponseWriter, r *http.Request) {
		rec, ok := w.(*statusRecorder)
		if !ok { // instrument wraps every route; this one is for a handler used alone
			rec = &statusRecorder{ResponseWriter: w}
		}
		note := &auditNote{}
		h(rec, r.WithContext(context.WithValue(r.Context(), auditNoteKey{}, note)))
		code := rec.status()
		// HEAD is served by a GET route: it changes nothing.
		if !(mutating && r.Method != http.MethodHead) && code != http.StatusUnauthorized && code != http.StatusForbidden {
			return
		}
		o := origin.From(r.Context())
		e := store.AuditEntry{
			RequestID: auditString(o.RequestID), KeyID: note.keyID, TeamID: note.team, Source: auditString(o.Source),
			Method: auditString(r.Method), Route: route, Code: code, Outcome: store.AuditOutcome(code),
		}
		for _, name := range names {
			if v := r.PathValue(name); v != "" {
				if e.Targets == nil {
					e.Targets = map[string]string{}
				}
				e.Targets[name] = auditString(v)
			}
		}
		if note.created != "" {
			if e.Targets == nil {
				e.Targets = map[string]string{}
			}
			e.Targets["created"] = auditString(note.created)
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), auditWriteTimeout)
		defer cancel()
		if _, err := a.store.AppendAudit(ctx, e); err != nil {
			a.errors.Inc()
			a.log.ErrorContext(ctx, "audit write failed; the call was answered", "method", e.Method, "route", route, "code", code, "err", err)
		}
	}
}

// auditedPlane is the data plane (s.plane) with its calls recorded as
// the API's are, by route template: a data-plane token's call is the
// same call as one with an API key. The token names the team, not the
// key that got it (with the sandbox's record), so KeyID stays empty.
func (s *Server) auditedPlane() http.Handler {
	serve := func(w http.ResponseWriter, r *http.Request) {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			if g, err := s.sealer.Open(tok, s.now()); err == nil {
				noteCaller(r.Context(), caller{team: g.Team})
			}
		}
		s.plane.ServeHTTP(w, r)
	}
	mux := http.NewServeMux()
	for _, rt := range dataplane.Routes {
		path := dataplane.SandboxBase + rt.Path
		mux.HandleFunc(rt.Method+" "+path, s.auditor.wrap(path, rt.Method, false, serve))
	}
	mux.Handle("/", s.plane) // its answer to an unknown route
	return mux
}

// auditString is s as an audit entry may hold it (store.AuditEntry's
// Validate): invalid UTF-8 and control characters become U+FFFD, and it
// is cut to 256 bytes.
func auditString(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, string(utf8.RuneError)))
	for len(s) > 256 {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// Bounds of GET /v1/audit.
const (
	defaultAuditLimit = 100
	maxAuditLimit     = 1000
	auditExportPage   = 1000 // entries read at a time for an NDJSON export
)

// handleAudit serves GET /v1/audit: a page of entries (JSON), or every
// matching entry one per line after the anchor (NDJSON: ?format=ndjson
// or Accept: application/x-ndjson), for export and verification. Admin
// keys only.
func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request) {
	if !callerOf(r).admin {
		httpapi.WriteError(w, fmt.Errorf("reading the audit log needs an admin key: %w", errkind.PermissionDenied))
		return
	}
	q, ndjson, err := auditQuery(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	ctx := r.Context()
	page := q
	if ndjson {
		page.Limit = auditExportPage
	} else {
		page.Limit = q.Limit + 1 // one more: is there a next page?
	}
	anchor, entries, err := s.auditPage(ctx, page)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if !ndjson {
		out := api.AuditList{Entries: []api.AuditEntry{}, Anchor: audit.AnchorToAPI(anchor)}
		if len(entries) > q.Limit {
			entries = entries[:q.Limit]
			out.Next = entries[len(entries)-1].Seq
		}
		for _, e := range entries {
			out.Entries = append(out.Entries, audit.ToAPI(e))
		}
		httpapi.WriteJSON(w, http.StatusOK, out)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if err := enc.Encode(api.AuditExportHead{Anchor: audit.AnchorToAPI(anchor)}); err != nil {
		return // the client went away
	}
	for {
		for _, e := range entries {
			if err := enc.Encode(audit.ToAPI(e)); err != nil {
				return
			}
		}
		if len(entries) < page.Limit {
			return
		}
		http.NewResponseController(w).Flush()
		page.After = entries[len(entries)-1].Seq
		if entries, err = s.cfg.Store.ListAudit(ctx, page); err != nil {
			// The status is sent: end with an error line, so that the
			// export does not pass for a whole one.
			s.log.ErrorContext(ctx, "audit export cut short", "after", page.After, "err", err)
			enc.Encode(api.Error{Error: httpapi.Body(err)})
			return
		}
	}
}

// auditPage returns the anchor and the first page of q, read so that
// they agree: a prune between the two reads moves the anchor, and then
// both are read again.
func (s *Server) auditPage(ctx context.Context, q store.AuditQuery) (store.AuditAnchor, []store.AuditEntry, error) {
	for attempt := 0; ; attempt++ {
		before, err := s.cfg.Store.AuditAnchor(ctx)
		if err != nil {
			return store.AuditAnchor{}, nil, err
		}
		entries, err := s.cfg.Store.ListAudit(ctx, q)
		if err != nil {
			return store.AuditAnchor{}, nil, err
		}
		after, err := s.cfg.Store.AuditAnchor(ctx)
		if err != nil {
			return store.AuditAnchor{}, nil, err
		}
		if before.Seq == after.Seq || attempt == 2 {
			return after, entries, nil
		}
	}
}

// auditQuery reads GET /v1/audit's query: team, after, since, until,
// limit and format (or the Accept header).
func auditQuery(r *http.Request) (q store.AuditQuery, ndjson bool, err error) {
	v := r.URL.Query()
	if team := v.Get("team"); team != "" {
		if !store.ValidID(team) {
			return q, false, httpapi.Invalid("team", "%.64q: 1-128 characters of [A-Za-z0-9_.-]", team)
		}
		q.TeamID = team
	}
	if s := v.Get("after"); s != "" {
		if q.After, err = strconv.ParseInt(s, 10, 64); err != nil || q.After < 0 {
			return q, false, httpapi.Invalid("after", "%.32q: want a sequence number (the next of a page), 0 or more", s)
		}
	}
	for _, f := range []struct {
		name string
		t    *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		if s := v.Get(f.name); s != "" {
			if *f.t, err = time.Parse(time.RFC3339Nano, s); err != nil {
				return q, false, httpapi.Invalid(f.name, "%.64q: want an RFC 3339 time (2026-12-07T19:00:00Z)", s)
			}
		}
	}
	q.Limit = defaultAuditLimit
	if s := v.Get("limit"); s != "" {
		if q.Limit, err = strconv.Atoi(s); err != nil || q.Limit < 1 || q.Limit > maxAuditLimit {
			return q, false, httpapi.Invalid("limit", "%.32q: want 1 to %d", s, maxAuditLimit)
		}
	}
	switch v.Get("format") {
	case "":
		ndjson = strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
	case "json":
	case "ndjson":
		ndjson = true
	default:
		return q, false, httpapi.Invalid("format", "%.32q: want json or ndjson", v.Get("format"))
	}
	return q, ndjson, nil
}

// pruneAudit removes audit entries past their retention (the leader's
// work).
func (s *Server) pruneAudit(ctx context.Context) {
	if s.cfg.AuditRetention < 0 {
		return
	}
	n, err := s.cfg.Store.PruneAuditBefore(ctx, s.now().Add(-s.cfg.AuditRetention))
	if err != nil {
		s.log.Warn("prune audit log", "err", err)
	} else if n > 0 {
		s.log.Info("pruned audit log", "entries", n)
	}
}
