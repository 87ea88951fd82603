package worker

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"

	"space/api"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/httpapi"
)

// handleStatFile describes a path, not following a final symlink.
func handleStatFile(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	p, err := guestPath(r)
	if err != nil {
		return err
	}
	fi, err := a.Stat(r.Context(), p)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, fileInfo(path.Clean(p), fi))
	return nil
}

// handleMakeDir makes a directory: 201 when it made it, 200 when it was
// there already; a non-directory in its place is a conflict.
func handleMakeDir(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	var req api.MakeDir
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	p, err := checkPath("path", req.Path)
	if err != nil {
		return err
	}
	p = path.Clean(p)
	parents := req.Parents == nil || *req.Parents
	ctx := r.Context()
	args := proto.MkdirArgs{Path: p}
	if req.Owner != "" && req.Owner != "root" {
		u, err := lookupUser(ctx, a, req.Owner)
		if err != nil {
			return err
		}
		args.UID, args.GID = &u.uid, &u.gid
	}
	// One mkdir without parents tells whether this call made it.
	created := true
	err = a.MkdirArgs(ctx, args)
	if errors.Is(err, errkind.NotFound) && parents {
		args.Parents = true
		err = a.MkdirArgs(ctx, args)
	}
	if errors.Is(err, errkind.Conflict) {
		created, err = false, nil
	}
	if err != nil {
		return err
	}
	fi, err := a.Stat(ctx, p)
	if err != nil {
		return err
	}
	if fi.Type != proto.FileDir {
		return fmt.Errorf("mkdir %s: a %s is in its place: %w", p, fi.Type, errkind.Conflict)
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	httpapi.WriteJSON(rw, status, fileInfo(p, fi))
	return nil
}

// handleMove renames a path, making the destination's missing parents.
func handleMove(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	var req api.Move
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	from, err := checkPath("from", req.From)
	if err != nil {
		return err
	}
	to, err := checkPath("to", req.To)
	if err != nil {
		return err
	}
	from, to = path.Clean(from), path.Clean(to)
	ctx := r.Context()
	// A missing source is not found before anything is made.
	if _, err := a.Stat(ctx, from); err != nil {
		return err
	}
	if dir := path.Dir(to); dir != "/" {
		if err := a.Mkdir(ctx, dir, 0, true); err != nil {
			return err
		}
	}
	if err := a.Rename(ctx, from, to); err != nil {
		return err
	}
	fi, err := a.Stat(ctx, to)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(rw, http.StatusOK, fileInfo(to, fi))
	return nil
}

// handleWatchFiles streams the changes below a directory as NDJSON
// (api.FileEvent), from a start line once it is watched, until the
// client goes away or the directory itself goes. A missing path is
// answered 404, a file 400, before the stream starts.
func handleWatchFiles(rw http.ResponseWriter, r *http.Request, a *client.Client) error {
	p, err := guestPath(r)
	if err != nil {
		return err
	}
	recursive, err := boolParam(r, "recursive")
	if err != nil {
		return err
	}
	root := path.Clean(p)
	ctx := r.Context()
	fi, err := a.Stat(ctx, root)
	if err != nil {
		return err
	}
	if fi.Type != proto.FileDir && fi.Type != proto.FileSymlink { // a symlink's target is the agent's to check
		return httpapi.Invalid("path", "%s is a %s, not a directory", root, fi.Type)
	}
	w, err := a.Watch(ctx, proto.WatchArgs{Path: root, Recursive: recursive})
	if err != nil {
		return err
	}
	defer w.Close()
	out := newNDJSON(rw)
	close(out.started)
	if err := out.sendJSON(api.FileEvent{Type: api.FileEventStart, Path: root}); err != nil {
		return nil // the client went
	}
	for {
		ev, err := w.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if ctx.Err() == nil {
				body := httpapi.Body(err)
				out.sendJSON(api.FileEvent{Type: api.FileEventError, Error: &body})
			}
			return nil
		}
		if err := out.sendJSON(fileEvent(root, ev)); err != nil {
			return nil
		}
	}
}

// fileEvent is the API's form of an event below the watched directory
// root.
func fileEvent(root string, ev proto.WatchEvent) api.FileEvent {
	out := api.FileEvent{Type: api.FileEventType(ev.Op)}
	if ev.Op == proto.WatchOverflow {
		return out
	}
	out.Path = ev.Path
	switch {
	case ev.Path == root:
		out.Name = "."
	case root == "/":
		out.Name = ev.Path[1:]
	default:
		out.Name = ev.Path[len(root)+1:]
	}
	if ev.Info != nil {
		e := fileInfo(ev.Path, *ev.Info)
		out.Entry = &e
	}
	return out
}
