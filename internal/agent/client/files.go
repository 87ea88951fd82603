package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/errkind"
)

// growth is how far past its announced size a file read may go: a file may
// grow while it is read, by at most the one read the agent had under way
// (a ring slot at most).
const growth = ring.SlotSize

// ReadFile streams the guest file at path into w and returns its info. The
// bytes written never exceed the size the agent announced; an agent that
// sends more is a protocol error.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (proto.FileInfo, error) {
	return c.ReadFileRange(ctx, proto.ReadArgs{Path: path}, w)
}

// ReadFileRange streams the part of a guest file that a selects into w
// and returns the whole file's info, with Size the bytes written. Agents
// older than ranges refuse an Offset or Length (invalid_argument).
func (c *Client) ReadFileRange(ctx context.Context, a proto.ReadArgs, w io.Writer) (proto.FileInfo, error) {
	var info proto.FileInfo
	var done func()
	a.Pages, done = c.pagesRead()
	defer done()
	got, err := c.readStream(ctx, proto.OpFileRead, a, a.Pages, &info, w, func() (int64, error) {
		if info.Size < 0 {
			return 0, protocolErr(proto.OpFileRead, "negative size")
		}
		// A file may grow while it is read, by at most the one read the
		// agent had under way; never unbounded.
		limit := max(info.Size-a.Offset, 0) + growth
		if a.Length > 0 {
			limit = a.Length
		}
		return limit, nil
	})
	info.Size = got
	return info, err
}

// TarRead streams the guest directory at path into w as a tar archive.
// It returns the archive's size.
func (c *Client) TarRead(ctx context.Context, path string, w io.Writer) (int64, error) {
	var v struct{}
	a := proto.PathArgs{Path: path}
	var done func()
	a.Pages, done = c.pagesRead()
	defer done()
	return c.readStream(ctx, proto.OpTarRead, a, a.Pages, &v, w, func() (int64, error) {
		return math.MaxInt64, nil
	})
}

// pagesRead reports whether a read may take its bytes in place, and
// what to call once it is over: at most len(pageReads) do at once.
func (c *Client) pagesRead() (bool, func()) {
	if c.PageReads() {
		select {
		case pageReads <- struct{}{}:
			return true, func() { <-pageReads }
		default: // many reads at once: this one goes through the ring
		}
	}
	return false, func() {}
}

// readStream calls op, decodes its result into res, then copies its data
// frames into w until the end frame, at most limit() bytes (limit is
// asked once res is known); with pages it takes pages references too. It
// returns the bytes written.
func (c *Client) readStream(ctx context.Context, op proto.Op, args any, pages bool, res any, w io.Writer, limit func() (int64, error)) (int64, error) {
	s, release, err := c.open(ctx, op, args)
	if err != nil {
		return 0, err
	}
	defer release()
	f, err := s.r.Next()
	if err != nil {
		return 0, c.callErr(ctx, op, err)
	}
	if err := decodeResult(op, f, 0, res); err != nil {
		return 0, err
	}
	max, err := limit()
	if err != nil {
		return 0, err
	}
	var got int64
	ended := false
	defer func() {
		if !ended {
			c.drain(s)
		}
	}()
	for {
		f, err := s.r.Next()
		if err != nil {
			ended = true
			return got, c.callErr(ctx, op, err)
		}
		switch f.Type {
		case proto.TypeData:
			if got+int64(len(f.Payload)) > max {
				return got, protocolErr(op, "more data than the %d bytes asked for or announced", max)
			}
			if _, err := w.Write(f.Payload); err != nil {
				return got, fmt.Errorf("%s: write: %w", op, err)
			}
			got += int64(len(f.Payload))
		case proto.TypeDataRef:
			n, err := c.copyRef(op, f, proto.TypeData, w, max-got)
			if err != nil {
				return got, err
			}
			got += int64(n)
		case proto.TypePagesRef:
			if !pages {
				return got, protocolErr(op, "pages reference not asked for")
			}
			n, err := c.copyPages(ctx, op, s, f, w, max-got)
			if err != nil {
				return got, err
			}
			got += int64(n)
		case proto.TypeEnd:
			ended = true
			return got, nil
		default:
			var v struct{}
			if err := decodeResult(op, f, 0, &v); err != nil {
				return got, err
			}
			return got, protocolErr(op, "unexpected result frame")
		}
	}
}

