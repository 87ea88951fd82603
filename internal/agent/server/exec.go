package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// exec runs one process for the host: op exec is a process of the table
// started with KillOnDetach and attached to the same stream, whose first
// frame is Started rather than a ProcInfo result. The process leads its own
// session (and process group): signals and kills go to the group. When the
// process exits normally, children it left in the background keep running;
// when the host goes away mid-call or the timeout passes, the whole group is
// killed.
func (s *Server) exec(ctx context.Context, c *call, req proto.ExecRequest) error {
	a := newAttachment(c)
	p, err := s.startProcess(proto.ProcStart{ExecRequest: req, KillOnDetach: true}, a)
	if err != nil {
		return c.fail(err)
	}
	return s.serveAttachment(ctx, p, a, func() error {
		return c.sendJSON(proto.TypeStarted, proto.Started{PID: p.pid})
	})
}

// startProcess starts a process in the table. When a is not nil, the
// process is attached to it from the start, before it can write anything.
func (s *Server) startProcess(ps proto.ProcStart, a *attachment) (*process, error) {
	req := ps.ExecRequest
	if err := proto.CheckProcTag(ps.Tag); err != nil {
		return nil, err
	}
	cmd, err := s.command(req)
	if err != nil {
		return nil, err
	}
	var (
		outputs  []*os.File // read ends the server pumps, with their frame types
		types    []proto.Type
		stdin    *os.File // or nil: stdin is /dev/null
		childEnd []*os.File
	)
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	if req.PTY != nil {
		m, tty, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("open pty: %w", err)
		}
		if err := pty.Setsize(m, &pty.Winsize{Rows: req.PTY.Rows, Cols: req.PTY.Cols}); err != nil {
			m.Close()
			tty.Close()
			return nil, fmt.Errorf("size pty: %w", err)
		}
		stdin = m
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
		childEnd = append(childEnd, tty)
		outputs, types = []*os.File{m}, []proto.Type{proto.TypeStdout}
	} else {
		if req.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, fmt.Errorf("stdin pipe: %w", err)
			}
			cmd.Stdin, stdin = r, w
			childEnd = append(childEnd, r)
		}
		for _, t := range []proto.Type{proto.TypeStdout, proto.TypeStderr} {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(childEnd)
				closeAll(outputs)
				closeAll([]*os.File{stdin})
				return nil, fmt.Errorf("output pipe: %w", err)
			}
			growPipe(r)
			if t == proto.TypeStdout {
				cmd.Stdout = w
			} else {
				cmd.Stderr = w
			}
			childEnd = append(childEnd, w)
			outputs, types = append(outputs, r), append(types, t)
		}
	}
	p := &process{
		argv: req.Argv, shell: req.Shell, cwd: cmd.Dir, tag: ps.Tag, started: time.Now(),
		killOnDetach: ps.KillOnDetach, stdin: stdin, isPTY: req.PTY != nil, unlisted: req.Unlisted,
		stdinTurn: make(chan struct{}, 1),
		out:       newOutputLog(proto.ProcOutputLimit, proto.ProcOutputLimit/64),
	}
	if a != nil {
		p.attach(a) // before the process can write: nothing is dropped
	}
	exited, err := s.reaper.start(cmd)
	closeAll(childEnd) // the child has its copies
	if err != nil {
		closeAll(outputs)
		if req.PTY == nil {
			closeAll([]*os.File{stdin})
		}
		return nil, startError(err)
	}
	p.pid = cmd.Process.Pid
	cmd.Process.Release() // the reaper waits for it, by pid
	if err := s.procs.insert(p); err != nil {
		// Shutting down: the process was started but will not be served.
		unix.Kill(-p.pid, unix.SIGKILL)
		closeAll(outputs)
		if req.PTY == nil {
			closeAll([]*os.File{stdin})
		}
		return nil, err
	}
	s.log.Debug("process started", "id", p.id, "pid", p.pid)
	go s.procs.supervise(p, exited, outputs, types, time.Duration(req.TimeoutMS)*time.Millisecond)
	return p, nil
}

// command builds the exec.Cmd for req, without stdio.
func (s *Server) command(req proto.ExecRequest) (*exec.Cmd, error) {
	var argv []string
	switch {
	case len(req.Argv) > 0 && req.Shell != "":
		return nil, fmt.Errorf("exec: both argv and shell given: %w", errkind.InvalidArgument)
	case len(req.Argv) > 0:
		argv = req.Argv
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	default:
		return nil, fmt.Errorf("exec: no argv or shell given: %w", errkind.InvalidArgument)
	}
	if argv[0] == "" {
		return nil, fmt.Errorf("exec: empty program name: %w", errkind.InvalidArgument)
	}
	for _, e := range req.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, fmt.Errorf("exec: env entry %.64q is not KEY=VALUE: %w", e, errkind.InvalidArgument)
		}
	}
	if req.TimeoutMS < 0 {
		return nil, fmt.Errorf("exec: negative timeout: %w", errkind.InvalidArgument)
	}
	if req.PTY != nil && (req.PTY.Rows == 0 || req.PTY.Cols == 0) {
		return nil, fmt.Errorf("exec: pty size %dx%d: %w", req.PTY.Cols, req.PTY.Rows, errkind.InvalidArgument)
	}
	env := append(append([]string(nil), s.cfg.Env...), req.Env...)
	if req.PTY != nil && !hasKey(env, "TERM") {
		env = append(env, "TERM=xterm-256color")
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		p, err := lookPath(path, env)
		if err != nil {
			return nil, err
		}
		path = p
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: cwd, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if req.UID != nil || req.GID != nil {
		cred := &syscall.Credential{NoSetGroups: false, Groups: []uint32{}}
		if req.UID != nil {
			cred.Uid = *req.UID
			cred.Gid = *req.UID
		}
		if req.GID != nil {
			cred.Gid = *req.GID
		}
		cmd.SysProcAttr.Credential = cred
	}
	return cmd, nil
}

// lookPath finds file in the exec's own PATH (not the agent's).
func lookPath(file string, env []string) (string, error) {
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %.64q not found in PATH: %w", file, errkind.NotFound)
}

func hasKey(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

func startError(err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("exec: %w: %w", err, errkind.NotFound)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("exec: %w: %w", err, errkind.PermissionDenied)
	}
	return fmt.Errorf("exec: %w", err)
}

// outputPipeSize is the buffer an output pipe gets, where the kernel
// allows it: a process writing in small pieces then fills it while the
// agent is busy, and the agent moves it in large reads.
const outputPipeSize = 1 << 20

// growPipe enlarges a pipe's buffer to outputPipeSize if it can; a pipe
// of the default size works too, only in smaller pieces.
func growPipe(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, outputPipeSize) })
	}
}
