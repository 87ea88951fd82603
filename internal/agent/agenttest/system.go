package agenttest

import (
	"context"
	"sync"
	"time"

	"space/internal/agent/proto"
	"space/internal/agent/server"
)

var (
	_ server.System     = (*RecordingSystem)(nil)
	_ server.Identifier = (*RecordingSystem)(nil)
)

// RecordingSystem is a server.System and server.Identifier for agents
// run in a test process: it records what the agent asks of it, in order,
// and changes nothing but the boot_id it reports.
type RecordingSystem struct {
	mu sync.Mutex
	// +checklocks:mu
	calls []string
	// +checklocks:mu
	bootID string
}

// NewRecordingSystem returns a RecordingSystem whose boot_id starts as
// bootID.
func NewRecordingSystem(bootID string) *RecordingSystem {
	return &RecordingSystem{bootID: bootID}
}

func (s *RecordingSystem) record(call string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
	return nil
}

// Calls are the requests so far: "clock", "entropy", "hostname <name>",
// "network", "poweroff", "machine-id <id>", "boot-id <id>".
func (s *RecordingSystem) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func (s *RecordingSystem) SetClock(time.Time) error      { return s.record("clock") }
func (s *RecordingSystem) AddEntropy([]byte) error       { return s.record("entropy") }
func (s *RecordingSystem) SetHostname(name string) error { return s.record("hostname " + name) }
func (s *RecordingSystem) PowerOff(bool) error           { return s.record("poweroff") }
func (s *RecordingSystem) SetMachineID(id string) error  { return s.record("machine-id " + id) }

func (s *RecordingSystem) ConfigureNetwork(context.Context, proto.NetConfig) error {
	return s.record("network")
}

func (s *RecordingSystem) SetBootID(id string) error {
	s.mu.Lock()
	s.bootID = id
	s.mu.Unlock()
	return s.record("boot-id " + id)
}

func (s *RecordingSystem) BootID() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootID, nil
}
