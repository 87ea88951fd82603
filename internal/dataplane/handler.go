package dataplane

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/store"
)

// Route is one data-plane route, below /v1/sandboxes/{id}.
type Route struct {
	Method string
	Path   string // "" or "/exec", "/files", "/ports/{port}/http/{path...}", ...
}

// SandboxBase is the public path of a sandbox; data-plane routes follow it.
const SandboxBase = "/v1/sandboxes/{id}"

// Routes are the data plane's routes: what a data-plane token opens.
var Routes = []Route{
	{"POST", "/exec"},
	{"GET", "/exec/ws"},
	{"GET", "/processes"},
	{"GET", "/processes/{pid}"},
	{"GET", "/processes/{pid}/output"},
	{"GET", "/processes/{pid}/attach"},
	{"POST", "/processes/{pid}/signal"},
	{"POST", "/processes/{pid}/stdin"},
	{"POST", "/processes/{pid}/resize"},
	{"GET", "/files"},
	{"PUT", "/files"},
	{"DELETE", "/files"},
	{"GET", "/files/list"},
	{"GET", "/files/stat"},
	{"POST", "/files/mkdir"},
	{"POST", "/files/move"},
	{"GET", "/files/watch"},
	{"GET", "/files/upload"},
	{"DELETE", "/files/upload"},
	{"GET", "/files/tar"},
	{"PUT", "/files/tar"},
	{"GET", "/ports/{port}"},
	{"GET", "/ports/{port}/http/{path...}"},
	{"POST", "/ports/{port}/http/{path...}"},
	{"PUT", "/ports/{port}/http/{path...}"},
	{"PATCH", "/ports/{port}/http/{path...}"},
	{"DELETE", "/ports/{port}/http/{path...}"},
}

// Workers finds the worker a grant names. Forward returns the handler
// that serves that worker's API (paths under workerPrefix), or an error
// wrapping errkind.Unavailable when it cannot be reached.
type Workers interface {
	Forward(g Grant) (http.Handler, error)
}

// Config configures a Handler.
type Config struct {
	// Sealer opens the tokens. Required.
	Sealer *Sealer
	// Workers reaches the workers tokens name. Required.
	Workers Workers
	// WorkerPrefix is where the workers serve their API
	// (worker.PathPrefix). Required.
	WorkerPrefix string
	// MaxUpload bounds a file upload's body; 0 = 1 GiB.
	MaxUpload int64
	// Now is the clock; nil = time.Now.
	Now func() time.Time
}

// Handler serves the data-plane routes for requests that carry a token
// (Authorization: Bearer sdp1_...).
type Handler struct {
	cfg Config
	mux *http.ServeMux
}

// NewHandler validates cfg and returns the handler.
func NewHandler(cfg Config) (*Handler, error) {
	if cfg.Sealer == nil || cfg.Workers == nil || cfg.WorkerPrefix == "" {
		return nil, fmt.Errorf("dataplane: sealer, workers and worker prefix are required: %w", errkind.InvalidArgument)
	}
	if cfg.MaxUpload == 0 {
		cfg.MaxUpload = 1 << 30
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	for _, rt := range Routes {
		h.mux.HandleFunc(rt.Method+" "+SandboxBase+rt.Path, h.serve)
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, fmt.Errorf("no data-plane route %s %s: %w", r.Method, r.URL.Path, errkind.NotFound))
	})
	return h, nil
}

// HasToken reports whether r carries a data-plane token rather than an
// API key: `space server` serves such requests with a Handler.
func HasToken(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("Authorization"), "Bearer "+TokenPrefix)
}

// ServeHTTP serves one data-plane request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		httpapi.WriteError(w, fmt.Errorf("missing data-plane token (Authorization: Bearer %s...; a sandbox's data_plane.token): %w", TokenPrefix, httpapi.ErrUnauthenticated))
		return
	}
	g, err := h.cfg.Sealer.Open(tok, h.cfg.Now())
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	id := r.PathValue("id")
	if !store.ValidSandboxID(id) || id != g.Sandbox {
		// The token opens another sandbox: this one is not the
		// bearer's to know about.
		httpapi.WriteError(w, fmt.Errorf("sandbox %.64q: %w", id, errkind.NotFound))
		return
	}
	wk, err := h.cfg.Workers.Forward(g)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"+id)
	r2 := r.Clone(r.Context())
	r2.URL.Path = h.cfg.WorkerPrefix + "/sandboxes/" + id + rest
	r2.URL.RawPath = ""
	r2.Header.Del("Authorization")
	if r.Method == http.MethodPut {
		r2.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxUpload)
	}
	wk.ServeHTTP(w, r2)
}
