package worker

import (
	"context"
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"space/api"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/httpapi"
)

// PathPrefix starts every route of the worker API. The data-plane routes
// below it mirror the public API's: /v1/sandboxes/{id}/<rest> there is
// PathPrefix+/sandboxes/{id}/<rest> here.
const PathPrefix = "/worker/v1"

// CreateRequest is the body of POST /worker/v1/sandboxes.
type CreateRequest struct {
	ID   string `json:"id"`
	Team string `json:"team"`
	// Spec is what the sandbox runs with. With FromSnapshot it is the
	// snapshot's, unless Spec.Template is set: then it must match the
	// snapshot's and gives the exec defaults (see CreateFromSnapshot).
	Spec Spec `json:"spec"`
	// FromSnapshot restores the sandbox from this worker's snapshot
	// instead of booting it; "" boots.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// TakeSnapshot spends FromSnapshot, a snapshot on this worker's disk
	// only (not chunked), on this sandbox: its memory file and disk move
	// into the sandbox instead of being copied, and the snapshot is gone
	// afterwards, whatever the outcome. For the last child of a fork.
	TakeSnapshot bool `json:"take_snapshot,omitempty"`
	// SecretValues are the values of the secrets Spec grants, by name.
	// The worker keeps them sealed (Config.Secrets) and gives them only
	// to the sandbox's gateway.
	SecretValues map[string][]byte `json:"secret_values,omitempty"`
}

// Overrides is the spec CreateFromSnapshot gets for the request.
func (req CreateRequest) Overrides() *Spec {
	if req.Spec.Template == "" {
		return nil
	}
	return &req.Spec
}

// SnapshotRequest is the body of the worker's snapshot and restore routes.
type SnapshotRequest struct {
	SnapshotID string `json:"snapshot_id"`
	// Local keeps a new snapshot on the worker's disk only, out of the
	// chunk store: for one that lives only as long as a fork takes.
	Local bool `json:"local,omitempty"`
	// Ephemeral skips making the snapshot durable: it only has to outlive
	// this worker process, not a host crash (a fork's).
	Ephemeral bool `json:"ephemeral,omitempty"`
}

// Handler returns the worker's HTTP API. When token is not empty every
// request must carry it as a bearer token.
func (w *Worker) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	p := PathPrefix
	mux.HandleFunc("GET "+p+"/status", func(rw http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(rw, http.StatusOK, w.Status())
	})
	mux.HandleFunc("POST "+p+"/sandboxes", w.handleCreate)
	mux.HandleFunc("PUT "+p+"/sandboxes/{id}/network", func(rw http.ResponseWriter, r *http.Request) {
		var n Network
		if err := httpapi.DecodeJSON(r, &n); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		inf, err := w.SetNetwork(r.Context(), r.PathValue("id"), n)
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		httpapi.WriteJSON(rw, http.StatusOK, inf)
	})
	mux.HandleFunc("PUT "+p+"/sandboxes/{id}/secrets", func(rw http.ResponseWriter, r *http.Request) {
		var req SecretsRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		inf, err := w.SetSecrets(r.Context(), r.PathValue("id"), req)
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		httpapi.WriteJSON(rw, http.StatusOK, inf)
	})
	mux.HandleFunc("GET "+p+"/sandboxes/{id}/egress", func(rw http.ResponseWriter, r *http.Request) {
		if _, err := w.Sandbox(r.PathValue("id")); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		logID, rc, err := w.OpenEgressLog(r.PathValue("id"))
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		defer rc.Close()
		rw.Header().Set("Content-Type", "application/x-ndjson")
		rw.Header().Set(EgressLogHeader, logID)
		if _, err := io.Copy(rw, rc); err != nil {
			w.log.Warn("egress log", "sandbox_id", r.PathValue("id"), "err", err)
		}
	})
	mux.HandleFunc("GET "+p+"/sandboxes", func(rw http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(rw, http.StatusOK, w.List())
	})
	mux.HandleFunc("GET "+p+"/sandboxes/{id}", func(rw http.ResponseWriter, r *http.Request) {
		inf, err := w.Sandbox(r.PathValue("id"))
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		httpapi.WriteJSON(rw, http.StatusOK, inf)
	})
	for verb, f := range map[string]func(context.Context, string) (Info, error){"pause": w.Pause, "resume": w.Resume} {
		mux.HandleFunc("POST "+p+"/sandboxes/{id}/"+verb, func(rw http.ResponseWriter, r *http.Request) {
			inf, err := f(r.Context(), r.PathValue("id"))
			if err != nil {
				httpapi.WriteError(rw, err)
				return
			}
			httpapi.WriteJSON(rw, http.StatusOK, inf)
		})
	}
	mux.HandleFunc("DELETE "+p+"/sandboxes/{id}", func(rw http.ResponseWriter, r *http.Request) {
		if err := w.Delete(r.Context(), r.PathValue("id")); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		rw.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+p+"/sandboxes/{id}/snapshots", func(rw http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		info, err := w.Snapshot(r.Context(), r.PathValue("id"), req)
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		httpapi.WriteJSON(rw, http.StatusCreated, info)
	})
	mux.HandleFunc("POST "+p+"/sandboxes/{id}/restore", func(rw http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if err := httpapi.DecodeJSON(r, &req); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		inf, err := w.Restore(r.Context(), r.PathValue("id"), req.SnapshotID)
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		httpapi.WriteJSON(rw, http.StatusOK, inf)
	})
	mux.HandleFunc("GET "+p+"/snapshots/{sid}", func(rw http.ResponseWriter, r *http.Request) {
		info, err := w.SnapshotInfo(r.PathValue("sid"))
		if err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		httpapi.WriteJSON(rw, http.StatusOK, info)
	})
	mux.HandleFunc("DELETE "+p+"/snapshots/{sid}", func(rw http.ResponseWriter, r *http.Request) {
		if err := w.DeleteSnapshot(r.PathValue("sid")); err != nil {
			httpapi.WriteError(rw, err)
			return
		}
		rw.WriteHeader(http.StatusNoContent)
	})
	w.dataRoutes(mux, p+"/sandboxes/{id}")
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

func (w *Worker) handleCreate(rw http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(rw, err)
		return
	}
	inf, err := w.CreateWith(r.Context(), req)
	if err != nil {
		httpapi.WriteError(rw, err)
		return
	}
	httpapi.WriteJSON(rw, http.StatusCreated, inf)
}

