package worker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The fence watchdog. A worker's guests are separate processes: when the
// worker itself stops (SIGSTOP, a hung process, a crash) its fence loop
// cannot pause them as its lease runs out. So a standalone worker that
// fences (Config.FenceWatchdog) runs a small child process, this same
// binary re-executed with watchdogEnv set, and tells it over a pipe,
// twice a second, when its lease ends and which VMM processes serve
// sandboxes. If those messages stop (the worker is stopped or gone) and
// the lease's end passes, the watchdog stops the VMM processes with
// SIGSTOP; when messages come again, it continues them (SIGCONT), and the
// worker's own fence takes over (its pause, or the removals of a newer
// epoch). A worker that goes away for good leaves the watchdog to stop
// the guests at the lease's end, after which it exits; the worker's next
// start kills a watchdog an earlier life left and continues the guests it
// re-adopts.

const (
	// watchdogEnv makes a process the watchdog (see init).
	watchdogEnv = "SPACE_WORKER_FENCE_WATCHDOG"
	// watchdogDirEnv names the data dir of the worker it guards, so a
	// later life of that worker finds it.
	watchdogDirEnv = "SPACE_WORKER_FENCE_DIR"
	// watchdogPIDFile, in the data dir, holds the running watchdog's pid.
	watchdogPIDFile = "fence-watchdog.pid"
	// watchdogEvery is how often the worker writes to the watchdog;
	// watchdogStalled is how long the watchdog waits for a message
	// before it takes the worker for stopped.
	watchdogEvery   = 500 * time.Millisecond
	watchdogStalled = 2 * time.Second
)

// init turns the process into the watchdog when it was started as one
// (the worker re-executes its own binary, which links this package);
// the pipe from the worker is fd 3.
func init() {
	if os.Getenv(watchdogEnv) == "1" {
		os.Exit(runWatchdog(os.NewFile(3, "lease"), os.Stderr))
	}
}

// monotonic returns the system's monotonic clock (CLOCK_MONOTONIC), the
// same in every process.
func monotonic() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // the kernel always has it
	}
	return time.Duration(ts.Nano())
}

// watchdogState is what the watchdog knows: the lease's end on the
// monotonic clock, the guests' VMM processes, the last message's arrival.
type watchdogState struct {
	mu sync.Mutex
	// +checklocks:mu
	deadline time.Duration
	// +checklocks:mu
	pids []int
	// +checklocks:mu
	heard time.Duration
	// +checklocks:mu
	eof bool
}

// runWatchdog is the watchdog's main: it reads messages "DEADLINE PID..."
// (DEADLINE in monotonic nanoseconds) from in, and stops the PIDs once
// the messages stall and DEADLINE has passed. It returns the exit code.
func runWatchdog(in io.Reader, log io.Writer) int {
	// Nothing is known yet: a message comes at once.
	start := monotonic()
	st := &watchdogState{heard: start, deadline: start + time.Hour}
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 {
				continue
			}
			d, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				continue
			}
			var pids []int
			for _, p := range f[1:] {
				if pid, err := strconv.Atoi(p); err == nil && pid > 1 {
					pids = append(pids, pid)
				}
			}
			st.mu.Lock()
			st.deadline, st.pids, st.heard = time.Duration(d), pids, monotonic()
			st.mu.Unlock()
		}
		st.mu.Lock()
		st.eof = true
		st.mu.Unlock()
	}()
	stopped := map[int]bool{}
	for {
		time.Sleep(100 * time.Millisecond)
		now := monotonic()
		st.mu.Lock()
		deadline, pids, heard, eof := st.deadline, st.pids, st.heard, st.eof
		st.mu.Unlock()
		stalled := eof || now-heard > watchdogStalled
		switch {
		case stalled && now >= deadline:
			for _, pid := range pids {
				if !stopped[pid] && syscall.Kill(pid, syscall.SIGSTOP) == nil {
					stopped[pid] = true
					fmt.Fprintf(log, "fence watchdog: the worker is silent and its lease ran out: stopped guest process %d\n", pid)
				}
			}
			if eof {
				return 0 // the worker is gone; its next life continues them
			}
		case !stalled && len(stopped) > 0:
			for pid := range stopped {
				syscall.Kill(pid, syscall.SIGCONT)
				fmt.Fprintf(log, "fence watchdog: the worker speaks again: continued guest process %d\n", pid)
			}
			clear(stopped)
		case eof && len(pids) == 0:
			return 0
		}
	}
}

