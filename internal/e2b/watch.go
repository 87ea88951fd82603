package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"space/api"
	"space/client"
)

// Directory watches: WatchDir streams a watch's events; CreateWatcher,
// GetWatcherEvents and RemoveWatcher keep one on the server for clients
// that poll it (E2B's Python SDK does).

type watchRequest struct {
	Path         string `json:"path"`
	Recursive    bool   `json:"recursive"`
	IncludeEntry bool   `json:"includeEntry"`
	// AllowNetworkMounts lets envd watch a directory on a network file
	// system, where changes made elsewhere go unseen. SPACE's agent
	// watches any directory, so the flag changes nothing here.
	AllowNetworkMounts bool `json:"allowNetworkMounts"`
}

type filesystemEvent struct {
	Name  string     `json:"name"`
	Type  string     `json:"type"`
	Entry *entryInfo `json:"entry,omitempty"`
}

var eventTypes = map[api.FileEventType]string{
	api.FileEventCreate: "EVENT_TYPE_CREATE",
	api.FileEventWrite:  "EVENT_TYPE_WRITE",
	api.FileEventRemove: "EVENT_TYPE_REMOVE",
	api.FileEventRename: "EVENT_TYPE_RENAME",
	api.FileEventChmod:  "EVENT_TYPE_CHMOD",
}

// errEventsLost ends a watch whose events overflowed a queue: envd's
// protocol has no way to say some were lost and go on.
var errEventsLost = newRPCError("resource_exhausted", "events were lost (the sandbox's queue overflowed): watch again and list the directory")

// translator converts one watch's changes into envd's events.
//
// SPACE writes a file whole: into a temporary file beside it
// (.NAME.space-tmp-N), then renamed over NAME. envd writes in place, and
// clients wait for a write event of NAME. So the temporary file's events
// are left out, and NAME appearing by that rename is a create and a write.
type translator struct {
	withEntry bool
	staged    map[string]bool // names whose temporary file was created
}

// tmpMarker is in the names of the temporary files SPACE's writes use.
const tmpMarker = ".space-tmp-"

// stagedName returns the name a temporary file will become, or ok=false
// for any other name.
func stagedName(name string) (string, bool) {
	dir, base := path.Split(name)
	i := strings.LastIndex(base, tmpMarker)
	if i < 2 || base[0] != '.' {
		return "", false
	}
	for _, r := range base[i+len(tmpMarker):] {
		if r < '0' || r > '9' {
			return "", false
		}
	}
	return dir + base[1:i], true
}

// events converts a change into the events envd would send for it: none,
// one, or a create and a write.
func (t *translator) events(ev api.FileEvent) ([]filesystemEvent, error) {
	if ev.Type == api.FileEventOverflow {
		return nil, errEventsLost
	}
	typ, ok := eventTypes[ev.Type]
	if !ok || ev.Name == "." {
		return nil, nil
	}
	if final, ok := stagedName(ev.Name); ok {
		switch {
		case ev.Type == api.FileEventCreate && len(t.staged) < maxStaged:
			if t.staged == nil {
				t.staged = map[string]bool{}
			}
			t.staged[final] = true
		case ev.Type == api.FileEventRemove: // the write failed
			delete(t.staged, final)
		}
		return nil, nil
	}
	fe := filesystemEvent{Name: ev.Name, Type: typ}
	if t.withEntry && ev.Entry != nil {
		e := entryOf(ev.Path, *ev.Entry)
		fe.Entry = &e
	}
	out := []filesystemEvent{fe}
	if ev.Type == api.FileEventCreate && t.staged[ev.Name] {
		delete(t.staged, ev.Name)
		w := fe
		w.Type = eventTypes[api.FileEventWrite]
		out = append(out, w)
	}
	return out, nil
}

// maxStaged bounds the writes a translator tracks between their start
// and their rename.
const maxStaged = 1024

func (s *Server) startWatch(ctx context.Context, c *envdCall, req watchRequest) (*client.FileWatch, error) {
	p, err := c.absPath(ctx, req.Path)
	if err != nil {
		return nil, err
	}
	w, err := c.sandbox.WatchFiles(ctx, c.id, p, req.Recursive)
	if err != nil {
		return nil, fsError(err, p)
	}
	return w, nil
}

func (s *Server) fsWatchDir(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req watchRequest
	sc, ok := beginStream(w, r, &req)
	if !ok {
		return
	}
	defer sc.cancel()
	st, ctx := sc.st, sc.ctx
	watch, err := s.startWatch(ctx, c, req)
	if err != nil {
		st.End(err)
		return
	}
	defer watch.Close()
	type message struct {
		Start      *struct{}        `json:"start,omitempty"`
		Filesystem *filesystemEvent `json:"filesystem,omitempty"`
		Keepalive  *struct{}        `json:"keepalive,omitempty"`
	}
	if err := st.Send(message{Start: &struct{}{}}); err != nil {
		return
	}
	go st.keepalive(ctx, r, message{Keepalive: &struct{}{}})
	tr := translator{withEntry: req.IncludeEntry}
	for {
		ev, err := watch.Next()
		if errors.Is(err, io.EOF) {
			st.End(nil) // the watched directory went
			return
		}
		if err != nil {
			st.End(err)
			return
		}
		fes, err := tr.events(ev)
		if err != nil {
			st.End(err)
			return
		}
		for _, fe := range fes {
			if st.Send(message{Filesystem: &fe}) != nil {
				return
			}
		}
	}
}

