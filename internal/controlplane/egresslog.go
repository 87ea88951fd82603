package controlplane

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/store"
)

// Egress audit logs. A sandbox's worker keeps the log of its run there
// (see worker.Worker.OpenEgressLog). When the sandbox leaves the worker
// (deleted, suspended), the control plane archives that log in the store,
// gzipped, under the worker's name for the run. GET .../egress answers
// with the archived runs, oldest first, then the live one: for a deleted
// sandbox too, until Config.EgressLogRetention has passed.

// DefaultEgressLogRetention is how long archived egress logs are kept
// unless Config.EgressLogRetention says otherwise.
const DefaultEgressLogRetention = 30 * 24 * time.Hour

// maxLiveEgressLog bounds what is read of a worker's log (it rotates at
// 16 MiB and keeps one previous file).
const maxLiveEgressLog = 40 << 20

// archiveEgress copies sb's egress log from wk into the store, before wk
// destroys the sandbox. A log the worker cannot give (the sandbox is
// gone from it, the worker is down) is reported and skipped; a store that
// cannot take it fails the call, so the caller keeps the sandbox and a
// retry archives it (the same run's log replaces its copy).
func (s *Server) archiveEgress(ctx context.Context, wk Worker, sb store.Sandbox) error {
	logID, rc, err := wk.EgressLog(ctx, sb.ID)
	if errors.Is(err, errkind.NotFound) {
		return nil
	}
	if err != nil {
		s.log.Warn("egress log not archived: its worker did not give it", "sandbox_id", sb.ID, "worker_id", wk.ID(), "err", err)
		return nil
	}
	defer rc.Close()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	n, err := io.Copy(zw, io.LimitReader(rc, maxLiveEgressLog))
	if err = errors.Join(err, zw.Close()); err != nil {
		s.log.Warn("egress log not archived: reading it failed", "sandbox_id", sb.ID, "worker_id", wk.ID(), "err", err)
		return nil
	}
	if n == 0 {
		return nil // no decision to keep
	}
	if logID == "" {
		logID = wk.ID() + "/" + sb.ID
	}
	if _, err := s.cfg.Store.PutEgressLog(ctx, store.EgressLog{TeamID: sb.TeamID, SandboxID: sb.ID, LogID: logID, Data: buf.Bytes()}); err != nil {
		return err
	}
	s.log.Info("egress log archived", "sandbox_id", sb.ID, "log_id", logID, "bytes", n)
	return nil
}

// handleEgressLog answers GET /v1/sandboxes/{id}/egress: the archived
// logs of the sandbox's earlier runs, then its worker's.
func (s *Server) handleEgressLog(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sb, err := s.load(r)
	if err != nil && !errors.Is(err, errkind.NotFound) {
		httpapi.WriteError(w, err)
		return
	}
	segs, serr := s.cfg.Store.EgressLogs(ctx, callerOf(r).team, r.PathValue("id"))
	if serr != nil && !errors.Is(serr, errkind.InvalidArgument) {
		httpapi.WriteError(w, serr)
		return
	}
	if err != nil && len(segs) == 0 {
		httpapi.WriteError(w, err) // no such sandbox, nor an archive of one
		return
	}
	var liveID string
	var live io.ReadCloser
	if err == nil && sb.WorkerID != "" {
		wk, werr := s.worker(sb.WorkerID)
		if werr == nil {
			liveID, live, werr = wk.EgressLog(ctx, sb.ID)
		}
		switch {
		case errors.Is(werr, errkind.NotFound):
		case werr != nil && len(segs) == 0:
			httpapi.WriteError(w, werr)
			return
		case werr != nil:
			s.log.Warn("egress log: the live part is missing", "sandbox_id", sb.ID, "err", werr)
		}
	}
	if live != nil {
		defer live.Close()
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	for _, seg := range segs {
		if seg.LogID == liveID {
			continue // archived, but the sandbox stayed (a retried delete)
		}
		zr, err := gzip.NewReader(bytes.NewReader(seg.Data))
		if err == nil {
			_, err = io.Copy(w, zr)
		}
		if err != nil {
			s.log.Error("egress log: unreadable archive", "sandbox_id", sb.ID, "log_id", seg.LogID, "err", err)
			return
		}
	}
	if live != nil {
		io.Copy(w, live)
	}
}

// pruneEgressLogs removes archived egress logs past their retention.
func (s *Server) pruneEgressLogs(ctx context.Context) {
	if s.cfg.EgressLogRetention < 0 {
		return
	}
	n, err := s.cfg.Store.DeleteEgressLogsBefore(ctx, s.now().Add(-s.cfg.EgressLogRetention))
	if err != nil {
		s.log.Warn("prune egress logs", "err", err)
	} else if n > 0 {
		s.log.Info("pruned egress logs", "segments", n)
	}
}