// watchdog is the worker's end of its watchdog.
type watchdog struct {
	cmd  *exec.Cmd
	pipe *os.File
}

// startWatchdog starts the watchdog of this worker and records its pid.
func (w *Worker) startWatchdog() (*watchdog, error) {
	r, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	self, err := os.Executable()
	if err != nil {
		wr.Close()
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = []string{watchdogEnv + "=1", watchdogDirEnv + "=" + w.cfg.DataDir}
	cmd.ExtraFiles = []*os.File{r}
	cmd.Stderr = os.Stderr
	// Its own process group: a signal to the worker's group leaves it be.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		wr.Close()
		return nil, fmt.Errorf("start the fence watchdog: %w", err)
	}
	go cmd.Wait() // reaped if it exits while the worker runs
	if err := writeFileSynced(filepath.Join(w.cfg.DataDir, watchdogPIDFile), []byte(strconv.Itoa(cmd.Process.Pid))); err != nil {
		w.log.Warn("record the fence watchdog's pid", "err", err)
	}
	w.log.Info("fence watchdog started", "pid", cmd.Process.Pid)
	return &watchdog{cmd: cmd, pipe: wr}, nil
}

// writeFileSynced writes b to path through a synced temporary file.
func writeFileSynced(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// killEarlierWatchdog kills the watchdog an earlier life of this worker
// left (its pid file names it, and its environment names this data dir)
// and reports whether there was one: the guests it may have stopped are
// then continued by the caller.
func (w *Worker) killEarlierWatchdog() bool {
	path := filepath.Join(w.cfg.DataDir, watchdogPIDFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	defer os.Remove(path)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return true
	}
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil || !bytes.Contains(env, []byte(watchdogEnv+"=1\x00")) || !bytes.Contains(env, []byte(watchdogDirEnv+"="+w.cfg.DataDir+"\x00")) {
		return true // gone, or the pid is another process's now
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for range 50 {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "environ")); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.log.Info("killed the fence watchdog of an earlier life", "pid", pid)
	return true
}

// continueGuest continues a VMM process an earlier life's watchdog may
// have stopped, if it is stopped.
func continueGuest(pid int) {
	if pid <= 1 {
		return
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return
	}
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+3 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// watchdogLoop feeds the watchdog until the worker closes: while the
// worker fences, it starts the watchdog (again, if it died) and tells it
// the lease's end and the guests' VMM processes every watchdogEvery. On
// Close the pipe is closed, not the watchdog: it goes on fencing the
// guests the worker leaves running.
func (w *Worker) watchdogLoop() {
	defer w.watchers.Done()
	var wd *watchdog
	defer func() {
		if wd != nil {
			wd.pipe.Close()
		}
	}()
	t := time.NewTicker(watchdogEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.mu.Lock()
		fencing, until := w.fencing, w.leaseUntil
		w.mu.Unlock()
		if !fencing {
			continue
		}
		if wd == nil {
			var err error
			if wd, err = w.startWatchdog(); err != nil {
				w.log.Error("fence watchdog", "err", err)
				continue
			}
		}
		deadline := monotonic() + time.Until(until)
		if until.IsZero() {
			deadline = 0 // no lease: stop them as soon as the worker is silent
		}
		line := strconv.FormatInt(int64(deadline), 10)
		for _, s := range w.fenceable() {
			s.mu.Lock()
			if s.rec.VM != nil && s.rec.VM.PID > 1 {
				line += " " + strconv.Itoa(s.rec.VM.PID)
			}
			s.mu.Unlock()
		}
		if _, err := io.WriteString(wd.pipe, line+"\n"); err != nil {
			w.log.Warn("fence watchdog gone: starting another", "err", err)
			wd.pipe.Close()
			wd = nil
		}
	}
}
