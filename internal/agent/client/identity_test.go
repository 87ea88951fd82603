package client_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/agenttest"
	"space/internal/agent/proto"
	"space/internal/agent/server"
	"space/internal/errkind"
)

// withoutIdentity hides RecordingSystem's Identifier methods: a System
// that cannot set a machine's identity.
type withoutIdentity struct{ sys *agenttest.RecordingSystem }

func (w withoutIdentity) SetClock(t time.Time) error { return w.sys.SetClock(t) }
func (w withoutIdentity) AddEntropy(b []byte) error  { return w.sys.AddEntropy(b) }
func (w withoutIdentity) SetHostname(n string) error { return w.sys.SetHostname(n) }
func (w withoutIdentity) PowerOff(reboot bool) error { return w.sys.PowerOff(reboot) }
func (w withoutIdentity) ConfigureNetwork(ctx context.Context, c proto.NetConfig) error {
	return w.sys.ConfigureNetwork(ctx, c)
}

const (
	goodMachineID = "0123456789abcdef0123456789abcdef"
	goodBootID    = "01234567-89ab-4def-8123-456789abcdef"
)

func postRestore(machineID, bootID string) proto.PostRestore {
	return proto.PostRestore{UnixNanos: time.Now().UnixNano(), Entropy: bytes.Repeat([]byte{1}, 32),
		Hostname: "clone-1", MachineID: machineID, BootID: bootID}
}

// TestPostRestoreIdentity: a post-restore sets the machine-id and the
// boot_id, and the agent's health reports the boot_id its processes read
// from then on, not the one it started with.
func TestPostRestoreIdentity(t *testing.T) {
	sys := agenttest.NewRecordingSystem("11111111-1111-4111-8111-111111111111")
	_, c := inProcessWith(t, server.Config{Version: "test", System: sys})
	if h, err := c.Health(t.Context()); err != nil || h.BootID != "11111111-1111-4111-8111-111111111111" {
		t.Fatalf("Health() before = %+v, %v, want the system's boot_id", h, err)
	}
	if err := c.PostRestore(t.Context(), postRestore(goodMachineID, goodBootID)); err != nil {
		t.Fatalf("PostRestore = %v", err)
	}
	want := []string{"clock", "entropy", "hostname clone-1", "machine-id " + goodMachineID, "boot-id " + goodBootID}
	if diff := cmp.Diff(want, sys.Calls()); diff != "" {
		t.Errorf("system calls (-want +got):\n%s", diff)
	}
	h, err := c.Health(t.Context())
	if err != nil || h.BootID != goodBootID {
		t.Errorf("Health() after = %+v, %v, want boot_id %s", h, err, goodBootID)
	}
	// Both are optional: a post-restore without them leaves them.
	if err := c.PostRestore(t.Context(), postRestore("", "")); err != nil {
		t.Fatalf("PostRestore(no ids) = %v", err)
	}
	if got := sys.Calls()[len(want):]; !cmp.Equal(got, []string{"clock", "entropy", "hostname clone-1"}) {
		t.Errorf("system calls of a post-restore without ids = %q, want clock, entropy and hostname only", got)
	}
}

// TestPostRestoreBadIdentity: a malformed machine-id or boot_id (what a
// confused or hostile host might send, or something meant to be written
// somewhere else) is refused with InvalidArgument before anything in the
// guest changes, the clock and the RNG included.
func TestPostRestoreBadIdentity(t *testing.T) {
	for _, tc := range []struct {
		name              string
		machineID, bootID string
	}{
		{"machine-id too short", goodMachineID[1:], goodBootID},
		{"machine-id too long", goodMachineID + "0", goodBootID},
		{"machine-id uppercase", "0123456789ABCDEF0123456789ABCDEF", goodBootID},
		{"machine-id not hex", "g123456789abcdef0123456789abcdef", goodBootID},
		{"machine-id all zero", "00000000000000000000000000000000", goodBootID},
		{"machine-id with newline", goodMachineID[:31] + "\n", goodBootID},
		{"machine-id a path", "../../../../../../../etc/shadow0", goodBootID},
		{"machine-id a UUID", goodBootID, goodBootID},
		{"boot-id without dashes", goodMachineID, goodMachineID},
		{"boot-id uppercase", goodMachineID, "01234567-89AB-4DEF-8123-456789ABCDEF"},
		{"boot-id dashes moved", goodMachineID, "0123456-789ab-4def-8123-456789abcdef"},
		{"boot-id not hex", goodMachineID, "01234567-89ab-4def-8123-456789abcdeg"},
		{"boot-id too long", goodMachineID, goodBootID + "0"},
		{"boot-id with newline", goodMachineID, goodBootID[:35] + "\n"},
		{"boot-id with a second line", goodMachineID, goodBootID + "\n" + goodBootID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := agenttest.NewRecordingSystem("")
			_, c := inProcessWith(t, server.Config{Version: "test", System: sys})
			err := c.PostRestore(t.Context(), postRestore(tc.machineID, tc.bootID))
			if !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("PostRestore(%q, %q) = %v, want InvalidArgument", tc.machineID, tc.bootID, err)
			}
			if got := sys.Calls(); len(got) != 0 {
				t.Errorf("after a refused post-restore the system saw %q, want nothing", got)
			}
		})
	}
}

// TestPostRestoreIdentityUnsupported: a System that cannot set a
// machine's identity refuses ids with FailedPrecondition, and changes
// nothing.
func TestPostRestoreIdentityUnsupported(t *testing.T) {
	sys := agenttest.NewRecordingSystem("")
	_, c := inProcessWith(t, server.Config{Version: "test", System: withoutIdentity{sys}})
	err := c.PostRestore(t.Context(), postRestore(goodMachineID, goodBootID))
	if !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("PostRestore(ids) = %v, want FailedPrecondition", err)
	}
	if got := sys.Calls(); len(got) != 0 {
		t.Errorf("after a refused post-restore the system saw %q, want nothing", got)
	}
}
