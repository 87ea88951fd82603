package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
	"space/internal/agent/tarball"
)

func newFileCmd(g *globals) *cobra.Command {
	return newGroupCmd("file", "Copy, list, move, watch and remove files in a sandbox",
		newFilePutCmd(g), newFileGetCmd(g), newFileListCmd(g), newFileStatCmd(g), newFileMkdirCmd(g),
		newFileMoveCmd(g), newFileWatchCmd(g), newFileRemoveCmd(g))
}

func newFilePutCmd(g *globals) *cobra.Command {
	var (
		mode, owner      string
		metadata         []string
		mkdir, recursive bool
	)
	c := &cobra.Command{
		Use:   "put ID LOCAL REMOTE",
		Short: "Copy a local file (- for stdin) or, with -r, a directory into a sandbox",
		Long: `Copy a local file (- for stdin) into a sandbox. The remote file appears
whole or not at all. Files over 64 MiB go as a resumable upload: a broken
connection is resumed from where it broke.

With -r, LOCAL is a directory (or - for a tar archive on stdin) whose
tree is unpacked into the directory REMOTE (created when missing); the
entries go in only once the whole tree arrived.`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, local, remote := args[0], args[1], args[2]
			if recursive {
				if mode != "" || owner != "" || len(metadata) > 0 {
					return usagef("--mode, --owner and --metadata are for single files; a tree keeps its modes and owners")
				}
				return putTree(cmd.Context(), g, id, local, remote, mkdir)
			}
			opts := client.WriteOptions{Mkdir: mkdir, Owner: owner}
			for _, kv := range metadata {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usagef("--metadata %q: want KEY=VALUE", kv)
				}
				if opts.Metadata == nil {
					opts.Metadata = map[string]string{}
				}
				opts.Metadata[k] = v
			}
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
	c.Flags().StringVar(&owner, "owner", "", "the `user` who owns the file (a name in the sandbox, or a uid; default root)")
	c.Flags().StringArrayVar(&metadata, "metadata", nil, "set metadata (a user extended attribute) `KEY=VALUE` on the file; repeatable")
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy a directory tree (LOCAL a directory, or - for a tar archive on stdin)")
	return c
}

// putTree sends the local directory (or a tar archive on stdin) into the
// sandbox's directory remote.
func putTree(ctx context.Context, g *globals, id, local, remote string, mkdir bool) error {
	cl, err := g.client()
	if err != nil {
		return err
	}
	var r io.Reader = g.stdin
	if local != "-" {
		if fi, err := os.Stat(local); err != nil {
			return err
		} else if !fi.IsDir() {
			return usagef("put -r %s: not a directory", local)
		}
		pr, pw := io.Pipe()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			bw := bufio.NewWriterSize(pw, 1<<20)
			_, err := tarball.Pack(ctx, local, bw)
			if err == nil {
				err = bw.Flush()
			}
			pw.CloseWithError(err)
		}()
		defer pr.Close()
		r = pr
	}
	_, err = cl.WriteTar(ctx, id, remote, r, mkdir)
	return err
}

func newFileGetCmd(g *globals) *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "get ID REMOTE [LOCAL|-]",
		Short: "Copy a file or, with -r, a directory out of a sandbox (to stdout without LOCAL or with -)",
		Long: `Copy a file out of a sandbox, to stdout without LOCAL or with -. A local
file appears whole or not at all; a broken connection is resumed where it
broke, as long as the remote file has not changed.

With -r, REMOTE is a directory: its tree goes to stdout as a tar archive,
or is unpacked into the local directory LOCAL (created when missing),
whose entries go in only once the whole tree arrived.

What comes out of a sandbox is treated as hostile: local files and
directories belong to the user running this command, never to the owner
the sandbox gave them, and keep at most the permission bits 0755 (no
setuid, setgid or sticky bit, no group or other write). Symlinks are
copied as links and never followed or written through; fifos and device
nodes are left out, with a warning. A tar archive on stdout is passed on
as the sandbox sent it: unpack it with tar --no-same-owner
--no-same-permissions (or Python's tarfile filter "data").`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			local := "-"
			if len(args) == 3 {
				local = args[2]
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			if recursive {
				return getTree(cmd.Context(), cl, g, args[0], args[1], local)
			}
			if local == "-" {
				_, err := cl.ReadFile(cmd.Context(), args[0], args[1], g.stdout)
				return err
			}
			return getFile(cmd.Context(), cl, args[0], args[1], local)
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy a directory tree (to stdout as a tar archive without LOCAL or with -)")
	return c
}