// WriteFile streams r into the guest file at path, replacing it
// atomically, or with args.At appending in place. It returns the bytes
// written and, with args.At, the file's size after them. An agent that
// predates args.Xattrs gives FailedPrecondition.
func (c *Client) WriteFile(ctx context.Context, args proto.WriteArgs, r io.Reader) (proto.WriteResult, error) {
	var res proto.WriteResult
	if err := checkXattrs(args.Xattrs); err != nil {
		return res, fmt.Errorf("%s: %w", proto.OpFileWrite, err)
	}
	err := c.writeStream(ctx, proto.OpFileWrite, args, r, &res)
	// The arguments are valid, so invalid_argument can only mean the
	// agent did not know a field of them.
	if len(args.Xattrs) > 0 && errors.Is(err, errkind.InvalidArgument) {
		return res, fmt.Errorf("agent %q does not support metadata (built before it): %v: %w",
			c.agentVersion, err, errkind.FailedPrecondition)
	}
	return res, err
}

// checkXattrs checks the extended attributes a write asks for.
func checkXattrs(xattrs map[string]string) error {
	if len(xattrs) > proto.MaxXattrs {
		return fmt.Errorf("%d metadata entries, want at most %d: %w", len(xattrs), proto.MaxXattrs, errkind.InvalidArgument)
	}
	for k, v := range xattrs {
		if err := proto.CheckXattr(k, v); err != nil {
			return err
		}
	}
	return nil
}

// TarWrite unpacks the tar archive r into the guest directory args.Path.
// The agent moves the entries in only once the whole archive arrived, so
// a failed call leaves the directory as it was.
func (c *Client) TarWrite(ctx context.Context, args proto.TarWriteArgs, r io.Reader) (proto.TarResult, error) {
	var res proto.TarResult
	err := c.writeStream(ctx, proto.OpTarWrite, args, r, &res)
	return res, err
}

// writeStream calls op, sends r's bytes and an end frame, and decodes the
// agent's result into res.
func (c *Client) writeStream(ctx context.Context, op proto.Op, args any, r io.Reader, res any) error {
	s, release, err := c.open(ctx, op, args)
	if err != nil {
		return err
	}
	defer release()
	// The agent may refuse early (bad path): read its reply while sending.
	replied := make(chan error, 1)
	go func() {
		f, err := s.r.Next()
		if err != nil {
			replied <- c.callErr(ctx, op, err)
			return
		}
		replied <- decodeResult(op, f, 0, res)
	}()
	sendErr := make(chan error, 1)
	go func() {
		if err := c.sendFrom(ctx, op, s, r); err != nil {
			sendErr <- err
			return
		}
		sendErr <- s.write(proto.TypeEnd, nil)
	}()
	select {
	case err := <-replied:
		release() // stop a sender still blocked on the window
		<-sendErr
		return err
	case err := <-sendErr:
		if err != nil {
			release()
			<-replied
			if ctx.Err() != nil {
				return c.callErr(ctx, op, err)
			}
			return err
		}
		return <-replied
	}
}

// Stat describes the guest path (symlinks are not followed).
func (c *Client) Stat(ctx context.Context, path string) (proto.FileInfo, error) {
	return c.stat(ctx, proto.PathArgs{Path: path})
}

// StatSettled is Stat once the in-place writes to path under way have
// ended (proto.PathArgs.Settle): a resumable upload's size to go on from.
func (c *Client) StatSettled(ctx context.Context, path string) (proto.FileInfo, error) {
	return c.stat(ctx, proto.PathArgs{Path: path, Settle: true})
}

