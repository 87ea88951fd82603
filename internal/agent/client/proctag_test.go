package client_test

import (
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
)

// TestProcTagOldAgent: an agent that predates process tags starts the
// process and drops the tag (an unknown field to it). The client must not
// leave that untagged process running, since nobody could find it by its
// tag: it kills it and says the agent is too old.
func TestProcTagOldAgent(t *testing.T) {
	var mu sync.Mutex
	var killed []proto.ProcSignal
	c := agenttest.Scripted(t, func(st net.Conn, req proto.Request) {
		switch req.Op {
		case proto.OpProcStart:
			var ps proto.ProcStart
			if err := json.Unmarshal(req.Args, &ps); err != nil || ps.Tag == "" {
				t.Errorf("proc.start args %s: %v; want a tag", req.Args, err)
			}
			proto.WriteJSON(st, proto.TypeResult, proto.ProcInfo{ID: 7, PID: 1234})
		case proto.OpProcSignal:
			var sig proto.ProcSignal
			json.Unmarshal(req.Args, &sig)
			mu.Lock()
			killed = append(killed, sig)
			mu.Unlock()
			proto.WriteJSON(st, proto.TypeResult, proto.Empty{})
		default:
			t.Errorf("unexpected op %s", req.Op)
		}
	})
	for _, start := range []struct {
		name string
		run  func(proto.ProcStart) error
	}{
		{"StartProcess", func(ps proto.ProcStart) error { _, err := c.StartProcess(t.Context(), ps); return err }},
		{"StartAttached", func(ps proto.ProcStart) error {
			p, _, err := c.StartAttached(t.Context(), ps, client.IO{})
			if p != nil {
				t.Errorf("StartAttached on an old agent returned a process")
			}
			return err
		}},
	} {
		mu.Lock()
		killed = nil
		mu.Unlock()
		err := start.run(proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"sleep", "60"}}, Tag: "build"})
		if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "predates process tags") {
			t.Errorf("%s with a tag on an old agent = %v, want FailedPrecondition saying the agent predates tags", start.name, err)
		}
		mu.Lock()
		if len(killed) != 1 || killed[0].ID != 7 || killed[0].Signal != 9 {
			t.Errorf("%s: signals sent = %+v, want SIGKILL to process 7", start.name, killed)
		}
		mu.Unlock()
	}
}
