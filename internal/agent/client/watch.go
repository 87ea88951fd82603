package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// Watcher is a watch of a guest directory (Watch). It is not safe for
// concurrent use.
type Watcher struct {
	c       *Client
	ctx     context.Context
	s       *stream
	release func()
	root    string
	pending []proto.WatchEvent
	err     error // once set, what Next returns
}

// Watch watches the guest directory args.Path (and with args.Recursive
// the directories below it, including ones made later) and returns once
// the agent watches it, so every change after the call is seen. A
// missing path is NotFound, a path that is not a directory
// FailedPrecondition; an agent that predates watches gives
// FailedPrecondition too. The watch lasts until Close or the end of ctx;
// the caller must call Close.
func (c *Client) Watch(ctx context.Context, args proto.WatchArgs) (*Watcher, error) {
	op := proto.OpFileWatch
	if !strings.HasPrefix(args.Path, "/") {
		return nil, fmt.Errorf("%s: path %.100q is not absolute: %w", op, args.Path, errkind.InvalidArgument)
	}
	s, release, err := c.open(ctx, op, args)
	if err != nil {
		return nil, err
	}
	f, err := s.r.Next()
	if err != nil {
		release()
		return nil, c.callErr(ctx, op, err)
	}
	if err := decodeResult(op, f, 0, &proto.Empty{}); err != nil {
		release()
		// The path is absolute, so invalid_argument can only mean an
		// agent older than the op ("unknown op").
		if errors.Is(err, errkind.InvalidArgument) {
			return nil, fmt.Errorf("agent %q does not support watches (built before them): %v: %w",
				c.agentVersion, err, errkind.FailedPrecondition)
		}
		return nil, err
	}
	return &Watcher{c: c, ctx: ctx, s: s, release: release, root: path.Clean(args.Path)}, nil
}

// Next returns the next event, waiting for it. It returns io.EOF once
// the watched directory itself went (its remove or rename event came
// just before), and the cause of ctx once it ended.
func (w *Watcher) Next() (proto.WatchEvent, error) {
	op := proto.OpFileWatch
	for len(w.pending) == 0 {
		if w.err != nil {
			return proto.WatchEvent{}, w.err
		}
		f, err := w.s.r.Next()
		switch {
		case err != nil:
			w.err = w.c.callErr(w.ctx, op, err)
		case f.Type == proto.TypeEnd:
			w.err = io.EOF
		default:
			var b proto.WatchBatch
			if w.err = decodeResult(op, f, proto.MaxFrame, &b); w.err == nil {
				w.err = w.check(b.Events)
			}
			if w.err == nil {
				w.pending = b.Events
			}
		}
	}
	ev := w.pending[0]
	w.pending = w.pending[1:]
	return ev, nil
}

// check rejects events that name anything outside the watched
// directory, or are not events.
func (w *Watcher) check(evs []proto.WatchEvent) error {
	for _, ev := range evs {
		switch ev.Op {
		case proto.WatchOverflow:
			if ev.Path != "" || ev.Info != nil {
				return protocolErr(proto.OpFileWatch, "overflow event with a path")
			}
			continue
		case proto.WatchCreate, proto.WatchWrite, proto.WatchRemove, proto.WatchRename, proto.WatchChmod:
		default:
			return protocolErr(proto.OpFileWatch, "event op %.32q", ev.Op)
		}
		if !within(w.root, ev.Path) {
			return protocolErr(proto.OpFileWatch, "event path %.100q outside %s", ev.Path, w.root)
		}
		if ev.Info != nil {
			if err := checkName(ev.Info.Name); err != nil && ev.Path != "/" {
				return protocolErr(proto.OpFileWatch, "%v", err)
			}
			if err := checkInfo(*ev.Info); err != nil {
				return protocolErr(proto.OpFileWatch, "%v", err)
			}
		}
	}
	return nil
}

// within reports whether p is a clean absolute path at or below root.
func within(root, p string) bool {
	if p == "" || len(p) > 4096 || strings.ContainsRune(p, 0) || path.Clean(p) != p || !strings.HasPrefix(p, "/") {
		return false
	}
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}

// Close ends the watch: the agent drops its inotify instance.
func (w *Watcher) Close() error {
	w.release()
	if w.err == nil {
		w.err = fmt.Errorf("%s: watcher closed: %w", proto.OpFileWatch, errkind.FailedPrecondition)
	}
	return nil
}
