package worker

import (
	"cmp"
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
		mux.HandleFunc(r.pattern, w.fenced(w.inUse(w.metrics.counted(dataPath(r.pattern), r.h))))
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
		{"POST " + base + "/processes/{pid}/stdin", w.withAgent(handleStdin)},
		{"POST " + base + "/processes/{pid}/resize", w.withAgent(handleResize)},
		{"GET " + base + "/files", w.withAgent(handleReadFile)},
		{"PUT " + base + "/files", w.withAgent(handleWriteFile)},
		{"DELETE " + base + "/files", w.withAgent(handleRemoveFile)},
		{"GET " + base + "/files/list", w.withAgent(handleListFiles)},
		{"GET " + base + "/files/stat", w.withAgent(handleStatFile)},
		{"POST " + base + "/files/mkdir", w.withAgent(handleMakeDir)},
		{"POST " + base + "/files/move", w.withAgent(handleMove)},
		{"GET " + base + "/files/watch", w.withAgent(handleWatchFiles)},
		{"GET " + base + "/files/upload", w.withAgent(handleUploadState)},
		{"DELETE " + base + "/files/upload", w.withAgent(handleUploadAbort)},
		{"GET " + base + "/files/tar", w.withAgent(handleReadTar)},
		{"PUT " + base + "/files/tar", w.withAgent(handleWriteTar)},
		{"GET " + base + "/ports/{port}", w.withAgent(handlePort)},
		{base + "/ports/{port}/http/{path...}", w.handleExposed},
	}
}

// dataPath is the data-plane path label of a route's pattern: files,
// ports, terminal (a process's attached terminal) or exec (the other
// process routes).
func dataPath(pattern string) string {
	rest := pattern[strings.Index(pattern, workerproto.DataPattern)+len(workerproto.DataPattern):]
	switch {
	case strings.HasPrefix(rest, "/files"):
		return pathFiles
	case strings.HasPrefix(rest, "/ports"):
		return pathPorts
	case strings.HasSuffix(rest, "/attach"):
		return pathTerminal
	}
	return pathExec
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
	return checkPath("path", r.URL.Query().Get("path"))
}

// checkPath checks that p, the parameter or field name, is an absolute
// guest path.
func checkPath(name, p string) (string, error) {
	if p == "" || !strings.HasPrefix(p, "/") || len(p) > 4096 || strings.ContainsRune(p, 0) {
		return "", httpapi.Invalid(name, "want an absolute guest path, got %.100q", p)
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

// fileInfo is the API's form of the agent's description of the guest
// path p.
func fileInfo(p string, e proto.FileInfo) api.FileInfo {
	return api.FileInfo{
		Name: e.Name, Path: p, Type: string(e.Type), Size: e.Size, Mode: e.Mode & 0o7777,
		Permissions: permissions(e.Type, e.Mode),
		Owner:       cmp.Or(e.Owner, strconv.FormatUint(uint64(e.UID), 10)),
		Group:       cmp.Or(e.Group, strconv.FormatUint(uint64(e.GID), 10)),
		UID:         e.UID, GID: e.GID,
		ModTime: time.Unix(0, e.MtimeNS).UTC(), Target: e.Target, Metadata: e.Xattrs,
	}
}

// permissions shows a file's type and mode as ls -l does: "drwxr-xr-x",
// "-rwsr-x---", "drwxrwxrwt".
func permissions(t proto.FileType, mode uint32) string {
	b := []byte("?---------")
	switch t {
	case proto.FileRegular:
		b[0] = '-'
	case proto.FileDir:
		b[0] = 'd'
	case proto.FileSymlink:
		b[0] = 'l'
	}
	for i, c := range "rwxrwxrwx" {
		if mode&(1<<(8-i)) != 0 {
			b[1+i] = byte(c)
		}
	}
	special := func(i int, bit uint32, set, unset byte) {
		if mode&bit == 0 {
			return
		}
		if b[i] == 'x' {
			b[i] = set
		} else {
			b[i] = unset
		}
	}
	special(3, 0o4000, 's', 'S')
	special(6, 0o2000, 's', 'S')
	special(9, 0o1000, 't', 'T')
	return string(b)
}

// decodeStrict decodes a JSON message strictly (WebSocket messages).
func decodeStrict(b []byte, v any) error { return httpapi.Unmarshal(b, v) }
