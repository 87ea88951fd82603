package e2b

import (
	"context"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"space/api"
	"space/client"
)

// entryInfo is envd's EntryInfo in protobuf's JSON form (int64 as a
// string, the time in RFC 3339).
type entryInfo struct {
	Name          string            `json:"name"`
	Type          string            `json:"type"`
	Path          string            `json:"path"`
	Size          string            `json:"size"`
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  string            `json:"modifiedTime,omitempty"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// entryOf converts a SPACE FileInfo of the entry at p. Mode is Go's
// fs.FileMode (type bits and permissions), as envd sends it.
func entryOf(p string, fi api.FileInfo) entryInfo {
	// mode is the permission bits alone, as envd reports it; permissions
	// spells them out with the type, as ls does.
	mode := fs.FileMode(fi.Mode) & fs.ModePerm
	typ, kind := "FILE_TYPE_UNSPECIFIED", fs.FileMode(0)
	switch fi.Type {
	case "file":
		typ = "FILE_TYPE_FILE"
	case "dir":
		typ, kind = "FILE_TYPE_DIRECTORY", fs.ModeDir
	case "symlink":
		typ, kind = "FILE_TYPE_SYMLINK", fs.ModeSymlink
	}
	e := entryInfo{
		Name: path.Base(p), Type: typ, Path: p, Size: strconv.FormatInt(fi.Size, 10),
		Mode: uint32(mode), Permissions: (kind | mode).String(),
		Owner: fi.Owner, Group: fi.Group, Metadata: fromSpaceMetadata(fi.Metadata),
	}
	if !fi.ModTime.IsZero() {
		e.ModifiedTime = fi.ModTime.UTC().Format(time.RFC3339Nano)
	}
	if fi.Type == "symlink" {
		// envd reports where a link points as an absolute path.
		t := fi.Target
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		e.SymlinkTarget = &t
	}
	return e
}

type pathRequest struct {
	Path string `json:"path"`
}

// fsUnary serves a unary filesystem call: decode req, resolve the path
// that pathOf names, answer what do returns.
func fsUnary[T any](w http.ResponseWriter, r *http.Request, c *envdCall, pathOf func(*T) *string, do func(context.Context, string, *T) (any, error)) {
	var req T
	if err := readUnary(r, &req); err != nil {
		writeRPCError(w, err)
		return
	}
	p, err := c.absPath(r.Context(), *pathOf(&req))
	if err != nil {
		writeRPCError(w, err)
		return
	}
	out, err := do(r.Context(), p, &req)
	if err != nil {
		writeRPCError(w, fsError(err, p))
		return
	}
	writeUnary(w, out)
}

// fsError words a missing path as envd does.
func fsError(err error, p string) error {
	if client.IsNotFound(err) {
		return notFoundf("path not found: %s", p)
	}
	return err
}

func (s *Server) fsStat(w http.ResponseWriter, r *http.Request, c *envdCall) {
	fsUnary(w, r, c, func(q *pathRequest) *string { return &q.Path },
		func(ctx context.Context, p string, _ *pathRequest) (any, error) {
			fi, err := c.sandbox.Stat(ctx, c.id, p)
			if err != nil {
				return nil, err
			}
			return map[string]entryInfo{"entry": entryOf(p, fi)}, nil
		})
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

// maxListEntries bounds a ListDir reply.
const maxListEntries = 100000

func (s *Server) fsListDir(w http.ResponseWriter, r *http.Request, c *envdCall) {
	fsUnary(w, r, c, func(q *listDirRequest) *string { return &q.Path },
		func(ctx context.Context, p string, q *listDirRequest) (any, error) {
			depth := max(q.Depth, 1)
			entries := []entryInfo{}
			var walk func(dir string, level uint32) error
			walk = func(dir string, level uint32) error {
				l, err := c.sandbox.ListFiles(ctx, c.id, dir)
				if err != nil {
					return err
				}
				// By name, each directory before its children: the order
				// of envd's walk.
				slices.SortFunc(l.Entries, func(a, b api.FileInfo) int { return strings.Compare(a.Name, b.Name) })
				for _, fi := range l.Entries {
					if len(entries) >= maxListEntries {
						return newRPCError("resource_exhausted", "more than %d entries under %s: list with a smaller depth", maxListEntries, p)
					}
					child := path.Join(dir, fi.Name)
					entries = append(entries, entryOf(child, fi))
					if fi.Type == "dir" && level < depth {
						if err := walk(child, level+1); err != nil && !client.IsNotFound(err) {
							return err
						}
					}
				}
				return nil
			}
			if err := walk(p, 1); err != nil {
				return nil, err
			}
			return map[string][]entryInfo{"entries": entries}, nil
		})
}

func (s *Server) fsMakeDir(w http.ResponseWriter, r *http.Request, c *envdCall) {
	fsUnary(w, r, c, func(q *pathRequest) *string { return &q.Path },
		func(ctx context.Context, p string, _ *pathRequest) (any, error) {
			user, _ := c.userAndHome(ctx)
			fi, created, err := c.sandbox.MakeDir(ctx, c.id, api.MakeDir{Path: p, Owner: user})
			if err != nil {
				return nil, err
			}
			if !created {
				return nil, newRPCError("already_exists", "directory already exists: %s", p)
			}
			return map[string]entryInfo{"entry": entryOf(p, fi)}, nil
		})
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

func (s *Server) fsMove(w http.ResponseWriter, r *http.Request, c *envdCall) {
	fsUnary(w, r, c, func(q *moveRequest) *string { return &q.Source },
		func(ctx context.Context, src string, q *moveRequest) (any, error) {
			dst, err := c.absPath(ctx, q.Destination)
			if err != nil {
				return nil, err
			}
			fi, err := c.sandbox.Move(ctx, c.id, src, dst)
			if err != nil {
				return nil, err
			}
			return map[string]entryInfo{"entry": entryOf(dst, fi)}, nil
		})
}

func (s *Server) fsRemove(w http.ResponseWriter, r *http.Request, c *envdCall) {
	fsUnary(w, r, c, func(q *pathRequest) *string { return &q.Path },
		func(ctx context.Context, p string, _ *pathRequest) (any, error) {
			// Like envd's os.RemoveAll, removing what is not there succeeds.
			err := c.sandbox.RemoveFile(ctx, c.id, p, client.RemoveOptions{Recursive: true})
			if client.IsNotFound(err) {
				err = nil
			}
			return struct{}{}, err
		})
}
