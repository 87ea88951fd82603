package guestvm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

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
	c := dial(t, func(ctx context.Context, conn *os.File) {
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
	c := dial(t, func(ctx context.Context, conn *os.File) {
		oldAgent(conn, func(req proto.Request) error {
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

// dial connects a client to serve, run on the other end of a
// socketpair as a guest's agent would be.
func dial(t *testing.T, serve func(ctx context.Context, conn *os.File)) *client.Client {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("setup: socketpair: %v", err)
	}
	unix.SetNonblock(fds[0], true)
	unix.SetNonblock(fds[1], true)
	guest, host := os.NewFile(uintptr(fds[0]), "guest"), os.NewFile(uintptr(fds[1]), "host")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer guest.Close()
		serve(ctx, guest)
	}()
	dctx, dcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer dcancel()
	c, err := client.Dial(dctx, host)
	if err != nil {
		cancel()
		guest.Close()
		<-done
		t.Fatalf("setup: dial: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-done
	})
	return c
}

// oldAgent speaks the handshake and answers every post_restore with
// answer's error or an empty result.
func oldAgent(conn *os.File, answer func(proto.Request) error) {
	br := bufio.NewReader(conn)
	hello, err := proto.ReadHello(br, 0)
	if err != nil {
		return
	}
	if _, err := conn.Write(proto.Ready{Version: proto.Version, Nonce: hello.Nonce, AgentVersion: "old"}.Line()); err != nil {
		return
	}
	if next, err := proto.ReadStart(br, hello); err != nil || next != nil {
		return
	}
	sess, err := yamux.Server(proto.Buffered(br, conn), proto.YamuxConfig())
	if err != nil {
		return
	}
	defer sess.Close()
	for {
		st, err := sess.Accept()
		if err != nil {
			return
		}
		var req proto.Request
		if f, err := proto.NewReader(st, 0).Next(); err == nil && proto.DecodeJSON(f, 0, &req) == nil {
			if req.Op != proto.OpPostRestore {
				err = errkind.InvalidArgument
			} else {
				err = answer(req)
			}
			if err != nil {
				proto.WriteJSON(st, proto.TypeError, proto.ErrorFrom(err))
			} else {
				proto.WriteJSON(st, proto.TypeResult, proto.Empty{})
			}
		}
		st.Close()
	}
}
