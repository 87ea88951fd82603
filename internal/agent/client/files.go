package client

import (
	"context"
	"fmt"
	"io"
	"strings"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
)

// growth is how far past its announced size a file read may go: a file may
// grow while it is read, by at most the one read the agent had under way
// (a ring slot at most).
const growth = ring.SlotSize

// ReadFile streams the guest file at path into w and returns its info. The
// bytes written never exceed the size the agent announced; an agent that
// sends more is a protocol error.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (proto.FileInfo, error) {
	op := proto.OpFileRead
	s, release, err := c.open(ctx, op, proto.PathArgs{Path: path})
	if err != nil {
		return proto.FileInfo{}, err
	}
	defer release()
	f, err := s.r.Next()
	if err != nil {
		return proto.FileInfo{}, c.callErr(ctx, op, err)
	}
	var info proto.FileInfo
	if err := decodeResult(op, f, 0, &info); err != nil {
		return proto.FileInfo{}, err
	}
	if info.Size < 0 {
		return proto.FileInfo{}, protocolErr(op, "negative size")
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
			return info, c.callErr(ctx, op, err)
		}
		switch f.Type {
		case proto.TypeData:
			// A file may grow while it is read; allow what was announced
			// plus one chunk, never unbounded.
			if got+int64(len(f.Payload)) > info.Size+growth {
				return info, protocolErr(op, "more data than the announced %d bytes", info.Size)
			}
			if _, err := w.Write(f.Payload); err != nil {
				return info, fmt.Errorf("%s: write: %w", op, err)
			}
			got += int64(len(f.Payload))
		case proto.TypeDataRef:
			n, err := c.copyRef(op, f, proto.TypeData, w, info.Size+growth-got)
			if err != nil {
				return info, err
			}
			got += int64(n)
		case proto.TypeEnd:
			info.Size = got
			ended = true
			return info, nil
		default:
			var v struct{}
			if err := decodeResult(op, f, 0, &v); err != nil {
				return info, err
			}
			return info, protocolErr(op, "unexpected result frame")
		}
	}
}

// WriteFile streams r into the guest file at path, replacing it atomically.
func (c *Client) WriteFile(ctx context.Context, args proto.WriteArgs, r io.Reader) (int64, error) {
	op := proto.OpFileWrite
	s, release, err := c.open(ctx, op, args)
	if err != nil {
		return 0, err
	}
	defer release()
	// The agent may refuse early (bad path): read its reply while sending.
	replied := make(chan error, 1)
	var res proto.WriteResult
	go func() {
		f, err := s.r.Next()
		if err != nil {
			replied <- c.callErr(ctx, op, err)
			return
		}
		replied <- decodeResult(op, f, 0, &res)
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
		if err != nil {
			return 0, err
		}
		return res.Size, nil
	case err := <-sendErr:
		if err != nil {
			release()
			<-replied
			if ctx.Err() != nil {
				return 0, c.callErr(ctx, op, err)
			}
			return 0, err
		}
		if err := <-replied; err != nil {
			return 0, err
		}
		return res.Size, nil
	}
}

// Stat describes the guest path (symlinks are not followed).
func (c *Client) Stat(ctx context.Context, path string) (proto.FileInfo, error) {
	var info proto.FileInfo
	if err := c.simple(ctx, proto.OpFileStat, proto.PathArgs{Path: path}, &info); err != nil {
		return proto.FileInfo{}, err
	}
	if err := checkName(info.Name); err != nil && path != "/" {
		return proto.FileInfo{}, protocolErr(proto.OpFileStat, "%v", err)
	}
	return info, nil
}

// maxListEntries bounds a listing the host accepts from a guest.
const maxListEntries = 1 << 20

// List returns the entries of a guest directory (at most limit, 0 = all up
// to a million).
func (c *Client) List(ctx context.Context, path string, limit int) ([]proto.FileInfo, error) {
	op := proto.OpFileList
	s, release, err := c.open(ctx, op, proto.ListArgs{Path: path, Limit: limit})
	if err != nil {
		return nil, err
	}
	defer release()
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
	return c.simple(ctx, proto.OpFileMkdir, proto.MkdirArgs{Path: path, Mode: mode, Parents: parents}, &proto.Empty{})
}

// Remove removes a guest path (a whole tree when recursive is set).
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	return c.simple(ctx, proto.OpFileRemove, proto.RemoveArgs{Path: path, Recursive: recursive}, &proto.Empty{})
}

// Rename renames a guest path.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	return c.simple(ctx, proto.OpFileRename, proto.RenameArgs{From: from, To: to}, &proto.Empty{})
}
