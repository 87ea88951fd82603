package cgroup

import (
	"fmt"
	"io"
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
// binary under the name gateArgv0 instead, with two pipes. The gate's
// init reads one byte from the first (the go-ahead) and only then execs
// the real program, as the same process (the pid the caller moved is the
// pid that runs the program). The byte is written after the move; if the
// pipe closes first (the caller refused, failed, or died), the gate exits
// without running anything.
//
// The second pipe reports the exec: the gate holds its write end
// close-on-exec, so the caller reads end-of-file once the program runs,
// or the exec's error text when it failed. after returns only then, so a
// caller never sees the gate itself (its runtime's threads count against
// pids.max and show in the group's statistics).
const gateArgv0 = "space-cgroup-gate"

// exitGateClosed is the gate's exit status when its pipe closed before
// the go-ahead: nothing ran.
const exitGateClosed = 125

func init() {
	if len(os.Args) < 5 || os.Args[0] != gateArgv0 {
		return
	}
	os.Exit(runGate(os.Args[1], os.Args[2], os.Args[3], os.Args[4:]))
}

// runGate waits on the descriptor goFD (decimal) for the go-ahead and
// execs path with argv, with the descriptor reportFD closed by the exec.
// It returns only an exit status: exitGateClosed when the go-ahead pipe
// closed first, 127 when the exec failed (its error is written to
// reportFD).
func runGate(goFD, reportFD, path string, argv []string) int {
	g, err1 := strconv.Atoi(goFD)
	r, err2 := strconv.Atoi(reportFD)
	if err1 != nil || err2 != nil || g < 3 || r < 3 || g == r {
		fmt.Fprintf(os.Stderr, "%s: bad descriptors %q %q\n", gateArgv0, goFD, reportFD)
		return 127
	}
	unix.CloseOnExec(r)
	var b [1]byte
	for {
		got, err := unix.Read(g, b[:])
		if err == unix.EINTR {
			continue
		}
		if got != 1 {
			return exitGateClosed
		}
		break
	}
	unix.Close(g)
	err := unix.Exec(path, argv, os.Environ())
	msg := fmt.Sprintf("exec %s: %v", path, err)
	unix.Write(r, []byte(msg))
	fmt.Fprintf(os.Stderr, "%s: %s\n", gateArgv0, msg)
	return 127
}

// gate makes cmd start through the gate and returns what Place returns on
// v1: after moves pid into g, opens the gate and waits for the program's
// exec; release closes the caller's copies of the gate's ends, and the
// go-ahead pipe too when the start failed (cmd.Process is nil).
func (g *Group) gate(cmd *exec.Cmd) (after func(pid int) error, release func(), err error) {
	goR, goW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("place in cgroup %s: %w", g.name, err)
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		goR.Close()
		goW.Close()
		return nil, nil, fmt.Errorf("place in cgroup %s: %w", g.name, err)
	}
	fd := 3 + len(cmd.ExtraFiles) // after the caller's, so theirs keep their numbers
	path := cmd.Path
	cmd.Path = "/proc/self/exe"
	cmd.Args = append([]string{gateArgv0, strconv.Itoa(fd), strconv.Itoa(fd + 1), path}, cmd.Args...)
	cmd.ExtraFiles = append(cmd.ExtraFiles, goR, repW)
	var closeGoW, closeRepR, closeChild sync.Once
	// The child's ends: the caller's copies must close once the child
	// holds its own, or the report pipe never reaches end-of-file.
	childEnds := func() { closeChild.Do(func() { goR.Close(); repW.Close() }) }
	after = func(pid int) error {
		defer closeRepR.Do(func() { repR.Close() })
		defer closeGoW.Do(func() { goW.Close() })
		childEnds()
		if err := g.Add(pid); err != nil {
			return err // the gate reads EOF: the program never runs
		}
		if _, err := goW.Write([]byte{1}); err != nil {
			return fmt.Errorf("start pid %d in cgroup %s: %w", pid, g.name, err)
		}
		closeGoW.Do(func() { goW.Close() })
		msg, err := io.ReadAll(repR)
		if err != nil {
			return fmt.Errorf("start pid %d in cgroup %s: read the exec report: %w", pid, g.name, err)
		}
		if len(msg) > 0 {
			return fmt.Errorf("start pid %d in cgroup %s: %s", pid, g.name, msg)
		}
		return nil
	}
	release = func() {
		childEnds()
		if cmd.Process == nil {
			closeGoW.Do(func() { goW.Close() })
			closeRepR.Do(func() { repR.Close() })
		}
	}
	return after, release, nil
}
