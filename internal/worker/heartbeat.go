package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/guestvm"
	"space/internal/sandbox"
	"space/internal/vmm"
	"space/internal/workerproto"
)

// The agent heartbeat. Each running sandbox's agent is asked for its
// health (proto.OpHealth, a new stream on the session) every
// Config.AgentHeartbeat; an answer must come within Config.AgentTimeout.
// The first probe that goes unanswered for that long while the VM ran
// throughout, or probes that fail at once (a session that ends, a
// handshake refused) for that long, declare the agent unresponsive: the
// worker logs it, closes
// the agent's client with a cause wrapping client.ErrUnresponsive (calls
// in flight, exec streams and transfers included, fail at once with it),
// the sandbox's Info.Agent says "unresponsive", and data-plane calls fail
// at once with that error instead of waiting on a connection. Nothing
// waits on the agent meanwhile but the heartbeat, which tries to connect
// again every period (one dial and handshake bounded by AgentTimeout);
// when the agent answers again, the sandbox is healthy again with a new
// connection. A silent exec (sleep 20) is no miss: the agent answers
// heartbeats while its process runs.
//
// A VM that is not running by the worker's doing is never probed, and a
// probe during which that changed counts for nothing: the user's pause,
// the fence's pause (and a worker without a lease), a snapshot, a
// resume. A probe that took much longer than AgentTimeout by the
// worker's clock means the worker itself was stopped (and, past its
// lease, its guests too); it counts for nothing either.
//
// Keep-alives of the yamux session stay off (proto.YamuxConfig): they
// would close the session of a paused VM, which the worker must keep.

const (
	// defaultAgentHeartbeat and defaultAgentTimeout are the defaults of
	// Config.AgentHeartbeat and AgentTimeout. An idle agent answers a
	// health call in well under a millisecond under KVM and in a few
	// milliseconds under TCG; 15 s leaves room for a TCG guest on a host
	// with far more vCPUs than cores, and for a health call queued behind
	// a bulk transfer (each stream's window is 1 MiB, see
	// proto.YamuxConfig).
	defaultAgentHeartbeat = 5 * time.Second
	defaultAgentTimeout   = 15 * time.Second
)

// stopVM marks the start of an operation that stops or continues the
// VM's vCPUs (a pause, a resume, a snapshot); call the result when it
// ends. The heartbeat discards probes that overlap one.
func (s *sbx) stopVM() func() {
	s.vmStops.Add(1)
	s.vmEpoch.Add(1)
	return func() {
		s.vmEpoch.Add(1)
		s.vmStops.Add(-1)
	}
}

// vmRuns reports whether the VM runs by the worker's doing: its record
// says running, nothing pauses or snapshots it, and no fence holds it.
func (w *Worker) vmRuns(s *sbx) bool {
	s.mu.Lock()
	state := s.rec.State
	s.mu.Unlock()
	return state == sandbox.Running && s.vmStops.Load() == 0 && !s.fencedNow.Load() && w.serving()
}

// heartbeat probes the agent of s's VM vm until vm exits, s has another
// VM, or the worker closes.
func (w *Worker) heartbeat(s *sbx, vm vmm.VM) {
	if w.cfg.AgentHeartbeat < 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.watchers.Add(2)
	go func() {
		defer w.watchers.Done()
		defer cancel()
		select {
		case <-vm.Done():
		case <-w.stop:
		case <-ctx.Done():
		}
	}()
	go func() {
		defer w.watchers.Done()
		defer cancel()
		t := time.NewTimer(w.cfg.AgentHeartbeat)
		defer t.Stop()
		var hb silence
		hb.reset(s)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !w.beat(ctx, s, vm, &hb) {
				return
			}
			t.Reset(w.cfg.AgentHeartbeat)
		}
	}()
}

// silence is what a heartbeat knows of its agent's silence: since when
// it has not answered while the VM ran throughout, as vmEpoch was then.
type silence struct {
	since time.Time
	epoch uint64
}

// reset starts the silence window anew: after an answer, or when the VM
// did not run (or the worker did not).
func (hb *silence) reset(s *sbx) {
	hb.since, hb.epoch = time.Now(), s.vmEpoch.Load()
}

