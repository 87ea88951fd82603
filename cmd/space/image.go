package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"space/internal/cachedir"
	"space/internal/image/initramfs"
	"space/internal/image/kernel"
	"space/internal/image/rootfs"
	"space/internal/imagebuild"
	"space/internal/reflink"
)

var imageVerbs = map[string]verb{
	"kernel":    {"fetch the guest kernel and print its version and paths", imageKernelCmd},
	"initramfs": {"build the initramfs with the agent as /init", imageInitramfsCmd},
	"rootfs":    {"build a root file system image (default: Debian bootstrap)", imageRootfsCmd},
	"build":     {"build kernel, initramfs and default rootfs; print their paths", imageBuildCmd},
}

func imageCmd(ctx context.Context, g *globals, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		w := io.Writer(os.Stderr)
		if len(args) > 0 {
			w = os.Stdout
		}
		fmt.Fprintf(w, "usage: space image <verb> [flags]\n\nverbs:\n")
		for _, name := range slices.Sorted(maps.Keys(imageVerbs)) {
			fmt.Fprintf(w, "  %-10s %s\n", name, imageVerbs[name].summary)
		}
		if len(args) == 0 {
			return usagef("image: no verb given")
		}
		return nil
	}
	v, ok := imageVerbs[args[0]]
	if !ok {
		return usagef("image: unknown verb %q", args[0])
	}
	return v.run(ctx, g, args[1:])
}

func imageKernelCmd(ctx context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("space image kernel", flag.ContinueOnError)
	pkg := fs.String("package", kernel.DefaultPackage, "Debian kernel `package` (or metapackage)")
	if err := g.parseNoArgs(fs, args); err != nil {
		return err
	}
	cache, err := g.openCache()
	if err != nil {
		return err
	}
	k, err := kernel.Fetch(ctx, kernel.Config{Cache: cache, Package: *pkg, Log: g.log})
	if err != nil {
		return err
	}
	return g.printFields(
		"version", k.Version,
		"package", k.Package+" "+k.PackageVersion,
		"vmlinuz", k.Vmlinuz,
		"vmlinux", k.Vmlinux,
		"modules", k.ModulesDir,
	)
}

func imageInitramfsCmd(ctx context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("space image initramfs", flag.ContinueOnError)
	agent := agentFlag(fs)
	if err := g.parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := checkAgent(*agent); err != nil {
		return err
	}
	cache, err := g.openCache()
	if err != nil {
		return err
	}
	k, err := kernel.Fetch(ctx, kernel.Config{Cache: cache, Log: g.log})
	if err != nil {
		return err
	}
	p, err := initramfs.Build(ctx, cache, initramfs.Spec{Agent: *agent, Kernel: k})
	if err != nil {
		return err
	}
	return g.printFields("kernel", k.Version, "initramfs", p)
}

func imageRootfsCmd(ctx context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("space image rootfs", flag.ContinueOnError)
	dir := fs.String("dir", "", "make the image from this `directory`")
	oci := fs.String("oci", "", "make the image from this OCI image layout or tarball (`path`)")
	boot := fs.Bool("debootstrap", false, "bootstrap the default Debian image into the cache (the default)")
	out := fs.String("out", "", "write the image to this `file` (required with --dir and --oci)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: space image rootfs [--dir DIR | --oci PATH | --debootstrap] [--out IMG]\n")
		fs.PrintDefaults()
	}
	if err := g.parseNoArgs(fs, args); err != nil {
		return err
	}
	sources := 0
	for _, set := range []bool{*dir != "", *oci != "", *boot} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		return usagef("image rootfs: give at most one of --dir, --oci and --debootstrap")
	}
	if (*dir != "" || *oci != "") && *out == "" {
		return usagef("image rootfs: --out is required with --dir and --oci")
	}
	opts := rootfs.Ext4Options{Label: rootfs.DefaultLabel}

	switch {
	case *dir != "":
		if err := rootfs.MakeExt4(ctx, *dir, *out, opts); err != nil {
			return err
		}
		return g.printFields("rootfs", *out)

	case *oci != "":
		tmp, err := os.MkdirTemp(filepath.Dir(*out), ".space-rootfs-")
		if err != nil {
			return fmt.Errorf("unpack %s: %w", *oci, err)
		}
		defer os.RemoveAll(tmp)
		tree := filepath.Join(tmp, "tree")
		cfg, err := rootfs.UnpackOCI(ctx, *oci, tree)
		if err != nil {
			return err
		}
		if err := rootfs.MakeExt4(ctx, tree, *out, opts); err != nil {
			return err
		}
		return g.printFields(
			"rootfs", *out,
			"entrypoint", strings.Join(cfg.Entrypoint, " "),
			"cmd", strings.Join(cfg.Cmd, " "),
			"workdir", cfg.WorkingDir,
			"user", cfg.User,
		)

	default:
		cache, err := g.openCache()
		if err != nil {
			return err
		}
		p, err := rootfs.Default(ctx, cache, g.log)
		if err != nil {
			return err
		}
		if *out == "" {
			return g.printFields("rootfs", p)
		}
		if err := reflink.Copy(ctx, p, *out); err != nil {
			return err
		}
		return g.printFields("rootfs", *out)
	}
}

func imageBuildCmd(ctx context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("space image build", flag.ContinueOnError)
	agent := agentFlag(fs)
	if err := g.parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := checkAgent(*agent); err != nil {
		return err
	}
	cache, err := g.openCache()
	if err != nil {
		return err
	}
	art, err := imagebuild.Build(ctx, imagebuild.Config{Cache: cache, AgentPath: *agent, Log: g.log})
	if err != nil {
		return err
	}
	return g.printFields(
		"kernel", art.Kernel.Version,
		"vmlinuz", art.Kernel.Vmlinuz,
		"vmlinux", art.Kernel.Vmlinux,
		"initramfs", art.Initramfs,
		"rootfs", art.Rootfs,
	)
}

// agentFlag registers --agent, defaulting to space-agent next to the
// running executable (where make build puts it).
func agentFlag(fs *flag.FlagSet) *string {
	def := ""
	if exe, err := os.Executable(); err == nil {
		def = filepath.Join(filepath.Dir(exe), "space-agent")
	}
	return fs.String("agent", def, "the static space-agent `binary` to put in the initramfs")
}

func checkAgent(path string) error {
	if path == "" {
		return usagef("no agent binary: pass --agent PATH")
	}
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("agent binary %s not found: build it with 'make build' or pass --agent PATH", path)
		}
		return fmt.Errorf("agent binary: %w", err)
	}
	return nil
}

// parseNoArgs parses fs and rejects positional arguments.
func (g *globals) parseNoArgs(fs *flag.FlagSet, args []string) error {
	if err := g.parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", verbName(fs), fs.Arg(0))
	}
	return nil
}

func (g *globals) openCache() (*cachedir.Dir, error) {
	if g.cacheBase == "" {
		return nil, usagef("no cache directory: pass --cache DIR or set SPACE_CACHE_DIR")
	}
	return cachedir.Open(g.cacheBase)
}

// printFields prints name/value pairs as aligned lines, skipping empty
// values.
func (g *globals) printFields(kv ...string) error {
	tw := tabwriter.NewWriter(g.stdout, 0, 8, 2, ' ', 0)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			fmt.Fprintf(tw, "%s\t%s\n", kv[i], kv[i+1])
		}
	}
	return tw.Flush()
}
