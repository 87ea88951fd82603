// Command space-images builds the OCI image archives that run SPACE in
// Kubernetes: space-controlplane and space-worker, reproducibly, with no
// container engine. `make images` runs it.
//
// Usage:
//
//	space-images --space BIN --agent BIN [--out DIR] [--image NAME]... [flags]
//
// It writes DIR/<name>-<tag>.tar (an OCI image layout in a tarball) and
// DIR/images.json, and prints one line per image. SOURCE_DATE_EPOCH, when
// set, is the images' creation time; otherwise the commit time recorded
// in the space binary is. Exit status: 0 on success, 2 for bad usage, 1
// when the build fails.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"space/internal/cachedir"
	"space/internal/hostimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal kills at once
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run runs space-images with args and returns its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	var (
		cfg       hostimage.Config
		cacheBase string
		verbose   bool
	)
	fs := pflag.NewFlagSet("space-images", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Space, "space", "", "static space `binary` (CGO_ENABLED=0) to ship")
	fs.StringVar(&cfg.Agent, "agent", "", "static space-agent `binary` for the worker image")
	fs.StringVar(&cfg.OutDir, "out", filepath.Join("dist", "images"), "output `directory`")
	fs.StringSliceVar(&cfg.Images, "image", nil, "image to build: controlplane or worker (repeatable; default both)")
	fs.StringVar(&cacheBase, "cache", cachedir.DefaultBase(getenv), "artifact cache `dir` for the base layers (env SPACE_CACHE_DIR)")
	fs.StringVar(&cfg.Repository, "repository", hostimage.DefaultRepository, "`prefix` of the image names in the archives")
	fs.StringVar(&cfg.Version, "version", "", "`version` label (default: from the space binary's build information)")
	fs.StringVar(&cfg.Revision, "revision", "", "VCS `revision` label (default: from the space binary's build information)")
	fs.StringVar(&cfg.Source, "source", "", "source code `URL` for the org.opencontainers.image.source label")
	fs.StringVar(&cfg.Suite, "suite", hostimage.DefaultSuite, "Debian `release` of the worker's base")
	fs.StringVar(&cfg.Mirror, "mirror", "", "Debian archive `URL` of the worker's base (default: the host's)")
	fs.BoolVarP(&verbose, "verbose", "v", false, "log debug detail")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "space-images: %v\nRun 'space-images --help' for usage.\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "space-images: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if cfg.Space == "" {
		fmt.Fprintln(stderr, "space-images: --space is required")
		return 2
	}
	if s := getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "space-images: SOURCE_DATE_EPOCH=%q is not a number of seconds\n", s)
			return 2
		}
		cfg.Epoch = time.Unix(sec, 0)
	}
	cfg.Source = withoutUserinfo(cfg.Source)
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	cfg.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	if cacheBase == "" {
		fmt.Fprintln(stderr, "space-images: no cache directory: pass --cache DIR or set SPACE_CACHE_DIR")
		return 2
	}
	cache, err := cachedir.Open(cacheBase)
	if err != nil {
		fmt.Fprintf(stderr, "space-images: %v\n", err)
		return 1
	}
	cfg.Cache = cache
	images, err := hostimage.Build(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "space-images: %v\n", err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	for _, img := range images {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f MiB\n", img.Reference, img.Digest,
			filepath.Join(cfg.OutDir, img.Archive), img.Version, float64(img.Size)/(1<<20))
	}
	if err := tw.Flush(); err != nil {
		return 1
	}
	return 0
}

// withoutUserinfo drops any user name and password from a URL (a git
// remote may carry a token), so that they never end up in a label.
func withoutUserinfo(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	u.User = nil
	return u.String()
}
