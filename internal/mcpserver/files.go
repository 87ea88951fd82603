package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"space/client"
)

type pathIn struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path" jsonschema:"absolute path in the sandbox"`
}

type readOut struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding" jsonschema:"utf-8, or base64 for bytes that are not text"`
	Size     int    `json:"size"`
}

type writeIn struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path" jsonschema:"absolute path in the sandbox; missing directories are made"`
	Content   string `json:"content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64"`
	Mode      string `json:"mode,omitempty" jsonschema:"permission bits in octal, e.g. 755 (default 644)"`
}

type writeOut struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

type entry struct {
	Name    string    `json:"name"`
	Type    string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode" jsonschema:"permission bits in octal"`
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"`
}

type listFilesOut struct {
	Path    string  `json:"path"`
	Entries []entry `json:"entries"`
}

// errTooLarge stops a read at maxRead bytes.
var errTooLarge = errors.New("file too large")

// capped is a buffer that refuses to grow past maxRead. It has no
// ReadFrom, so that io.Copy goes through Write.
type capped struct{ b bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if c.b.Len()+len(p) > maxRead {
		return 0, errTooLarge
	}
	return c.b.Write(p)
}

func (s *Server) registerFiles(m *mcp.Server) {
	mcp.AddTool(m, &mcp.Tool{Name: "read_file", Description: "Read a file of a sandbox (at most 1 MiB): text as it is, other bytes as base64."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, readOut, error) {
			if err := s.own(ctx, in.SandboxID); err != nil {
				return nil, readOut{}, err
			}
			var b capped
			if _, err := s.c.ReadFile(ctx, in.SandboxID, in.Path, &b); err != nil {
				if errors.Is(err, errTooLarge) {
					return nil, readOut{}, fmt.Errorf("%s is larger than %d bytes: read a part with run_command (head -c, tail -c, sed -n)", in.Path, maxRead)
				}
				return nil, readOut{}, err
			}
			data := b.b.Bytes()
			out := readOut{Path: in.Path, Size: len(data), Content: string(data), Encoding: "utf-8"}
			if !utf8.Valid(data) {
				out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
			}
			return nil, out, nil
		})
	mcp.AddTool(m, &mcp.Tool{Name: "write_file", Description: "Write a file in a sandbox, replacing what was there."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, writeOut, error) {
			data := []byte(in.Content)
			switch in.Encoding {
			case "", "utf-8":
			case "base64":
				var err error
				if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
					return nil, writeOut{}, fmt.Errorf("content is not base64: %v", err)
				}
			default:
				return nil, writeOut{}, fmt.Errorf("encoding %q: want utf-8 or base64", in.Encoding)
			}
			var mode fs.FileMode
			if in.Mode != "" {
				m, err := strconv.ParseUint(in.Mode, 8, 32)
				if err != nil || m > 0o7777 {
					return nil, writeOut{}, fmt.Errorf("mode %q: want octal permission bits, e.g. 644", in.Mode)
				}
				mode = fs.FileMode(m)
			}
			if err := s.own(ctx, in.SandboxID); err != nil {
				return nil, writeOut{}, err
			}
			w, err := s.c.WriteFile(ctx, in.SandboxID, in.Path, bytes.NewReader(data), client.WriteOptions{Mode: mode, Mkdir: true})
			if err != nil {
				return nil, writeOut{}, err
			}
			return nil, writeOut{Path: w.Path, Size: w.Size}, nil
		})
	mcp.AddTool(m, &mcp.Tool{Name: "list_files", Description: "List a directory of a sandbox."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, listFilesOut, error) {
			if err := s.own(ctx, in.SandboxID); err != nil {
				return nil, listFilesOut{}, err
			}
			l, err := s.c.ListFiles(ctx, in.SandboxID, in.Path)
			if err != nil {
				return nil, listFilesOut{}, err
			}
			out := listFilesOut{Path: l.Path, Entries: []entry{}}
			for _, e := range l.Entries {
				out.Entries = append(out.Entries, entry{Name: e.Name, Type: e.Type, Size: e.Size,
					Mode: strconv.FormatUint(uint64(e.Mode), 8), ModTime: e.ModTime, Target: e.Target})
			}
			return nil, out, nil
		})
}
