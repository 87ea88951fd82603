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

func TestCloseEndsWait(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	start, err := StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatalf("StartTime = %v", err)
	}
	h, err := Open(cmd.Process.Pid, start)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Wait(context.Background()) }()
	h.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close = %v, want ErrClosed", err)
	}
	if err := h.Signal(unix.SIGTERM); !errors.Is(err, ErrGone) {
		t.Errorf("Signal after Close = %v, want ErrGone", err)
	}
}

func TestParseStat(t *testing.T) {
	// A real stat line whose command name holds ") (".
	line := "4242 (fire) (cracker) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 50 0 0 20 0 9 0 123456 1000000 200 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0"
	got, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatalf("ParseStat: %v", err)
	}
	if want := (Stat{State: 'S', CPU: 2 * time.Second, StartTime: 123456}); got != want {
		t.Errorf("ParseStat = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "4242 fire S 1", "4242 (fire) S 1 2 3"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) succeeded", bad)
		}
	}
}
