package worker

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"space/api"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/httpapi"
	"space/internal/workerproto"
)

// Handler returns the worker's HTTP API: the worker protocol's verbs
// (workerproto.Mount) and the data plane below workerproto.DataPattern,
// which answers 503 (ErrNoLease, with Retry-After) while the worker's
// fence holds no lease (see Lease). When token is not empty every request must carry it as a bearer token.
func (w *Worker) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	workerproto.Mount(mux, w, w.log)
	for _, r := range w.dataRoutes() {
		mux.HandleFunc(r.pattern, w.fenced(w.inUse(r.h)))
	}
	if token == "" {
		return mux
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			httpapi.WriteError(rw, fmt.Errorf("worker token missing or wrong: %w", httpapi.ErrUnauthenticated))
			return
		}
		mux.ServeHTTP(rw, r)
	})
}

// inUse counts h's requests as the sandbox's use (Info.LastActive,
// Active) while they run.
func (w *Worker) inUse(h http.HandlerFunc) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		if s, err := w.get(r.PathValue("id")); err == nil {
			defer s.use(time.Now)()
		}
		h(rw, r)
	}
}

// dataRoute is one data-plane route: pattern is a ServeMux pattern below
// workerproto.DataPattern.
type dataRoute struct {
	pattern string
	h       http.HandlerFunc
}

// dataRoutes are the data-plane routes. They mirror the public API's:
// /v1/sandboxes/{id}/<rest> there is workerproto.DataPattern/<rest> here.
func (w *Worker) dataRoutes() []dataRoute {
	base := workerproto.DataPattern
	return []dataRoute{
		{"POST " + base + "/exec", w.withAgent(w.handleExec)},
		{"GET " + base + "/exec/ws", w.withAgent(w.handleExecWS)},
		{"GET " + base + "/processes", w.withAgent(handleProcesses)},
		{"GET " + base + "/processes/{pid}", w.withAgent(handleProcess)},
		{"GET " + base + "/processes/{pid}/output", w.withAgent(handleOutput)},
		{"GET " + base + "/processes/{pid}/attach", w.withAgent(handleAttachWS)},
		{"POST " + base + "/processes/{pid}/signal", w.withAgent(handleSignal)},
		{"GET " + base + "/files", w.withAgent(handleReadFile)},
		{"PUT " + base + "/files", w.withAgent(handleWriteFile)},
		{"DELETE " + base + "/files", w.withAgent(handleRemoveFile)},
		{"GET " + base + "/files/list", w.withAgent(handleListFiles)},
		{"GET " + base + "/files/upload", w.withAgent(handleUploadState)},
		{"DELETE " + base + "/files/upload", w.withAgent(handleUploadAbort)},
		{"GET " + base + "/files/tar", w.withAgent(handleReadTar)},
		{"PUT " + base + "/files/tar", w.withAgent(handleWriteTar)},
		{"GET " + base + "/ports/{port}", w.withAgent(handlePort)},
		{base + "/ports/{port}/http/{path...}", w.handleExposed},
	}
}

// agentHandler serves a data-plane request with the sandbox's agent. An
// error it returns is answered as JSON; once it has started a response it
// reports failures in-band and returns nil.
type agentHandler func(rw http.ResponseWriter, r *http.Request, a *client.Client) error

// withAgent resolves the sandbox's agent for h.
func (w *Worker) withAgent(h agentHandler) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		a, err := w.agentFor(r.Context(), r.PathValue("id"))
		if err == nil {
			err = h(rw, r, a)
		}
		if err != nil {
			httpapi.WriteError(rw, err)
		}
	}
}

// guestPath returns the path query parameter, which must be absolute.
func guestPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" || !strings.HasPrefix(p, "/") || len(p) > 4096 || strings.ContainsRune(p, 0) {
		return "", httpapi.Invalid("path", "want an absolute guest path, got %.100q", p)
	}
	return p, nil
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, httpapi.Invalid(name, "want true or false, got %.20q", v)
	}
	return b, nil
}

// handlePort reports whether a TCP port of the guest's loopback accepts
// connections.
func handlePort(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	s := r.PathValue("port")
	port, err := strconv.Atoi(s)
	if err != nil || port < 1 || port > 65535 {
		return httpapi.Invalid("port", "want a TCP port 1..65535, got %.20q", s)
	}
	open, err := a.PortOpen(r.Context(), port)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, api.PortState{Port: port, Open: open})
	return nil
}

func fileInfo(e proto.FileInfo) api.FileInfo {
	return api.FileInfo{
		Name: e.Name, Type: string(e.Type), Size: e.Size, Mode: e.Mode & 0o7777,
		ModTime: time.Unix(0, e.MtimeNS).UTC(), Target: e.Target,
	}
}

// decodeStrict decodes a JSON message strictly (WebSocket messages).
func decodeStrict(b []byte, v any) error { return httpapi.Unmarshal(b, v) }