// beat probes the agent once and records the outcome. It reports false
// when s no longer runs vm.
func (w *Worker) beat(ctx context.Context, s *sbx, vm vmm.VM, hb *silence) bool {
	s.mu.Lock()
	current, a, id := s.vm, s.agent, s.rec.ID
	s.mu.Unlock()
	if current != vm {
		return false
	}
	if !w.vmRuns(s) {
		hb.reset(s)
		return true
	}
	timeout := w.cfg.AgentTimeout
	pctx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	h, err := w.probe(pctx, s, vm, a)
	took := time.Since(start)
	cancel()
	switch {
	case ctx.Err() != nil:
		return false
	case err == nil:
		if a != nil { // a health call, not a new connection
			w.metrics.agentRTT.Observe(took.Seconds())
		}
		hb.reset(s)
		w.agentAnswered(s, id)
		if h != nil {
			// An agent without /proc (or one that predates usage)
			// gives none: the sample keeps the host's figures only.
			s.mu.Lock()
			pss := s.pss
			s.mu.Unlock()
			s.usage.Add(time.Now(), h.Usage, pss)
		}
		return true
	case s.vmEpoch.Load() != hb.epoch || !w.vmRuns(s) || took > timeout+w.cfg.AgentHeartbeat:
		// The VM or the worker did not run throughout: no miss.
		hb.reset(s)
		return true
	}
	// A probe that ended at its deadline is a timeout of silence; one
	// that failed at once (the session ended, a handshake refused) is
	// one only once failures have lasted that long.
	silent := time.Since(hb.since)
	if errors.Is(err, context.DeadlineExceeded) {
		silent = max(silent, timeout)
	}
	if silent < timeout {
		return true
	}
	w.agentSilent(s, id, a, timeout)
	return true
}

// probe asks the agent for its health, on the current connection a or, if
// there is none (or it ended), on a new one that it installs. It returns
// the agent's answer, or nil after a new connection (which asked
// nothing): the heartbeat is the usage sampler too, so sampling costs no
// call of its own.
func (w *Worker) probe(ctx context.Context, s *sbx, vm vmm.VM, a *client.Client) (*proto.Health, error) {
	old := a
	if a != nil {
		select {
		case <-a.Done():
			a = nil
		default:
		}
	}
	if a != nil {
		h, err := a.Health(ctx)
		if err != nil {
			return nil, err
		}
		return &h, nil
	}
	c, err := guestvm.Connect(ctx, vm)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.vm != vm || (s.agent != nil && s.agent != old) {
		s.mu.Unlock()
		c.Close() // deleted meanwhile, or a request connected first
		return nil, nil
	}
	s.agent = c
	s.mu.Unlock()
	return nil, nil
}

// agentAnswered records an answer of s's agent.
func (w *Worker) agentAnswered(s *sbx, id string) {
	s.mu.Lock()
	was := s.agentDown
	s.agentDown = nil
	s.mu.Unlock()
	if was != nil {
		w.log.Info("sandbox agent answers again", "sandbox_id", id)
	}
}

// agentSilent declares s's agent unresponsive: its client a (or nil)
// closes with the cause, and calls fail with it until it answers again.
func (w *Worker) agentSilent(s *sbx, id string, a *client.Client, silent time.Duration) {
	cause := &client.UnresponsiveError{Silent: silent}
	s.mu.Lock()
	was := s.agentDown
	s.agentDown = cause
	if s.agent == a {
		s.agent = nil
	}
	s.mu.Unlock()
	if a != nil {
		a.CloseWithCause(cause)
	}
	if was == nil {
		w.log.Warn("sandbox agent unresponsive", "sandbox_id", id, "silent_for", silent)
	}
}

// agentStateLocked is Info.Agent: "" unless the VM runs.
//
// +checklocks:s.mu
func (s *sbx) agentStateLocked() string {
	switch {
	case s.rec.State != sandbox.Running:
		return ""
	case s.agentDown != nil:
		return workerproto.AgentUnresponsive
	}
	return workerproto.AgentOK
}

// errAgentDown is the error of a data-plane call on a sandbox whose agent
// was declared unresponsive.
func errAgentDown(id string, cause error) error {
	return fmt.Errorf("sandbox %s: %w", id, cause)
}