// watchers are the watches CreateWatcher keeps for polling clients.
type watchers struct {
	mu sync.Mutex
	// +checklocks:mu
	byID map[string]*watcher
}

// watcher is one watch kept on the server. Events wait for
// GetWatcherEvents, up to maxQueued; one that nobody asked about for
// watcherIdle is closed.
type watcher struct {
	sandbox string
	stop    context.CancelFunc

	mu sync.Mutex
	// +checklocks:mu
	events []filesystemEvent
	// +checklocks:mu
	err error // how the watch ended, once it did
	// +checklocks:mu
	polled time.Time
}

const (
	maxQueued   = 10000
	watcherIdle = 10 * time.Minute
)

func (s *Server) fsCreateWatcher(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req watchRequest
	if err := readUnary(r, &req); err != nil {
		writeRPCError(w, err)
		return
	}
	// The watch outlives this call: its context is the watcher's own.
	ctx, stop := context.WithCancel(context.WithoutCancel(r.Context()))
	watch, err := s.startWatch(ctx, c, req)
	if err != nil {
		stop()
		writeRPCError(w, err)
		return
	}
	wt := &watcher{sandbox: c.id, stop: stop, polled: time.Now()}
	var b [16]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	s.watchers.mu.Lock()
	if s.watchers.byID == nil {
		s.watchers.byID = map[string]*watcher{}
	}
	s.watchers.byID[id] = wt
	s.watchers.mu.Unlock()
	go s.runWatcher(ctx, id, wt, watch, req.IncludeEntry)
	writeUnary(w, map[string]string{"watcherId": id})
}

// runWatcher queues a watcher's events until its watch ends, then drops
// it once it was idle for watcherIdle.
func (s *Server) runWatcher(ctx context.Context, id string, wt *watcher, watch *client.FileWatch, withEntry bool) {
	defer watch.Close()
	idle := time.NewTicker(time.Minute)
	defer idle.Stop()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-idle.C:
				wt.mu.Lock()
				stale := time.Since(wt.polled) > watcherIdle
				wt.mu.Unlock()
				if stale {
					s.dropWatcher(id)
					return
				}
			}
		}
	}()
	tr := translator{withEntry: withEntry}
	for {
		ev, err := watch.Next()
		if err == nil {
			var fes []filesystemEvent
			if fes, err = tr.events(ev); err == nil && len(fes) > 0 {
				wt.mu.Lock()
				if len(wt.events)+len(fes) <= maxQueued {
					wt.events = append(wt.events, fes...)
				} else {
					err = errEventsLost
				}
				wt.mu.Unlock()
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			wt.mu.Lock()
			wt.err = err
			if wt.err == nil {
				wt.err = newRPCError("not_found", "the watched directory is gone")
			}
			wt.mu.Unlock()
			return
		}
	}
}

func (s *Server) dropWatcher(id string) {
	s.watchers.mu.Lock()
	wt := s.watchers.byID[id]
	delete(s.watchers.byID, id)
	s.watchers.mu.Unlock()
	if wt != nil {
		wt.stop()
	}
}

// watcherOf returns the call's sandbox's watcher id.
func (s *Server) watcherOf(c *envdCall, id string) (*watcher, error) {
	s.watchers.mu.Lock()
	wt := s.watchers.byID[id]
	s.watchers.mu.Unlock()
	if wt == nil || wt.sandbox != c.id {
		return nil, notFoundf("watcher %q not found", id)
	}
	return wt, nil
}

type watcherRequest struct {
	WatcherID string `json:"watcherId"`
}

func (s *Server) fsGetWatcherEvents(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req watcherRequest
	if err := readUnary(r, &req); err != nil {
		writeRPCError(w, err)
		return
	}
	wt, err := s.watcherOf(c, req.WatcherID)
	if err != nil {
		writeRPCError(w, err)
		return
	}
	wt.mu.Lock()
	events, werr := wt.events, wt.err
	wt.events, wt.polled = nil, time.Now()
	wt.mu.Unlock()
	if len(events) == 0 && werr != nil {
		s.dropWatcher(req.WatcherID)
		writeRPCError(w, werr)
		return
	}
	if events == nil {
		events = []filesystemEvent{}
	}
	writeUnary(w, map[string][]filesystemEvent{"events": events})
}

func (s *Server) fsRemoveWatcher(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req watcherRequest
	if err := readUnary(r, &req); err != nil {
		writeRPCError(w, err)
		return
	}
	if _, err := s.watcherOf(c, req.WatcherID); err != nil {
		writeRPCError(w, err)
		return
	}
	s.dropWatcher(req.WatcherID)
	writeUnary(w, struct{}{})
}
