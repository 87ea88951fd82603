package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/term"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/guestvm"
	"space/internal/imagebuild"
	"space/internal/vmm/qemu"
)

// exitError carries a guest command's exit code out of a verb.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("command exited with code %d", e.code) }

// runCmd boots a throwaway sandbox VM from the default images and runs a
// command in it, or an interactive shell when no command is given. The VM
// and its files are gone when it returns.
func runCmd(ctx context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	agent := agentFlag(fs)
	vcpus := fs.Int("cpus", 1, "virtual CPUs")
	mem := fs.Int("memory", 512, "guest memory in `MiB`")
	if err := g.parse(fs, args); err != nil {
		return err
	}
	if err := checkAgent(*agent); err != nil {
		return err
	}
	cache, err := g.openCache()
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "space: preparing guest images (the first run fetches a kernel and bootstraps Debian: minutes)")
	img, err := imagebuild.Build(ctx, imagebuild.Config{Cache: cache, AgentPath: *agent, Log: g.log})
	if err != nil {
		return err
	}
	qcfg := qemu.Config{Log: g.log, AccelCache: filepath.Join(cache.Root(), "accel-probe.json")}
	if os.Geteuid() == 0 {
		qcfg.User = &qemu.User{UID: 65534, GID: 65534} // nobody: QEMU needs no privilege
	}
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
	vm, err := guestvm.Boot(bctx, guestvm.Config{Images: img, Driver: drv, RunDir: run, DataDir: data, VCPUs: *vcpus, MemoryMiB: *mem})
	if err != nil {
		return fmt.Errorf("boot sandbox: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := vm.Close(cctx); err != nil {
			fmt.Fprintf(os.Stderr, "space: stop sandbox: %v\n", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "space: sandbox ready in %v (agent %s)\n", vm.BootTime.Round(time.Millisecond), vm.Client.AgentVersion())

	var exit proto.Exit
	if fs.NArg() == 0 {
		exit, err = shell(ctx, vm.Client)
	} else {
		exit, err = vm.Client.Exec(ctx, proto.ExecRequest{Argv: fs.Args(), Cwd: "/root"},
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
