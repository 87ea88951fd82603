package cgroup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

const (
	// pollInterval is how often Kill looks whether the group is empty.
	pollInterval = 5 * time.Millisecond
	// freezeWait bounds how long Kill waits for a freeze to complete
	// before killing anyway.
	freezeWait = time.Second
)

// Group is one control group, made by [Hierarchy.Create] or found by
// [Hierarchy.Open]. It holds only the name: a Group stays valid across
// restarts of the caller, and after Remove its methods fail or find
// nothing.
type Group struct {
	h    *Hierarchy
	name string
}

// Name returns the group's name relative to the hierarchy's root.
func (g *Group) Name() string { return g.name }

// dirs returns the group's directory in every root.
func (g *Group) dirs() []string {
	d := make([]string, len(g.h.roots))
	for i, root := range g.h.roots {
		d[i] = filepath.Join(root, g.name)
	}
	return d
}

// unified returns the group's directory on v2.
func (g *Group) unified() string { return filepath.Join(g.h.v2, g.name) }

// dir returns the directory holding c's files: the one directory on v2,
// c's mount on v1 ("" when c is not mounted).
func (g *Group) dir(c Controller) string {
	if g.h.version == 2 {
		return g.unified()
	}
	root, ok := g.h.v1[c]
	if !ok {
		return ""
	}
	return filepath.Join(root, g.name)
}

// Place prepares cmd so that the process it starts runs in the group.
// The caller starts cmd, then calls release (whether the start succeeded
// or not), and after a successful start calls after with the new pid; if
// after fails the process runs nothing of its program and the caller
// should kill and reap it.
//
// On v2 the process is created inside the group (clone3 with
// CLONE_INTO_CGROUP, through SysProcAttr.UseCgroupFD and CgroupFD, which
// stay set until release closes the directory), so it never runs outside
// it; after does nothing.
//
// On v1 no such call exists: the process starts in the caller's groups
// and after moves it into every controller's group. So that it does
// nothing outside the group, cmd is rewritten to start a gate (this
// binary, see gate.go) that execs cmd's program only once after has moved
// it, and exits if the caller dies or gives up first. Place keeps cmd's
// ExtraFiles at their descriptor numbers and its SysProcAttr.
func (g *Group) Place(cmd *exec.Cmd) (after func(pid int) error, release func(), err error) {
	if cmd == nil {
		return nil, nil, fmt.Errorf("place in cgroup %s: nil command: %w", g.name, errkind.InvalidArgument)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if g.h.version == 1 {
		return g.gate(cmd)
	}
	attr := cmd.SysProcAttr
	dir := g.unified()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("place in cgroup %s: %w", g.name, &fs.PathError{Op: "open", Path: dir, Err: err})
	}
	attr.UseCgroupFD = true
	attr.CgroupFD = fd
	var once sync.Once
	return func(int) error { return nil }, func() { once.Do(func() { unix.Close(fd) }) }, nil
}

// Add moves the process pid (all its threads) into the group, in every
// controller's directory.
func (g *Group) Add(pid int) error {
	for _, dir := range g.dirs() {
		if err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("add pid %d to cgroup %s: %w", pid, g.name, err)
		}
	}
	return nil
}

