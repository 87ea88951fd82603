package worker

import (
	"context"
	"fmt"

	"space/api"
	"space/internal/errkind"
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
