package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"space/api"
	"space/client"
)

type execOptions struct {
	env              []string
	cwd, user        string
	timeout          time.Duration
	interactive, tty bool
	detach           bool
	killOnDisconnect bool
	tag              string
	output           string
}

func newExecCmd(g *globals) *cobra.Command {
	var o execOptions
	c := &cobra.Command{
		Use:   "exec ID [flags] -- CMD [ARGS...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox and stream its output; space exits with the
command's exit code (125 when space itself fails). Put -- before the command
so that its flags are not taken for space's.

Without -i and -t the command gets no stdin. With -i, stdin is streamed to it;
with -t it runs on a terminal (and, with -i on a terminal, space puts that
terminal in raw mode and forwards size changes).`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExec(cmd.Context(), g, o, args[0], args[1:])
		},
	}
	f := c.Flags()
	f.StringArrayVarP(&o.env, "env", "e", nil, "set an environment variable, `KEY=VALUE` (repeatable)")
	f.StringVarP(&o.cwd, "cwd", "w", "", "working `directory`")
	f.StringVarP(&o.user, "user", "u", "", "run as this `user` (name or uid); default root")
	f.DurationVar(&o.timeout, "timeout", 0, "kill the command after this long (default: no limit)")
	f.BoolVarP(&o.interactive, "interactive", "i", false, "stream stdin to the command")
	f.BoolVarP(&o.tty, "tty", "t", false, "run the command on a terminal")
	f.BoolVarP(&o.detach, "detach", "d", false, "start the command and print its process ID")
	f.BoolVar(&o.killOnDisconnect, "kill-on-disconnect", false, "kill the command when space is interrupted or loses the connection")
	f.StringVar(&o.tag, "tag", "", "name the command with this `tag`, shown by space ps")
	outputFlag(f, &o.output)
	return c
}

func runExec(ctx context.Context, g *globals, o execOptions, id string, argv []string) error {
	if err := checkOutput(o.output); err != nil {
		return err
	}
	if o.detach && (o.interactive || o.tty) {
		return usagef("exec: --detach cannot be combined with -i or -t (attach later with space attach)")
	}
	env, err := parseKV("env", o.env)
	if err != nil {
		return err
	}
	timeout, err := seconds("timeout", o.timeout)
	if err != nil {
		return err
	}
	req := api.Exec{Command: argv, Env: env, Cwd: o.cwd, User: o.user, TimeoutSeconds: timeout,
		KillOnDisconnect: o.killOnDisconnect, Tag: o.tag}
	cl, err := g.client()
	if err != nil {
		return err
	}
	if o.detach {
		p, err := cl.StartDetached(ctx, id, req)
		if err != nil {
			return err
		}
		if o.output == "json" {
			return g.printJSON(p)
		}
		_, err = fmt.Fprintln(g.stdout, p.ID)
		return err
	}
	var exit api.Exit
	if o.interactive || o.tty {
		exit, err = g.stream(ctx, o.interactive, o.tty, false, func(sio client.StreamIO, size *api.WinSize) (api.Exit, error) {
			req.TTY = size
			return cl.ExecStream(ctx, id, req, sio)
		})
	} else {
		exit, err = cl.Exec(ctx, id, req, g.stdout, g.stderr)
	}
	if err != nil {
		return err
	}
	return g.exitStatus(exit)
}

// exitStatus turns a command's exit into space's: nil for 0, else an
// exitError with the code.
func (g *globals) exitStatus(exit api.Exit) error {
	if exit.TimedOut {
		fmt.Fprintln(g.stderr, "space: the command timed out")
	}
	if exit.Code != 0 {
		return exitError{exit.Code}
	}
	return nil
}

// stream runs call with the standard streams: stdin only when withStdin.
// With tty, call gets the terminal's size (80x24 when stdin is not a
// terminal); when stdin is a terminal, size changes are forwarded
// (announceSize also sends the current one first), and with withStdin
// the terminal is in raw mode until call returns.
func (g *globals) stream(ctx context.Context, withStdin, tty, announceSize bool,
	call func(client.StreamIO, *api.WinSize) (api.Exit, error)) (api.Exit, error) {
	sio := client.StreamIO{Stdout: g.stdout, Stderr: g.stderr}
	if withStdin {
		sio.Stdin = g.stdin
	}
	if !tty {
		return call(sio, nil)
	}
	size := api.WinSize{Rows: 24, Cols: 80}
	f, ok := g.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return call(sio, &size)
	}
	fd := int(f.Fd())
	if s, ok := termSize(fd); ok {
		size = s
	}
	if withStdin {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return api.Exit{}, fmt.Errorf("terminal raw mode: %w", err)
		}
		defer term.Restore(fd, old)
	}

	resize := make(chan api.WinSize, 1)
	if announceSize {
		resize <- size
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				s, ok := termSize(fd)
				if !ok {
					continue
				}
				select {
				case resize <- s:
				case <-done:
					return
				}
			}
		}
	})
	defer func() {
		signal.Stop(winch)
		close(done)
		wg.Wait()
	}()
	sio.Resize = resize
	return call(sio, &size)
}

func termSize(fd int) (api.WinSize, bool) {
	cols, rows, err := term.GetSize(fd)
	if err != nil || cols <= 0 || rows <= 0 || cols > 0xffff || rows > 0xffff {
		return api.WinSize{}, false
	}
	return api.WinSize{Rows: uint16(rows), Cols: uint16(cols)}, true
}

func newAttachCmd(g *globals) *cobra.Command {
	var interactive bool
	c := &cobra.Command{
		Use:   "attach ID PID",
		Short: "Attach to a command running in a sandbox",
		Long: `Attach to a command started in a sandbox (PID is its process ID from space
exec --detach or space ps): print its buffered and then live output until it
exits, and exit with its exit code. With -i, stdin is streamed to it. A
command on a terminal is attached to this terminal.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id := args[0]
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			p, err := cl.Process(ctx, id, pid)
			if err != nil {
				return err
			}
			var exit api.Exit
			if interactive || p.TTY {
				exit, err = g.stream(ctx, interactive, p.TTY, true, func(sio client.StreamIO, _ *api.WinSize) (api.Exit, error) {
					return cl.Attach(ctx, id, pid, sio)
				})
			} else {
				exit, err = cl.Output(ctx, id, pid, g.stdout, g.stderr)
			}
			if err != nil {
				return err
			}
			return g.exitStatus(exit)
		},
	}
	c.Flags().BoolVarP(&interactive, "interactive", "i", false, "stream stdin to the command")
	return c
}

