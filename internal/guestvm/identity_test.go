package guestvm_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"regexp"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/agent/server"
	"space/internal/errkind"
	"space/internal/guestvm"
)

// TestPostRestoreGivesFreshIdentity: every post-restore sends a machine-id
// and a boot_id of the kernel's forms, new each time, and the agent
// applies them.
func TestPostRestoreGivesFreshIdentity(t *testing.T) {
	sys := agenttest.NewRecordingSystem("")
	c := agenttest.Serve(t, func(ctx context.Context, conn *os.File) {
		srv, err := server.New(server.Config{Version: "test", System: sys})
		if err != nil {
			return
		}
		srv.ServeConn(ctx, conn)
	})
	first, err := guestvm.PostRestore(t.Context(), c, "clone-1")
	if err != nil {
		t.Fatalf("PostRestore = %v", err)
	}
	second, err := guestvm.PostRestore(t.Context(), c, "clone-2")
	if err != nil {
		t.Fatalf("PostRestore = %v", err)
	}
	machineID := regexp.MustCompile(`^[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$`)
	bootID := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for _, id := range []guestvm.Identity{first, second} {
		if !machineID.MatchString(id.MachineID) || !bootID.MatchString(id.BootID) {
			t.Errorf("PostRestore() = %+v, want a version 4 machine-id and boot_id", id)
		}
	}
	if first.MachineID == second.MachineID || first.BootID == second.BootID {
		t.Errorf("two post-restores gave %+v and %+v, want different ids", first, second)
	}
	want := []string{"clock", "entropy", "hostname clone-1", "machine-id " + first.MachineID, "boot-id " + first.BootID,
		"clock", "entropy", "hostname clone-2", "machine-id " + second.MachineID, "boot-id " + second.BootID}
	if diff := cmp.Diff(want, sys.Calls()); diff != "" {
		t.Errorf("system calls (-want +got):\n%s", diff)
	}
}

// oldPostRestore is proto.PostRestore as agents from before machine and
// boot ids decode it.
type oldPostRestore struct {
	UnixNanos int64           `json:"unix_nanos"`
	Entropy   []byte          `json:"entropy"`
	Hostname  string          `json:"hostname,omitempty"`
	Network   json.RawMessage `json:"network,omitempty"`
}

// TestPostRestoreOldAgent: an agent in an older snapshot refuses the new
// fields; the host then fixes up the rest (clock, entropy, hostname) and
// reports that the guest kept its snapshot's ids.
func TestPostRestoreOldAgent(t *testing.T) {
	var mu sync.Mutex
	var accepted []oldPostRestore
	refused := 0
	c := oldAgent(t, func(req proto.Request) error {
		var a oldPostRestore
		err := proto.DecodeJSON(proto.Frame{Type: proto.TypeRequest, Payload: req.Args}, 0, &a)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			refused++
			return err
		}
		accepted = append(accepted, a)
		return nil
	})
	id, err := guestvm.PostRestore(t.Context(), c, "clone-1")
	if err != nil || id != (guestvm.Identity{}) {
		t.Errorf("PostRestore(old agent) = %+v, %v, want a zero Identity and no error", id, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if refused != 1 || len(accepted) != 1 || accepted[0].Hostname != "clone-1" || len(accepted[0].Entropy) < 32 || accepted[0].UnixNanos == 0 {
		t.Errorf("old agent refused %d and accepted %+v, want one refusal, then the clock, entropy and hostname", refused, accepted)
	}
}

// oldAgent answers every post_restore with answer's error or an empty
// result, and every other call as unknown.
func oldAgent(t *testing.T, answer func(proto.Request) error) *client.Client {
	return agenttest.Scripted(t, func(st net.Conn, req proto.Request) {
		var err error = errkind.InvalidArgument
		if req.Op == proto.OpPostRestore {
			err = answer(req)
		}
		if err != nil {
			proto.WriteJSON(st, proto.TypeError, proto.ErrorFrom(err))
		} else {
			proto.WriteJSON(st, proto.TypeResult, proto.Empty{})
		}
	})
}
