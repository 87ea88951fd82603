package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"space/internal/cachedir"
	"space/internal/image/initramfs"
	"space/internal/image/kernel"
	"space/internal/image/rootfs"
	"space/internal/imagebuild"
	"space/internal/reflink"
)

func newImageCmd(g *globals) *cobra.Command {
	return newGroupCmd("image", "Build guest images: kernel, initramfs, rootfs",
		newImageKernelCmd(g), newImageInitramfsCmd(g), newImageRootfsCmd(g), newImageBuildCmd(g))
}

func newImageKernelCmd(g *globals) *cobra.Command {
	var pkg string
	c := &cobra.Command{
		Use:   "kernel",
		Short: "Fetch the guest kernel and print its version and paths",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cache, err := g.openCache()
			if err != nil {
				return err
			}
			k, err := kernel.Fetch(cmd.Context(), kernel.Config{Cache: cache, Package: pkg, Log: g.logger()})
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
		},
	}
	c.Flags().StringVar(&pkg, "package", kernel.DefaultPackage, "Debian kernel `package` (or metapackage)")
	return c
}

func newImageInitramfsCmd(g *globals) *cobra.Command {
	var agent string
	c := &cobra.Command{
		Use:   "initramfs",
		Short: "Build the initramfs with the agent as /init",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if err := checkAgent(agent); err != nil {
				return err
			}
			cache, err := g.openCache()
			if err != nil {
				return err
			}
			k, err := kernel.Fetch(ctx, kernel.Config{Cache: cache, Log: g.logger()})
			if err != nil {
				return err
			}
			p, err := initramfs.Build(ctx, cache, initramfs.Spec{Agent: agent, Kernel: k})
			if err != nil {
				return err
			}
			return g.printFields("kernel", k.Version, "initramfs", p)
		},
	}
	agentFlag(c.Flags(), &agent)
	return c
}

func newImageRootfsCmd(g *globals) *cobra.Command {
	var o rootfsOptions
	c := &cobra.Command{
		Use:   "rootfs [--dir DIR | --oci PATH | --debootstrap] [--out IMG]",
		Short: "Build a root file system image (default: Debian bootstrap)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return imageRootfs(cmd.Context(), g, o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.dir, "dir", "", "make the image from this `directory`")
	f.StringVar(&o.oci, "oci", "", "make the image from this OCI image layout or tarball (`path`)")
	f.BoolVar(&o.debootstrap, "debootstrap", false, "bootstrap the default Debian image into the cache (the default)")
	f.StringVar(&o.out, "out", "", "write the image to this `file` (required with --dir and --oci)")
	return c
}

type rootfsOptions struct {
	dir, oci, out string
	debootstrap   bool
}

func imageRootfs(ctx context.Context, g *globals, o rootfsOptions) error {
	sources := 0
	for _, set := range []bool{o.dir != "", o.oci != "", o.debootstrap} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		return usagef("image rootfs: give at most one of --dir, --oci and --debootstrap")
	}
	if (o.dir != "" || o.oci != "") && o.out == "" {
		return usagef("image rootfs: --out is required with --dir and --oci")
	}
	opts := rootfs.Ext4Options{Label: rootfs.DefaultLabel}

	switch {
	case o.dir != "":
		if err := rootfs.MakeExt4(ctx, o.dir, o.out, opts); err != nil {
			return err
		}
		return g.printFields("rootfs", o.out)

	case o.oci != "":
		tmp, err := os.MkdirTemp(filepath.Dir(o.out), ".space-rootfs-")
		if err != nil {
			return fmt.Errorf("unpack %s: %w", o.oci, err)
		}
		defer os.RemoveAll(tmp)
		tree := filepath.Join(tmp, "tree")
		cfg, err := rootfs.UnpackOCI(ctx, o.oci, tree)
		if err != nil {
			return err
		}
		if err := rootfs.MakeExt4(ctx, tree, o.out, opts); err != nil {
			return err
		}
		return g.printFields(
			"rootfs", o.out,
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
		p, err := rootfs.Default(ctx, cache, g.logger())
		if err != nil {
			return err
		}
		if o.out == "" {
			return g.printFields("rootfs", p)
		}
		if err := reflink.Copy(ctx, p, o.out); err != nil {
			return err
		}
		return g.printFields("rootfs", o.out)
	}
}

func newImageBuildCmd(g *globals) *cobra.Command {
	var agent string
	c := &cobra.Command{
		Use:   "build",
		Short: "Build kernel, initramfs and default rootfs; print their paths",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkAgent(agent); err != nil {
				return err
			}
			cache, err := g.openCache()
			if err != nil {
				return err
			}
			art, err := imagebuild.Build(cmd.Context(), imagebuild.Config{Cache: cache, AgentPath: agent, Log: g.logger()})
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
		},
	}
	agentFlag(c.Flags(), &agent)
	return c
}

// agentFlag registers --agent, defaulting to space-agent next to the
// running executable (where make build puts it).
func agentFlag(fs *pflag.FlagSet, p *string) {
	def := ""
	if exe, err := os.Executable(); err == nil {
		def = filepath.Join(filepath.Dir(exe), "space-agent")
	}
	fs.StringVar(p, "agent", def, "the static space-agent `binary` to put in the initramfs")
}

// guestKernelFlag registers --guest-kernel: the guests' kernel from a
// directory (the worker image ships one in /usr/lib/space/kernel) instead
// of the apt index.
func guestKernelFlag(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, "guest-kernel", "", "`directory` holding the guests' kernel as the worker image ships it (default: the apt index's current cloud kernel, fetched into the cache)")
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
