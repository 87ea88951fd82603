package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestOpenSignalWait(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer cmd.Process.Kill()
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatalf("StartTime = %v", err)
	}
	if _, err := Open(cmd.Process.Pid, start+1); !errors.Is(err, ErrGone) {
		t.Errorf("Open(wrong start time) = %v, want ErrGone", err)
	}
	h, err := Open(cmd.Process.Pid, start)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := h.Wait(ctx); err == nil {
		t.Fatalf("Wait on a running process returned nil")
	}
	if err := h.Signal(unix.SIGKILL); err != nil {
		t.Fatalf("Signal = %v", err)
	}
	go cmd.Wait() // reap, as the parent would
	if err := h.Wait(t.Context()); err != nil {
		t.Errorf("Wait after kill = %v", err)
	}
	if _, err := StartTime(999999999); !errors.Is(err, ErrGone) {
		t.Errorf("StartTime(no such pid) = %v, want ErrGone", err)
	}
	if _, err := StartTime(os.Getpid()); err != nil {
		t.Errorf("StartTime(self) = %v", err)
	}
}
