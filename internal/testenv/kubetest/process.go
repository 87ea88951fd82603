package kubetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"space/internal/proc"
)

// component is one running cluster process, started by this run. Its pid
// file (<StateDir>/pids/<name>.pid: "pid starttime") lets a later run stop
// it if this one is killed before its cleanup.
type component struct {
	name    string
	log     string // its stdout and stderr
	pidFile string
	cmd     *exec.Cmd
	done    chan struct{} // closed once cmd is waited for
	// err is cmd.Wait's result, readable after done is closed.
	err error
}

// startComponent starts bin with args, logging to <logs>/<name>.log.
func startComponent(p paths, name, bin string, args ...string) (*component, error) {
	logPath := filepath.Join(p.logs(), name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Dir = p.root
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a ^C to the test reaches the test alone
	// and cleanup stops the components in order; killed with the test
	// process if it dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &component{name: name, log: logPath, pidFile: filepath.Join(p.pids(), name+".pid"), cmd: cmd, done: make(chan struct{})}
	go func() { // owned by c: stop waits for done
		c.err = cmd.Wait()
		close(c.done)
	}()
	start, err := proc.StartTime(cmd.Process.Pid)
	if err == nil {
		err = os.WriteFile(c.pidFile, fmt.Appendf(nil, "%d %d\n", cmd.Process.Pid, start), 0o644)
	}
	if err != nil {
		c.stop(0)
		return nil, fmt.Errorf("start %s: pid file: %w", name, err)
	}
	return c, nil
}

// exited reports whether the process has ended, and how.
func (c *component) exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs, and removes the
// pid file.
func (c *component) stop(grace time.Duration) {
	if grace > 0 {
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(grace):
		}
	}
	c.cmd.Process.Kill()
	<-c.done
	os.Remove(c.pidFile)
}

// killPidFiles kills the processes the pid files under dir name (a
// killed run's components) and removes the files. A pid that now names
// another process (its start time differs) is left alone.
func killPidFiles(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var pid int
		var start uint64
		if _, err := fmt.Sscan(string(b), &pid, &start); err == nil {
			errs = append(errs, killProcess(pid, start))
		}
		errs = append(errs, os.Remove(p))
	}
	return errors.Join(errs...)
}

// killProcess SIGKILLs the process pid that started at start and waits
// for it to go.
func killProcess(pid int, start uint64) error {
	h, err := proc.Open(pid, start)
	if errors.Is(err, proc.ErrGone) {
		return nil
	}
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, proc.ErrGone) {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Wait(ctx); err != nil {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	return nil
}

// killByCmdline SIGKILLs every process whose command line mentions dir:
// the containerd shims (their -address is under StateDir), which leave
// containerd's process group and outlive it.
func killByCmdline(dir string) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	self := os.Getpid()
	var errs []error
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(b), dir+"/") {
			continue
		}
		start, err := proc.StartTime(pid)
		if err != nil {
			continue
		}
		errs = append(errs, killProcess(pid, start))
	}
	return errors.Join(errs...)
}
