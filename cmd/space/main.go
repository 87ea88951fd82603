// Command space is SPACE's host binary: it builds guest images and, with
// later verbs, runs sandboxes.
//
// Usage:
//
//	space [--cache DIR] [-v] <verb> [flags] [args]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
)

// verb is one subcommand of space.
type verb struct {
	summary string // one line for the usage text
	// run executes the verb with its arguments (the verb name removed).
	// It parses them with g.parse (which adds the global flags and sets
	// g.log) and returns a usageError for bad arguments.
	run func(ctx context.Context, g *globals, args []string) error
}

// verbs is the dispatch table: add a verb by adding an entry.
var verbs = map[string]verb{
	"image":   {"build guest images: kernel, initramfs, rootfs", imageCmd},
	"run":     {"boot a throwaway sandbox VM and run a command (or a shell) in it", runCmd},
	"version": {"print the version of space", versionCmd},
}

// globals are the flags every verb accepts, before or after the verb name.
type globals struct {
	cacheBase string // artifact cache, e.g. ~/.cache/space
	verbose   bool
	stdout    io.Writer
	log       *slog.Logger // set once flags are parsed
}

// usageError reports bad command-line arguments (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal kills at once
	err := run(ctx, os.Args[1:])
	interrupted := ctx.Err() != nil
	stop()
	var ue usageError
	var ee exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, &ee):
		os.Exit(ee.code)
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "space: %v\nRun 'space help' for usage.\n", err)
		os.Exit(2)
	case interrupted:
		fmt.Fprintf(os.Stderr, "space: interrupted: %v\n", err)
		os.Exit(1)
	default:
		fmt.Fprintf(os.Stderr, "space: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	g := &globals{stdout: os.Stdout, cacheBase: cacheDefault()}
	fs := flag.NewFlagSet("space", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(os.Stderr)
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() == 0 {
		printUsage(os.Stderr)
		return usagef("no verb given")
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		printUsage(os.Stdout)
		return nil
	}
	v, ok := verbs[name]
	if !ok {
		return usagef("unknown verb %q", name)
	}
	return v.run(ctx, g, rest)
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: space [--cache DIR] [-v] <verb> [flags] [args]\n\nverbs:\n")
	for _, name := range slices.Sorted(maps.Keys(verbs)) {
		fmt.Fprintf(w, "  %-10s %s\n", name, verbs[name].summary)
	}
	fmt.Fprintf(w, "\nRun 'space <verb> -h' for a verb's flags.\n")
}

// register adds the global flags to fs, so that they are accepted both
// before the verb and among its flags.
func (g *globals) register(fs *flag.FlagSet) {
	if fs.Lookup("cache") != nil {
		return
	}
	fs.StringVar(&g.cacheBase, "cache", g.cacheBase, "artifact cache `dir`; defaults to $SPACE_CACHE_DIR, else ~/.cache/space")
	fs.BoolVar(&g.verbose, "v", g.verbose, "log debug detail")
}

func cacheDefault() string {
	if d := os.Getenv("SPACE_CACHE_DIR"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "space")
	}
	return ""
}

// parse parses a verb's flags (with the global ones) and sets up logging.
// Parse errors come back as usageError; -h prints the flags and returns
// flag.ErrHelp.
func (g *globals) parse(fs *flag.FlagSet, args []string) error {
	g.register(fs)
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stderr)
		fs.Usage()
		return err
	case err != nil:
		return usageError{fmt.Sprintf("%s: %v", verbName(fs), err)}
	}
	level := slog.LevelInfo
	if g.verbose {
		level = slog.LevelDebug
	}
	g.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return nil
}

func versionCmd(ctx context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("space version", flag.ContinueOnError)
	if err := g.parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("version takes no arguments")
	}
	fmt.Fprintf(g.stdout, "space %s\n", version())
	return nil
}

// verbName is the name of fs's verb without the program name, for messages
// that main prefixes with "space: ".
func verbName(fs *flag.FlagSet) string { return strings.TrimPrefix(fs.Name(), "space ") }

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
