// Command space is SPACE's host binary: it builds guest images, runs the
// API server and workers (space server, space worker), and is the command
// line client of the API (space sandbox, exec, file, ...).
//
// Usage:
//
//	space [--cache DIR] [--data-dir DIR] [-v] <verb> [flags] [args]
//
// Exit status: 0 on success; a guest command's own exit code for exec,
// attach and run; 2 for bad usage; 125 when space itself fails; 130 when
// interrupted.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"space/internal/cachedir"
	"space/internal/origin"
)

// Exit statuses of space's own failures.
const (
	exitUsage       = 2
	exitFailure     = 125
	exitInterrupted = 130
)

// globals are what every verb shares: the global flags, the standard
// streams and the environment. Verbs read the flag fields only once
// cobra has parsed the flags (in RunE).
type globals struct {
	cacheBase string // --cache: artifact cache, e.g. ~/.cache/space; "" = none
	verbose   bool   // -v: log debug detail
	dataDir   string // --data-dir: server state, admin.key, server.json

	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time

	// logger returns the logger of the run (to stderr; debug level with
	// -v). It is made at the first call, which must come after flag
	// parsing.
	logger func() *slog.Logger
}

// newGlobals returns the globals of a run of space with the process's
// streams and environment, and the defaults of the global flags.
func newGlobals(stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) *globals {
	g := &globals{
		cacheBase: cachedir.DefaultBase(getenv),
		dataDir:   getenv("SPACE_DATA_DIR"),
		stdin:     stdin,
		stdout:    stdout,
		stderr:    stderr,
		getenv:    getenv,
		now:       time.Now,
	}
	if g.dataDir == "" {
		g.dataDir = defaultDataDir()
	}
	g.logger = sync.OnceValue(func() *slog.Logger {
		level := slog.LevelInfo
		if g.verbose {
			level = slog.LevelDebug
		}
		return slog.New(origin.LogHandler(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: level})))
	})
	return g
}

// usageError reports bad command-line arguments (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// exitError carries a guest command's exit code out of a verb.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("command exited with code %d", e.code) }

// runError marks an error returned by a verb's RunE, as opposed to one
// cobra returns for bad flags, arguments or verbs (usage errors).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal kills at once
	g := newGlobals(os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	code := execute(ctx, g, os.Args[1:])
	stop()
	os.Exit(code)
}

// execute runs space with args, prints its failure to g.stderr, and
// returns the exit status.
func execute(ctx context.Context, g *globals, args []string) int {
	cmd, err := run(ctx, g, args)
	var ee exitError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(g.stderr, "space: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return exitUsage
	case ctx.Err() != nil:
		fmt.Fprintf(g.stderr, "space: interrupted: %v\n", err)
		return exitInterrupted
	default:
		fmt.Fprintf(g.stderr, "space: %v\n", err)
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" {
			fmt.Fprintf(g.stderr, "Is space server running? Client verbs find it by SPACE_API_URL, else %s.\n",
				filepath.Join(g.dataDir, serverInfoFile))
		}
		return exitFailure
	}
}

// run runs space with args and returns the verb that ran (or the one
// the usage error is about) and its error. Errors of bad usage come back
// as usageError.
func run(ctx context.Context, g *globals, args []string) (*cobra.Command, error) {
	root := newRootCmd(g)
	if args == nil {
		args = []string{} // nil makes cobra read os.Args
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if cmd == nil {
		cmd = root
	}
	if err == nil {
		return cmd, nil
	}
	var re runError
	if errors.As(err, &re) {
		return cmd, re.err
	}
	return cmd, usageError{err.Error()}
}

// newRootCmd returns the space command with every verb.
func newRootCmd(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "space",
		Short:         "Run untrusted code in micro-VMs",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown verb %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(g.stderr)
			cmd.Usage()
			return usagef("no verb given")
		},
	}
	root.SetIn(g.stdin)
	root.SetOut(g.stdout)
	root.SetErr(g.stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.cacheBase, "cache", g.cacheBase, "artifact cache `dir` (env SPACE_CACHE_DIR)")
	pf.StringVar(&g.dataDir, "data-dir", g.dataDir, "state `dir` of space server, with admin.key and server.json (env SPACE_DATA_DIR)")
	pf.BoolVarP(&g.verbose, "verbose", "v", g.verbose, "log debug detail")

	root.AddCommand(
		newImageCmd(g),
		newRunCmd(g),
		newVersionCmd(g),
		newServerCmd(g),
		newWorkerCmd(g),
		newProxyCmd(g),
		newSandboxCmd(g),
		newExecCmd(g),
		newAttachCmd(g),
		newPsCmd(g),
		newKillCmd(g),
		newFileCmd(g),
		newAPIKeyCmd(g),
		newQuotaCmd(g),
		newSnapshotCmd(g),
		newTemplateCmd(g),
		newSecretCmd(g),
		newEventsCmd(g),
		newWebhookCmd(g),
		newAuditCmd(g),
		newMCPCmd(g),
	)
	markRunErrors(root)
	return root
}

// markRunErrors wraps the RunE of c and its descendants so that run can
// tell their errors from cobra's usage errors.
func markRunErrors(c *cobra.Command) {
	if f := c.RunE; f != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if err := f(cmd, args); err != nil {
				return runError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markRunErrors(sub)
	}
}

// newGroupCmd returns a verb that only holds the verbs subs: without one
// it prints its usage and fails.
func newGroupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && args[0] != "help" {
				return usagef("%s: unknown verb %q", cmd.Name(), args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 { // help
				return cmd.Help()
			}
			cmd.SetOut(cmd.ErrOrStderr())
			cmd.Usage()
			return usagef("%s: no verb given", cmd.Name())
		},
	}
	c.AddCommand(subs...)
	return c
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of space",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprintf(g.stdout, "space %s\n", version())
			return err
		},
	}
}

// version describes the build: the module version (or the VCS revision of a
// build from a checkout) and the Go toolchain.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown build)"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if rev != "" && (v == "" || v == "(devel)") {
		v = rev[:min(12, len(rev))] + modified
	}
	return fmt.Sprintf("%s %s", v, bi.GoVersion)
}
