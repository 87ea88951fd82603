package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// A gate holds a process started on v1 until it is in its group.
//
// v1 has no way to create a process inside a group: the caller starts it
// and then writes its pid into each controller's cgroup.procs. A caller
// that dies between the two (a worker killed mid-start) would leave a VMM
// running outside every group, where restart recovery, which looks for
// VMMs in their groups, never finds it. So [Group.Place] starts this very
// binary under the name gateArgv0 instead, with one end of a pipe. The
// gate's init reads one byte from that pipe and only then execs the real
// program, as the same process (the pid the caller moved is the pid that
// runs the program). The byte is written after the move; if the pipe
// closes first (the caller refused, failed, or died), the gate exits
// without running anything.
const gateArgv0 = "space-cgroup-gate"

// exitGateClosed is the gate's exit status when its pipe closed before
// the go-ahead: nothing ran.
const exitGateClosed = 125

func init() {
	if len(os.Args) < 4 || os.Args[0] != gateArgv0 {
		return
	}
	os.Exit(runGate(os.Args[1], os.Args[2], os.Args[3:]))
}

// runGate waits on the descriptor fd (decimal) for the go-ahead and execs
// path with argv. It returns only an exit status: exitGateClosed when the
// pipe closed first, 127 when the exec failed.
func runGate(fd, path string, argv []string) int {
	n, err := strconv.Atoi(fd)
	if err != nil || n < 3 {
		fmt.Fprintf(os.Stderr, "%s: bad descriptor %q\n", gateArgv0, fd)
		return 127
	}
	var b [1]byte
	for {
		got, err := unix.Read(n, b[:])
		if err == unix.EINTR {
			continue
		}
		if got != 1 {
			return exitGateClosed
		}
		break
	}
	unix.Close(n)
	err = unix.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "%s: exec %s: %v\n", gateArgv0, path, err)
	return 127
}

// gate makes cmd start through the gate and returns what Place returns on
// v1: after moves pid into g and opens the gate; release closes the
// caller's copy of the gate's end, and the caller's own end too when the
// start failed (cmd.Process is nil).
func (g *Group) gate(cmd *exec.Cmd) (after func(pid int) error, release func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("place in cgroup %s: %w", g.name, err)
	}
	fd := 3 + len(cmd.ExtraFiles) // after the caller's, so theirs keep their numbers
	path := cmd.Path
	cmd.Path = "/proc/self/exe"
	cmd.Args = append([]string{gateArgv0, strconv.Itoa(fd), path}, cmd.Args...)
	cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	var once sync.Once
	closeW := func() { once.Do(func() { w.Close() }) }
	after = func(pid int) error {
		defer closeW()
		if err := g.Add(pid); err != nil {
			return err // the gate reads EOF: the program never runs
		}
		if _, err := w.Write([]byte{1}); err != nil {
			return fmt.Errorf("start pid %d in cgroup %s: %w", pid, g.name, err)
		}
		return nil
	}
	release = func() {
		r.Close()
		if cmd.Process == nil {
			closeW()
		}
	}
	return after, release, nil
}