// Procs returns the processes in the group itself (not its children),
// sorted: on v1 the union over the controllers. errkind.NotFound when the
// group does not exist.
func (g *Group) Procs() ([]int, error) {
	var pids []int
	found := false
	for _, dir := range g.dirs() {
		p, err := readProcs(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("procs of cgroup %s: %w", g.name, err)
		}
		found = true
		pids = append(pids, p...)
	}
	if !found {
		return nil, fmt.Errorf("cgroup %s does not exist: %w", g.name, errkind.NotFound)
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// readProcs reads dir's cgroup.procs.
func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, "cgroup.procs"), err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// subtreeProcs returns the processes in the group and its descendants, in
// every root, sorted; none when the group does not exist.
func (g *Group) subtreeProcs() ([]int, error) {
	var pids []int
	for _, dir := range g.dirs() {
		sub, err := subtree(dir)
		if err != nil {
			return nil, err
		}
		for _, d := range sub {
			p, err := readProcs(d)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			pids = append(pids, p...)
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}

// subtree returns dir and the group directories below it, children before
// their parents; none when dir does not exist.
func subtree(dir string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone meanwhile
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	return dirs, err
}

// populated reports whether a process runs in the group or below it.
func (g *Group) populated() (bool, error) {
	if g.h.version == 1 {
		pids, err := g.subtreeProcs()
		return len(pids) > 0, err
	}
	v, err := readKey(filepath.Join(g.unified(), "cgroup.events"), "populated")
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return v == 1, err
}

// Kill sends SIGKILL to every process in the group and its descendants and
// waits, until ctx ends, for the group to be empty. The processes' parents
// still have to reap them. On v2 Kill writes cgroup.kill (Linux 5.14),
// which the kernel applies to the whole subtree at once. Elsewhere it
// freezes the group if it can (v2 cgroup.freeze, v1 freezer), so nothing
// in it can fork, kills the processes it lists, thaws the group, and
// repeats until the group is empty. A group that does not exist is empty.
func (g *Group) Kill(ctx context.Context) error {
	if err := g.kill(ctx); err != nil {
		return fmt.Errorf("kill cgroup %s: %w", g.name, err)
	}
	return nil
}

func (g *Group) kill(ctx context.Context) (err error) {
	if g.h.version == 2 && !g.h.noKill {
		err := writeFile(filepath.Join(g.unified(), "cgroup.kill"), "1")
		if err == nil {
			return g.waitEmpty(ctx)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if !exists(g.unified()) {
			return nil
		}
		// No cgroup.kill before Linux 5.14.
	}
	frozen, err := g.freeze(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if frozen {
			err = errors.Join(err, g.thaw())
		}
	}()
	for {
		pids, err := g.subtreeProcs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if err := g.signal(pids); err != nil {
			return err
		}
		if frozen {
			// On v1 a frozen process dies only once thawed; on v2 either way.
			frozen = false
			if err := g.thaw(); err != nil {
				return err
			}
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return fmt.Errorf("wait for the processes to exit: %w", err)
		}
	}
}

// waitEmpty waits until no process is left in the group or below it.
func (g *Group) waitEmpty(ctx context.Context) error {
	for {
		busy, err := g.populated()
		if err != nil || !busy {
			return err
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return fmt.Errorf("wait for the processes to exit: %w", err)
		}
	}
}

// signal sends SIGKILL to those of pids that are still in the group. Each
// process is pinned by a pidfd before the group is listed again, so a pid
// that was reused after the first listing is not signalled.
func (g *Group) signal(pids []int) error {
	fds := make(map[int]int, len(pids))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		switch {
		case err == nil:
			fds[pid] = fd
		case errors.Is(err, unix.ESRCH):
		case errors.Is(err, unix.ENOSYS):
			// Before Linux 5.3: the pid was just listed and, with the
			// group frozen, cannot have exited.
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("kill pid %d: %w", pid, err)
			}
		default:
			return fmt.Errorf("pidfd_open %d: %w", pid, err)
		}
	}
	still, err := g.subtreeProcs()
	if err != nil {
		return err
	}
	for _, pid := range still {
		fd, ok := fds[pid]
		if !ok {
			continue // new since the first listing: the next round gets it
		}
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill pid %d: %w", pid, err)
		}
	}
	return nil
}

// freeze freezes the group if the hierarchy can and waits, up to
// freezeWait, for it to be frozen. frozen reports whether the caller must
// thaw it; a freeze that does not complete in time is left to the kill
// loop.
func (g *Group) freeze(ctx context.Context) (frozen bool, err error) {
	var file, value string
	var done func() (bool, error)
	switch {
	case g.h.version == 2:
		file, value = filepath.Join(g.unified(), "cgroup.freeze"), "1"
		done = func() (bool, error) {
			v, err := readKey(filepath.Join(g.unified(), "cgroup.events"), "frozen")
			return v == 1, err
		}
	case g.h.has(Freezer):
		file, value = filepath.Join(g.dir(Freezer), "freezer.state"), "FROZEN"
		done = func() (bool, error) {
			b, err := os.ReadFile(file)
			return strings.TrimSpace(string(b)) == "FROZEN", err
		}
	default:
		return false, nil
	}
	if err := writeFile(file, value); errors.Is(err, fs.ErrNotExist) {
		return false, nil // no freezer (v2 before Linux 5.2), or no group
	} else if err != nil {
		return false, fmt.Errorf("freeze: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, freezeWait)
	defer cancel()
	for {
		ok, err := done()
		if err != nil || ok {
			return true, err
		}
		if sleep(wctx, pollInterval) != nil {
			return true, nil
		}
	}
}

// thaw undoes freeze; a group that is gone needs no thawing.
func (g *Group) thaw() error {
	var err error
	if g.h.version == 2 {
		err = writeFile(filepath.Join(g.unified(), "cgroup.freeze"), "0")
	} else {
		err = writeFile(filepath.Join(g.dir(Freezer), "freezer.state"), "THAWED")
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("thaw: %w", err)
	}
	return nil
}

// Remove deletes the group's directories in every controller, with any
// groups below it. It returns [ErrNotEmpty] (errkind.FailedPrecondition)
// while processes remain, and nil for a group that is already gone.
func (g *Group) Remove() error {
	busy, err := g.populated()
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", g.name, err)
	}
	if busy {
		return fmt.Errorf("remove cgroup %s: %w", g.name, ErrNotEmpty)
	}
	for _, dir := range g.dirs() {
		sub, err := subtree(dir)
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", g.name, err)
		}
		for _, d := range sub {
			err := unix.Rmdir(d)
			switch {
			case err == nil, errors.Is(err, unix.ENOENT):
			case errors.Is(err, unix.EBUSY):
				return fmt.Errorf("remove cgroup %s: %w", g.name, ErrNotEmpty)
			default:
				return fmt.Errorf("remove cgroup %s: %w", g.name, &fs.PathError{Op: "rmdir", Path: d, Err: err})
			}
		}
	}
	return nil
}

// Stats is what a group has used. A field whose controller the hierarchy
// lacks is zero.
type Stats struct {
	// MemoryBytes is the memory charged now (v2 memory.current, v1
	// memory.usage_in_bytes, which counts page cache too).
	MemoryBytes int64
	// CPU is the CPU time used since the group was made (v2 cpu.stat
	// usage_usec, v1 cpuacct.usage).
	CPU time.Duration
	// Pids is the number of tasks (threads count) now (pids.current).
	Pids int64
}

// Stats reads the group's usage.
func (g *Group) Stats() (Stats, error) {
	var s Stats
	var err error
	read := func(c Controller, file string) int64 {
		if err != nil || !g.h.has(c) {
			return 0
		}
		var n int64
		n, err = readInt(filepath.Join(g.dir(c), file))
		return n
	}
	if g.h.version == 2 {
		s.MemoryBytes = read(Memory, "memory.current")
		s.Pids = read(Pids, "pids.current")
		if err == nil {
			var usec int64
			usec, err = readKey(filepath.Join(g.unified(), "cpu.stat"), "usage_usec")
			s.CPU = time.Duration(usec) * time.Microsecond
		}
	} else {
		s.MemoryBytes = read(Memory, "memory.usage_in_bytes")
		s.CPU = time.Duration(read(CPUAcct, "cpuacct.usage"))
		s.Pids = read(Pids, "pids.current")
	}
	if err != nil {
		return Stats{}, fmt.Errorf("stats of cgroup %s: %w", g.name, err)
	}
	return s, nil
}

// readInt reads a file holding one integer.
func readInt(name string) (int64, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", name, err)
	}
	return n, nil
}

// readKey reads the integer value of key in a flat keyed file such as
// cgroup.events or cpu.stat ("key value" lines).
func readKey(name, key string) (int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s %s: %w", name, key, err)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no key %s", name, key)
}

// sleep waits d or until ctx ends, then returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
