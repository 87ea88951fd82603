package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

func newFileCmd(g *globals) *cobra.Command {
	return newGroupCmd("file", "Copy, list and remove files in a sandbox",
		newFilePutCmd(g), newFileGetCmd(g), newFileListCmd(g), newFileRemoveCmd(g))
}

func newFilePutCmd(g *globals) *cobra.Command {
	var (
		mode  string
		mkdir bool
	)
	c := &cobra.Command{
		Use:   "put ID LOCAL REMOTE",
		Short: "Copy a local file (- for stdin) into a sandbox",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, local, remote := args[0], args[1], args[2]
			opts := client.WriteOptions{Mkdir: mkdir}
			if mode != "" {
				m, err := strconv.ParseUint(mode, 8, 32)
				if err != nil || m > 0o7777 {
					return usagef("--mode %q: want octal permission bits, e.g. 0644", mode)
				}
				opts.Mode = fs.FileMode(m)
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			r := g.stdin
			if local != "-" {
				f, err := os.Open(local)
				if err != nil {
					return err
				}
				defer f.Close()
				fi, err := f.Stat()
				if err != nil {
					return err
				}
				if fi.IsDir() {
					return fmt.Errorf("put %s: is a directory", local)
				}
				if opts.Mode == 0 {
					opts.Mode = fi.Mode().Perm()
				}
				r = f
			}
			_, err = cl.WriteFile(cmd.Context(), id, remote, r, opts)
			return err
		},
	}
	c.Flags().StringVar(&mode, "mode", "", "permission bits in octal, e.g. 0644 (default: the local file's, or the server's for stdin)")
	c.Flags().BoolVar(&mkdir, "mkdir", false, "create missing parent directories")
	return c
}

func newFileGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID REMOTE [LOCAL|-]",
		Short: "Copy a file out of a sandbox (to stdout without LOCAL or with -)",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			local := "-"
			if len(args) == 3 {
				local = args[2]
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			if local == "-" {
				_, err := cl.ReadFile(cmd.Context(), args[0], args[1], g.stdout)
				return err
			}
			return getFile(cmd.Context(), cl, args[0], args[1], local)
		},
	}
}

// getFile copies remote to local (or into the directory local) so that
// local appears only complete, with the remote file's permission bits.
func getFile(ctx context.Context, cl *client.Client, id, remote, local string) error {
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(remote))
	}
	f, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".tmp-")
	if err != nil {
		return err
	}
	mode, err := cl.ReadFile(ctx, id, remote, f)
	if mode == 0 {
		mode = 0o644
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(f.Name(), local)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

func newFileListCmd(g *globals) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:     "ls ID PATH",
		Aliases: []string{"list"},
		Short:   "List a directory in a sandbox",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			l, err := cl.ListFiles(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if output == "json" {
				l.Entries = nonNil(l.Entries)
				return g.printJSON(l)
			}
			return g.printTable([]string{"MODE", "SIZE", "MODIFIED", "NAME"}, func(row func(...any)) {
				for _, e := range l.Entries {
					name := e.Name
					if e.Target != "" {
						name += " -> " + e.Target
					}
					row(fileMode(e), e.Size, e.ModTime.Local().Format(time.DateTime), name)
				}
			})
		},
	}
	outputFlag(c.Flags(), &output)
	return c
}

// fileMode shows an entry's type and permissions like ls -l.
func fileMode(e api.FileInfo) string {
	m := fs.FileMode(e.Mode) & fs.ModePerm
	switch e.Type {
	case "dir":
		m |= fs.ModeDir
	case "symlink":
		m |= fs.ModeSymlink
	case "other":
		m |= fs.ModeIrregular
	}
	return m.String()
}

func newFileRemoveCmd(g *globals) *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "rm ID PATH",
		Short: "Remove a file or directory in a sandbox",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.RemoveFile(cmd.Context(), args[0], args[1], client.RemoveOptions{Recursive: recursive})
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove a directory and everything in it")
	return c
}