func parsePID(s string) (int64, error) {
	pid, err := strconv.ParseInt(s, 10, 64)
	if err != nil || pid < 0 {
		return 0, usagef("process ID %q: want a number (see space ps)", s)
	}
	return pid, nil
}

func newPsCmd(g *globals) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "ps ID",
		Short: "List the commands started in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			ps, err := cl.Processes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return g.printJSON(api.ProcessList{Processes: nonNil(ps)})
			}
			return g.printTable([]string{"ID", "PID", "STATUS", "STARTED", "TAG", "COMMAND"}, func(row func(...any)) {
				for _, p := range ps {
					command := p.Shell
					if command == "" {
						command = strings.Join(p.Command, " ")
					}
					row(p.ID, p.PID, processStatus(p), g.ago(p.StartedAt), cmp.Or(p.Tag, "-"), command)
				}
			})
		},
	}
	outputFlag(c.Flags(), &output)
	return c
}

// processStatus describes a process in a word or three.
func processStatus(p api.Process) string {
	switch {
	case p.Running && p.Attached:
		return "running, attached"
	case p.Running:
		return "running"
	case p.Exit == nil:
		return "exited"
	case p.Exit.TimedOut:
		return "timed out"
	case p.Exit.Signal != 0:
		return fmt.Sprintf("killed (%s)", unix.SignalName(syscall.Signal(p.Exit.Signal)))
	default:
		return fmt.Sprintf("exited (%d)", p.Exit.Code)
	}
}

func newKillCmd(g *globals) *cobra.Command {
	var sig string
	c := &cobra.Command{
		Use:   "kill ID PID",
		Short: "Send a signal to a command in a sandbox",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			n, err := parseSignal(sig)
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.Signal(cmd.Context(), args[0], pid, n)
		},
	}
	c.Flags().StringVarP(&sig, "signal", "s", "TERM", "the `signal`: a number or a name (KILL, SIGINT, ...)")
	return c
}

// parseSignal parses a signal number or name (with or without SIG).
func parseSignal(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, usagef("signal %d: want 1 to 64", n)
		}
		return n, nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if n := unix.SignalNum(name); n != 0 {
		return int(n), nil
	}
	return 0, usagef("unknown signal %q", s)
}
