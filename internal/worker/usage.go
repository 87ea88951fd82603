package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"space/api"
	"space/internal/errkind"
	"space/internal/usage"
	"space/internal/workerproto"
)

// Usage returns sandbox id's usage history between req.Start and
// req.End (see package usage): the heartbeat samples it every
// Config.AgentHeartbeat while the VM runs.
func (w *Worker) Usage(_ context.Context, id string, req workerproto.UsageRequest) (api.SandboxMetrics, error) {
	if !req.Start.IsZero() && !req.End.IsZero() && req.End.Before(req.Start) {
		return api.SandboxMetrics{}, fmt.Errorf("usage of %s: end %s is before start %s: %w", id, req.End, req.Start, errkind.InvalidArgument)
	}
	s, err := w.get(id)
	if err != nil {
		return api.SandboxMetrics{}, err
	}
	samples := s.usage.Range(req.Start, req.End)
	if samples == nil {
		samples = []api.UsageSample{}
	}
	return api.SandboxMetrics{SandboxID: id, IntervalSeconds: max(w.cfg.AgentHeartbeat, 0).Seconds(), Samples: samples}, nil
}

// usageFile keeps a sandbox's usage history in its directory while its
// worker is stopped.
const usageFile = "usage.json"

// saveUsage writes s's usage history for the next worker of its VM (the
// worker is closing; its sandboxes stay). A failure loses only the
// history, so it is logged.
func (s *sbx) saveUsage(w *Worker) {
	if _, err := os.Stat(s.dir); err != nil {
		return // gone meanwhile
	}
	if err := writeJSONFile(s.dir, usageFile, s.usage.Save()); err != nil {
		w.log.Warn("usage history not kept across the restart", "dir", s.dir, "err", err)
	}
}

// loadUsage reads back what saveUsage wrote, once.
func (s *sbx) loadUsage(w *Worker) {
	path := filepath.Join(s.dir, usageFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var sv usage.Saved
	if err == nil {
		err = json.Unmarshal(b, &sv)
	}
	if err != nil {
		w.log.Warn("usage history of the previous run unreadable", "path", path, "err", err)
	} else {
		s.usage.Load(sv)
	}
	os.Remove(path)
}