func (c *Client) stat(ctx context.Context, args proto.PathArgs) (proto.FileInfo, error) {
	path := args.Path
	var info proto.FileInfo
	// A file's extended attributes may take it past MaxControl.
	if err := c.simpleMax(ctx, proto.OpFileStat, args, proto.MaxFrame, &info); err != nil {
		return proto.FileInfo{}, err
	}
	if err := checkName(info.Name); err != nil && path != "/" {
		return proto.FileInfo{}, protocolErr(proto.OpFileStat, "%v", err)
	}
	if err := checkInfo(info); err != nil {
		return proto.FileInfo{}, protocolErr(proto.OpFileStat, "%v", err)
	}
	return info, nil
}

// checkInfo rejects what FileInfo fields other than the name may not
// hold.
func checkInfo(info proto.FileInfo) error {
	if len(info.Xattrs) > proto.MaxXattrs {
		return fmt.Errorf("%d extended attributes, more than %d", len(info.Xattrs), proto.MaxXattrs)
	}
	for k, v := range info.Xattrs {
		if err := proto.CheckXattr(k, v); err != nil {
			return err
		}
	}
	if len(info.Owner) > 64 || len(info.Group) > 64 || len(info.Target) > 4096 {
		return errors.New("owner, group or symlink target too long")
	}
	return nil
}

// maxListEntries bounds a listing the host accepts from a guest.
const maxListEntries = 1 << 20

// List returns the entries of a guest directory (at most limit, 0 = all up
// to a million).
func (c *Client) List(ctx context.Context, path string, limit int) ([]proto.FileInfo, error) {
	op := proto.OpFileList
	ctx, cancel := unaryCtx(ctx)
	defer cancel()
	s, release, err := c.open(ctx, op, proto.ListArgs{Path: path, Limit: limit})
	if err != nil {
		return nil, err
	}
	defer release()
	defer s.readUntil(ctx)()
	max := maxListEntries
	if limit > 0 && limit < max {
		max = limit
	}
	var out []proto.FileInfo
	for {
		f, err := s.r.Next()
		if err != nil {
			return nil, c.callErr(ctx, op, err)
		}
		if f.Type == proto.TypeEnd {
			return out, nil
		}
		var b proto.ListBatch
		if err := decodeResult(op, f, proto.MaxFrame, &b); err != nil {
			return nil, err
		}
		for _, e := range b.Entries {
			if err := checkName(e.Name); err != nil {
				return nil, protocolErr(op, "%v", err)
			}
			if err := checkInfo(e); err != nil {
				return nil, protocolErr(op, "%v", err)
			}
		}
		out = append(out, b.Entries...)
		if len(out) > max {
			return nil, protocolErr(op, "more than %d entries", max)
		}
	}
}

// checkName rejects entry names that are not one path element.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 255 {
		return fmt.Errorf("bad entry name %.64q", name)
	}
	return nil
}

// Mkdir creates a guest directory (and its parents when parents is set).
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32, parents bool) error {
	return c.MkdirArgs(ctx, proto.MkdirArgs{Path: path, Mode: mode, Parents: parents})
}

// MkdirArgs creates a guest directory as args say (an owner too).
func (c *Client) MkdirArgs(ctx context.Context, args proto.MkdirArgs) error {
	return c.simple(ctx, proto.OpFileMkdir, args, &proto.Empty{})
}

// Remove removes a guest path (a whole tree when recursive is set).
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	return c.simple(ctx, proto.OpFileRemove, proto.RemoveArgs{Path: path, Recursive: recursive}, &proto.Empty{})
}

// Rename renames a guest path.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	return c.simple(ctx, proto.OpFileRename, proto.RenameArgs{From: from, To: to}, &proto.Empty{})
}
