package sqlite_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/internal/store"
	"space/internal/store/sqlite"
)

// crashChildEnv makes the test binary act as the writer TestCrashDurability kills.
const crashChildEnv = "SPACE_STORE_SQLITE_CRASH_CHILD"

// TestCrashDurability writes in a child process, SIGKILLs it right after the
// write returns, and expects the write to be there on reopen.
func TestCrashDurability(t *testing.T) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(t, path)
		return
	}
	path := filepath.Join(t.TempDir(), "state.db")
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrashDurability$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("setup: start child: %v", err)
	}
	var id string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "committed "); ok {
			id = rest
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	werr := cmd.Wait()
	if id == "" {
		t.Fatalf("child exited (%v) without reporting a commit", werr)
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child Wait() = %v, want killed by SIGKILL", werr)
	}

	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open() after crash = %v", err)
	}
	defer s.Close()
	sb, err := s.Sandbox(t.Context(), "t1", id)
	if err != nil {
		t.Fatalf("Sandbox(%s) after crash = %v", id, err)
	}
	if sb.State != store.StateRunning || sb.Version != 2 {
		t.Errorf("Sandbox(%s) after crash = state %s version %d, want running version 2", id, sb.State, sb.Version)
	}
}

// crashChild writes a team and a sandbox, reports the commit, and waits to
// be killed without closing the store.
func crashChild(t *testing.T, path string) {
	ctx := t.Context()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("child: open: %v", err)
	}
	if _, err := s.CreateTeam(ctx, store.Team{ID: "t1"}); err != nil {
		t.Fatalf("child: %v", err)
	}
	sb, err := s.CreateSandbox(ctx, store.Sandbox{ID: store.NewSandboxID(), TeamID: "t1", Template: "base",
		State: store.StateCreating, Spec: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	sb.State = store.StateRunning
	if _, err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatalf("child: %v", err)
	}
	fmt.Printf("committed %s\n", sb.ID)
	time.Sleep(time.Minute) // the parent kills us long before this ends
	t.Fatalf("child: not killed within a minute")
}
