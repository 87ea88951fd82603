package worker

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"space/internal/testenv"
)

// procState returns the state letter of process pid in /proc ("" if it
// is gone).
func procState(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}

// TestFenceWatchdog runs the real watchdog (this test binary re-executed)
// over a `sleep` standing for a guest's VMM: while the worker writes, a
// lease that ran out changes nothing (the worker's own fence acts); once
// it falls silent past the lease, the watchdog stops the guest; when it
// writes again the guest continues; when it goes away (the pipe closes),
// the watchdog stops the guest at the lease's end and exits, and the
// worker's next life kills nothing it does not own, finds the pid file,
// and continues the guest.
func TestFenceWatchdog(t *testing.T) {
	guest := exec.Command("sleep", "600")
	if err := guest.Start(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { guest.Process.Kill(); guest.Wait() })
	pid := guest.Process.Pid
	w := &Worker{cfg: Config{DataDir: t.TempDir()}, log: slog.New(slog.DiscardHandler)}
	if l := testLog(); l != nil {
		w.log = l
	}
	wd, err := w.startWatchdog()
	if err != nil {
		t.Fatalf("startWatchdog = %v", err)
	}
	t.Cleanup(func() { wd.cmd.Process.Kill() })
	say := func(deadline time.Duration) {
		t.Helper()
		if _, err := fmt.Fprintf(wd.pipe, "%d %d\n", int64(deadline), pid); err != nil {
			t.Fatalf("write to the watchdog: %v", err)
		}
	}
	// Speaking, with the lease over: the watchdog leaves the guest be.
	for range 6 {
		say(monotonic() - time.Second)
		time.Sleep(watchdogEvery)
	}
	if st := procState(pid); st == "T" {
		t.Fatalf("the watchdog stopped the guest of a worker that speaks")
	}
	// Silent past the lease: stopped.
	testenv.Eventually(t, 10*time.Second, func() bool { return procState(pid) == "T" })
	// Speaking again: continued.
	say(monotonic() + time.Minute)
	testenv.Eventually(t, 5*time.Second, func() bool { return procState(pid) != "T" })
	// Gone, the lease ending in a second: stopped then, and the watchdog exits.
	say(monotonic() + time.Second)
	wd.pipe.Close()
	testenv.Eventually(t, 10*time.Second, func() bool { return procState(pid) == "T" })
	testenv.Eventually(t, 10*time.Second, func() bool {
		return wd.cmd.ProcessState != nil || procState(wd.cmd.Process.Pid) == "" || procState(wd.cmd.Process.Pid) == "Z"
	})
	// The next life: there was a watchdog (its pid file), so the guest is
	// continued.
	if !w.killEarlierWatchdog() {
		t.Fatalf("killEarlierWatchdog found no earlier watchdog")
	}
	continueGuest(pid)
	if st := procState(pid); st == "T" {
		t.Errorf("guest still stopped after continueGuest")
	}
	if _, err := os.Stat(filepath.Join(w.cfg.DataDir, watchdogPIDFile)); !os.IsNotExist(err) {
		t.Errorf("watchdog pid file after killEarlierWatchdog: %v", err)
	}
}
