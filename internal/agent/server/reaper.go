package server

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// reaper collects the exit status of child processes. As PID 1 it reaps
// every child (orphans re-parented to init included) and hands the statuses
// of processes the server started to their waiters; otherwise each started
// process gets a goroutine that waits for it alone.
type reaper struct {
	all bool

	mu sync.Mutex
	// +checklocks:mu
	waiters map[int]chan unix.WaitStatus
}

func newReaper(all bool) *reaper {
	return &reaper{all: all, waiters: map[int]chan unix.WaitStatus{}}
}

// start starts cmd and returns a channel that receives its exit status once.
// The lock is held across Start so that the reaper cannot collect the child
// before its waiter is registered.
func (r *reaper) start(cmd *exec.Cmd) (<-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	if !r.all {
		go r.waitOne(pid)
	}
	return ch, nil
}

func (r *reaper) waitOne(pid int) {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	r.deliver(pid, ws)
}

func (r *reaper) deliver(pid int, ws unix.WaitStatus) {
	r.mu.Lock()
	ch, ok := r.waiters[pid]
	delete(r.waiters, pid)
	r.mu.Unlock()
	if ok {
		ch <- ws
	}
}

// run reaps children until ctx ends, when the reaper reaps all.
func (r *reaper) run(ctx context.Context) {
	if !r.all {
		return
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	// A SIGCHLD can coalesce with others or arrive before Notify; the slow
	// tick is a backstop, not the mechanism.
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-tick.C:
		}
	}
}

func (r *reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		r.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		var ch chan unix.WaitStatus
		if pid > 0 {
			ch = r.waiters[pid]
			delete(r.waiters, pid)
		}
		r.mu.Unlock()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ch != nil {
			ch <- ws
		}
	}
}
