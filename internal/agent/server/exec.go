package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// exec runs one process for the host. The process leads its own session
// (and process group): signals and kills go to the group. When the process
// exits normally, children it left in the background keep running; when the
// host goes away mid-call or the timeout passes, the whole group is killed.
func (s *Server) exec(ctx context.Context, c *call, req proto.ExecRequest) error {
	cmd, err := s.command(req)
	if err != nil {
		return c.fail(err)
	}
	var (
		outputs  []*os.File // read ends the server pumps, with their frame types
		types    []proto.Type
		stdinW   *os.File // or nil: stdin is /dev/null
		ptmx     *os.File // or nil: no terminal
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
			return c.fail(fmt.Errorf("open pty: %w", err))
		}
		if err := pty.Setsize(m, &pty.Winsize{Rows: req.PTY.Rows, Cols: req.PTY.Cols}); err != nil {
			m.Close()
			tty.Close()
			return c.fail(fmt.Errorf("size pty: %w", err))
		}
		ptmx = m
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
		childEnd = append(childEnd, tty)
		outputs, types = []*os.File{m}, []proto.Type{proto.TypeStdout}
	} else {
		if req.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return c.fail(fmt.Errorf("stdin pipe: %w", err))
			}
			cmd.Stdin, stdinW = r, w
			childEnd = append(childEnd, r)
		}
		for _, t := range []proto.Type{proto.TypeStdout, proto.TypeStderr} {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(childEnd)
				closeAll(outputs)
				if stdinW != nil {
					stdinW.Close()
				}
				return c.fail(fmt.Errorf("output pipe: %w", err))
			}
			if t == proto.TypeStdout {
				cmd.Stdout = w
			} else {
				cmd.Stderr = w
			}
			childEnd = append(childEnd, w)
			outputs, types = append(outputs, r), append(types, t)
		}
	}
	exited, err := s.reaper.start(cmd)
	closeAll(childEnd) // the child has its copies
	if err != nil {
		closeAll(outputs)
		if stdinW != nil {
			stdinW.Close()
		}
		return c.fail(startError(err))
	}
	pid := cmd.Process.Pid
	cmd.Process.Release() // the reaper waits for it, by pid
	p := &process{pid: pid}
	s.log.Debug("exec started", "pid", pid)

	// Started goes out before any output frame: the host expects it first.
	if err := c.sendJSON(proto.TypeStarted, proto.Started{PID: pid}); err != nil {
		p.kill(unix.SIGKILL)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	pumpsDone := make(chan struct{})
	var pumps sync.WaitGroup
	var exitedFlag atomic.Bool
	for i, f := range outputs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			defer f.Close()
			s.pump(c, f, types[i], &exitedFlag)
		}()
	}
	go func() { pumps.Wait(); close(pumpsDone) }()

	// Frames from the host: stdin, signals, resizes. An error or EOF here
	// before the exit means the host went away.
	hostGone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		stdin := stdinW
		if ptmx != nil {
			stdin = ptmx
		}
		s.readControl(c, p, stdin, ptmx != nil, hostGone)
		if stdinW != nil {
			stdinW.Close()
		}
	}()

	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var ws unix.WaitStatus
	timedOut := false
	done := ctx.Done()
wait:
	for {
		select {
		case ws = <-exited:
			break wait
		case <-timeout:
			timedOut = true
			p.kill(unix.SIGKILL)
			timeout = nil
		case <-hostGone:
			p.kill(unix.SIGKILL)
			hostGone = nil
		case <-done:
			p.kill(unix.SIGKILL)
			done = nil
		}
	}
	p.markExited()
	exitedFlag.Store(true)
	// Wake pumps blocked in a read so they apply the exit grace.
	for _, f := range outputs {
		f.SetReadDeadline(time.Now().Add(s.cfg.ExitGrace))
	}
	<-pumpsDone
	exit := proto.Exit{Code: ws.ExitStatus(), TimedOut: timedOut}
	if ws.Signaled() {
		exit.Signal = int(ws.Signal())
		exit.Code = 128 + exit.Signal
	}
	err = c.sendJSON(proto.TypeExit, exit)
	// Unblock the control reader: closing our side ends its stream reads.
	c.st.Close()
	return err
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

// pump copies one output of the process into frames until EOF. Once the
// process has exited, it stops after ExitGrace without new bytes: children
// left in the background may hold the pipe open for ever.
func (s *Server) pump(c *call, f *os.File, t proto.Type, exited *atomic.Bool) {
	buf := make([]byte, proto.DataChunk)
	for {
		if exited.Load() {
			f.SetReadDeadline(time.Now().Add(s.cfg.ExitGrace))
		}
		n, err := f.Read(buf)
		if n > 0 {
			if werr := c.send(t, buf[:n]); werr != nil {
				return // host gone; the exec loop kills the process
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && !exited.Load() {
				continue // the deadline was for an exit that had not happened
			}
			return // EOF, EIO from a pty whose last holder closed, or grace over
		}
	}
}

// readControl applies the host's frames to the process until the stream
// ends, then closes hostGone if the host went away (rather than the call
// finishing).
func (s *Server) readControl(c *call, p *process, stdin *os.File, isPTY bool, hostGone chan<- struct{}) {
	stdinOpen := stdin != nil
	for {
		f, err := c.r.Next()
		if err != nil {
			if !p.hasExited() {
				close(hostGone)
			}
			return
		}
		switch f.Type {
		case proto.TypeStdin:
			if !stdinOpen {
				continue // stdin closed or never asked for: drop
			}
			if _, err := stdin.Write(f.Payload); err != nil {
				stdinOpen = false // process closed its stdin; keep serving signals
			}
		case proto.TypeStdinEOF:
			if stdinOpen && !isPTY {
				stdin.Close()
			} else if stdinOpen {
				stdin.Write([]byte{4}) // ^D on a terminal
			}
			stdinOpen = isPTY && stdinOpen
		case proto.TypeSignal:
			var sig proto.Signal
			if proto.DecodeJSON(f, 0, &sig) == nil && sig.Signal > 0 && sig.Signal < 65 {
				p.kill(unix.Signal(sig.Signal))
			}
		case proto.TypeResize:
			var ws proto.WinSize
			if isPTY && proto.DecodeJSON(f, 0, &ws) == nil && ws.Rows > 0 && ws.Cols > 0 {
				pty.Setsize(stdin, &pty.Winsize{Rows: ws.Rows, Cols: ws.Cols})
			}
		default:
			// Unknown or misplaced frames are ignored: the call goes on.
		}
	}
}

// process is a started exec's process group.
type process struct {
	pid int // +checklocksignore: set before the process is shared

	mu sync.Mutex
	// +checklocks:mu
	exited bool // reaped: the pid may now belong to someone else
}

// kill signals the process group, unless the leader was already reaped.
// Children left behind keep the group alive after the leader exits; they
// are deliberately not chased then.
func (p *process) kill(sig unix.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		unix.Kill(-p.pid, sig)
	}
}

func (p *process) markExited() {
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
}

func (p *process) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}
