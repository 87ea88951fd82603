package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/guestvm"
	"space/internal/imagebuild"
	"space/internal/vmm/qemu"
)

func newRunCmd(g *globals) *cobra.Command {
	var o runOptions
	c := &cobra.Command{
		Use:   "run [flags] [--] [CMD [ARGS...]]",
		Short: "Boot a throwaway sandbox VM and run a command (or a shell) in it",
		Long: `Boot a throwaway sandbox VM from the default images, without a server, and run
a command in it, or an interactive shell when no command is given. The VM and
its files are gone when the command ends. Flags go before the command.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVM(cmd.Context(), g, o, args)
		},
	}
	f := c.Flags()
	f.SetInterspersed(false) // space run ls -l: -l is the command's
	agentFlag(f, &o.agent)
	f.IntVar(&o.vcpus, "cpus", 1, "virtual CPUs")
	f.IntVar(&o.memoryMiB, "memory", 512, "guest memory in `MiB`")
	return c
}

type runOptions struct {
	agent     string
	vcpus     int
	memoryMiB int
}

// runVM boots a throwaway sandbox VM from the default images and runs
// argv in it, or an interactive shell when argv is empty. The VM and its
// files are gone when it returns.
func runVM(ctx context.Context, g *globals, o runOptions, argv []string) error {
	if err := checkAgent(o.agent); err != nil {
		return err
	}
	cache, err := g.openCache()
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stderr, "space: preparing guest images (the first run fetches a kernel and bootstraps Debian: minutes)")
	img, err := imagebuild.Build(ctx, imagebuild.Config{Cache: cache, AgentPath: o.agent, Log: g.logger()})
	if err != nil {
		return err
	}
	qcfg := qemu.Config{Log: g.logger(), AccelCache: filepath.Join(cache.Root(), "accel-probe.json")}
	// As root, QEMU runs jailed as qemu.DefaultUID and DefaultGID.
	drv, err := qemu.New(qcfg)
	if err != nil {
		return err
	}
	runBase := "/dev/shm" // guest RAM is a file mapping: keep it in memory
	if _, err := os.Stat(runBase); err != nil {
		runBase = os.TempDir()
	}
	run, err := os.MkdirTemp(runBase, "space-run-")
	if err != nil {
		return err
	}
	data, err := os.MkdirTemp(filepath.Join(g.cacheBase), "run-")
	if err != nil {
		os.RemoveAll(run)
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	vm, err := guestvm.Boot(bctx, guestvm.Config{Images: img, Driver: drv, RunDir: run, DataDir: data, VCPUs: o.vcpus, MemoryMiB: o.memoryMiB})
	if err != nil {
		return fmt.Errorf("boot sandbox: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := vm.Close(cctx); err != nil {
			fmt.Fprintf(g.stderr, "space: stop sandbox: %v\n", err)
		}
	}()
	fmt.Fprintf(g.stderr, "space: sandbox ready in %v (agent %s)\n", vm.BootTime.Round(time.Millisecond), vm.Client.AgentVersion())

	var exit proto.Exit
	if len(argv) == 0 {
		exit, err = shell(ctx, vm.Client)
	} else {
		exit, err = vm.Client.Exec(ctx, proto.ExecRequest{Argv: argv, Cwd: "/root"},
			client.IO{Stdin: stdinIfPiped(), Stdout: os.Stdout, Stderr: os.Stderr})
	}
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		return exitError{exit.Code}
	}
	return nil
}

// stdinIfPiped returns os.Stdin unless it is a terminal (a command given on
// the command line then reads nothing).
func stdinIfPiped() *os.File {
	if term.IsTerminal(int(os.Stdin.Fd())) {
		return nil
	}
	return os.Stdin
}

// shell runs bash on a guest terminal wired to ours: raw mode, window size
// changes forwarded.
func shell(ctx context.Context, c *client.Client) (proto.Exit, error) {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return proto.Exit{}, errors.New("no command given and stdin is not a terminal: pass a command, e.g. space run -- uname -a")
	}
	cols, rows, err := term.GetSize(fd)
	if err != nil || cols <= 0 || rows <= 0 {
		cols, rows = 80, 24 // a terminal that does not know its size
	}
	old, err := term.MakeRaw(fd)
	if err != nil {
		return proto.Exit{}, fmt.Errorf("terminal raw mode: %w", err)
	}
	defer term.Restore(fd, old)
	p, err := c.Start(ctx, proto.ExecRequest{Argv: []string{"/bin/bash", "-l"}, Cwd: "/root",
		PTY: &proto.WinSize{Rows: uint16(rows), Cols: uint16(cols)}}, client.IO{Stdout: os.Stdout})
	if err != nil {
		return proto.Exit{}, err
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 && p.WriteStdin(buf[:n]) != nil {
				return
			}
			if err != nil {
				p.CloseStdin()
				return
			}
		}
	}()
	for {
		select {
		case <-p.Done():
			return p.Wait()
		case <-winch:
			if cols, rows, err := term.GetSize(fd); err == nil && cols > 0 && rows > 0 {
				p.Resize(uint16(rows), uint16(cols))
			}
		}
	}
}