// getTree copies the sandbox's directory remote to stdout as tar, or
// unpacks it into the local directory: into a staging directory beside
// it first, moved in once the whole archive arrived.
func getTree(ctx context.Context, cl *client.Client, g *globals, id, remote, local string) error {
	if local == "-" {
		return cl.ReadTar(ctx, id, remote, g.stdout)
	}
	local = filepath.Clean(local)
	staging, err := os.MkdirTemp(filepath.Dir(local), "."+filepath.Base(local)+".space-get-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	pr, pw := io.Pipe()
	unpacked := make(chan error, 1)
	var st tarball.Stats
	go func() {
		var err error
		st, err = tarball.Unpack(ctx, pr, staging, tarball.Options{}) // hostile: see newFileGetCmd
		pr.CloseWithError(err)
		unpacked <- err
	}()
	err = cl.ReadTar(ctx, id, remote, pw)
	pw.CloseWithError(err)
	if uerr := <-unpacked; err == nil {
		err = uerr
	}
	if err != nil {
		return err
	}
	if st.Skipped > 0 {
		fmt.Fprintf(g.stderr, "space: left out %d entries that are fifos or device nodes (or hard links to them): they are never made on the host\n", st.Skipped)
	}
	return tarball.Place(staging, local, tarball.Options{})
}

// getFile copies remote to local (or into the directory local) so that
// local appears only complete, with the remote file's permission bits as
// far as tarball.HostPerm allows.
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
		err = f.Chmod(mode & tarball.HostPerm)
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

func newFileStatCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:   "stat ID PATH",
		Short: "Describe a file in a sandbox (a symlink itself, not its target)",
		Args:  cobra.ExactArgs(2),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.FileInfo, error) {
		return cl.Stat(cmd.Context(), args[0], args[1])
	}, g.printFileInfo)
}

// printFileInfo prints a file's description as fields.
func (g *globals) printFileInfo(fi api.FileInfo) error {
	kv := []string{
		"path", fi.Path,
		"type", fi.Type,
		"size", strconv.FormatInt(fi.Size, 10),
		"permissions", fmt.Sprintf("%s (%04o)", fi.Permissions, fi.Mode),
		"owner", fmt.Sprintf("%s (%d)", fi.Owner, fi.UID),
		"group", fmt.Sprintf("%s (%d)", fi.Group, fi.GID),
		"modified", fi.ModTime.Local().Format(time.RFC3339),
		"target", fi.Target,
	}
	keys := make([]string, 0, len(fi.Metadata))
	for k := range fi.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		kv = append(kv, "metadata."+k, fmt.Sprintf("%q", fi.Metadata[k]))
	}
	return g.printFields(kv...)
}

func newFileMkdirCmd(g *globals) *cobra.Command {
	var (
		noParents bool
		owner     string
	)
	c := withOutput(g, &cobra.Command{
		Use:   "mkdir ID PATH",
		Short: "Make a directory in a sandbox, and its missing parents (no error when it exists)",
		Args:  cobra.ExactArgs(2),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.FileInfo, error) {
		parents := !noParents
		fi, _, err := cl.MakeDir(cmd.Context(), args[0], api.MakeDir{Path: args[1], Parents: &parents, Owner: owner})
		return fi, err
	}, func(api.FileInfo) error { return nil })
	c.Flags().BoolVar(&noParents, "no-parents", false, "fail when a parent is missing")
	c.Flags().StringVar(&owner, "owner", "", "`USER` (name or uid) who owns the directories made (default root)")
	return c
}

func newFileMoveCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:     "mv ID FROM TO",
		Aliases: []string{"move"},
		Short:   "Move (rename) a file or directory in a sandbox, making TO's missing parents",
		Args:    cobra.ExactArgs(3),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.FileInfo, error) {
		return cl.Move(cmd.Context(), args[0], args[1], args[2])
	}, func(api.FileInfo) error { return nil })
}

func newFileWatchCmd(g *globals) *cobra.Command {
	var (
		recursive bool
		output    string
	)
	c := &cobra.Command{
		Use:   "watch ID PATH",
		Short: "Print the changes below a directory in a sandbox as they happen",
		Long: `Print one line per change below the directory PATH until interrupted:
the event (create, write, remove, rename, chmod) and the path. "overflow"
says events were lost. With -o json, each line is the event's JSON
(api.FileEvent). The command ends when the directory itself goes.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			w, err := cl.WatchFiles(cmd.Context(), args[0], args[1], recursive)
			if err != nil {
				return err
			}
			defer w.Close()
			enc := json.NewEncoder(g.stdout)
			for {
				ev, err := w.Next()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil // interrupted
					}
					return err
				}
				if output == "json" {
					err = enc.Encode(ev)
				} else {
					_, err = fmt.Fprintln(g.stdout, strings.TrimSuffix(string(ev.Type)+" "+ev.Path, " "))
				}
				if err != nil {
					return err
				}
			}
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "watch the directories below it too, including new ones")
	outputFlag(c.Flags(), &output)
	return c
}