// dataRoutes adds the data-plane routes under base.
func (w *Worker) dataRoutes(mux *http.ServeMux, base string) {
	mux.HandleFunc("POST "+base+"/exec", w.withAgent(w.handleExec))
	mux.HandleFunc("GET "+base+"/exec/ws", w.withAgent(w.handleExecWS))
	mux.HandleFunc("GET "+base+"/processes", w.withAgent(handleProcesses))
	mux.HandleFunc("GET "+base+"/processes/{pid}", w.withAgent(handleProcess))
	mux.HandleFunc("GET "+base+"/processes/{pid}/output", w.withAgent(handleOutput))
	mux.HandleFunc("GET "+base+"/processes/{pid}/attach", w.withAgent(handleAttachWS))
	mux.HandleFunc("POST "+base+"/processes/{pid}/signal", w.withAgent(handleSignal))
	mux.HandleFunc("GET "+base+"/files", w.withAgent(handleReadFile))
	mux.HandleFunc("PUT "+base+"/files", w.withAgent(handleWriteFile))
	mux.HandleFunc("DELETE "+base+"/files", w.withAgent(handleRemoveFile))
	mux.HandleFunc("GET "+base+"/files/list", w.withAgent(handleListFiles))
	mux.HandleFunc("GET "+base+"/ports/{port}", w.withAgent(handlePort))
	mux.HandleFunc(base+"/ports/{port}/http/{path...}", w.handleExposed)
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

func handleReadFile(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	fi, err := a.Stat(r.Context(), path)
	if err != nil {
		return err
	}
	if fi.Type != proto.FileRegular {
		return fmt.Errorf("%s is a %s, not a file: %w", path, fi.Type, errkind.InvalidArgument)
	}
	rw.Header().Set("Content-Type", "application/octet-stream")
	rw.Header().Set("X-Space-File-Mode", fmt.Sprintf("%04o", fi.Mode&0o7777))
	rw.Header().Set("X-Space-File-Size", strconv.FormatInt(fi.Size, 10))
	sw := &startedWriter{w: rw}
	if _, err := a.ReadFile(r.Context(), path, sw); err != nil {
		if !sw.started {
			return err
		}
		// Mid-body: cut the response so the client sees a short read.
		panic(http.ErrAbortHandler)
	}
	if !sw.started {
		rw.WriteHeader(http.StatusOK)
	}
	return nil
}

// startedWriter records whether any byte was written.
type startedWriter struct {
	w       http.ResponseWriter
	started bool
}

func (s *startedWriter) Write(p []byte) (int, error) {
	s.started = true
	return s.w.Write(p)
}

// maxFileMode is the largest mode bits a file write may set.
const maxFileMode = 0o7777

func handleWriteFile(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	args := proto.WriteArgs{Path: path, Mode: 0o644}
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > maxFileMode {
			return httpapi.Invalid("mode", "want octal permission bits, got %.20q", m)
		}
		args.Mode = uint32(v)
	}
	if args.MkdirAll, err = boolParam(r, "mkdir"); err != nil {
		return err
	}
	n, err := a.WriteFile(r.Context(), args, r.Body)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, api.FileWritten{Path: path, Size: n})
	return nil
}

func handleRemoveFile(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		return err
	}
	if err := a.Remove(r.Context(), path, recursive); err != nil {
		return err
	}
	rw.WriteHeader(http.StatusNoContent)
	return nil
}

// maxListEntries bounds one directory listing.
const maxListEntries = 10000

func handleListFiles(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	path, err := guestPath(r)
	if err != nil {
		return err
	}
	entries, err := a.List(r.Context(), path, maxListEntries)
	if err != nil {
		return err
	}
	out := api.FileList{Path: path, Entries: make([]api.FileInfo, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, fileInfo(e))
	}
	httpapi.WriteJSON(rw, http.StatusOK, out)
	return nil
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
