package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/agent/server"
	"space/internal/testenv"
)

// inotifyFDs counts the inotify instances the test process holds.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	n := 0
	for _, de := range des {
		if l, err := os.Readlink("/proc/self/fd/" + de.Name()); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// TestWatchEndsWithHost checks the agent closes a watch's inotify
// instance when the host closes the watch, cancels its context, or goes
// away altogether.
func TestWatchEndsWithHost(t *testing.T) {
	a, c := inProcess(t)
	dir := t.TempDir()
	before := inotifyFDs(t)
	tests := []struct {
		name string
		end  func(w *client.Watcher, cancel context.CancelFunc, c *client.Client)
	}{
		{"Close", func(w *client.Watcher, _ context.CancelFunc, _ *client.Client) { w.Close() }},
		{"cancel", func(w *client.Watcher, cancel context.CancelFunc, _ *client.Client) { cancel(); w.Next() }},
		{"connection lost", func(_ *client.Watcher, _ context.CancelFunc, c *client.Client) { c.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := c
			if tt.name == "connection lost" {
				var err error
				if conn, err = a.connect(t.Context()); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			w, err := conn.Watch(ctx, proto.WatchArgs{Path: dir, Recursive: true})
			if err != nil {
				t.Fatalf("Watch = %v", err)
			}
			defer w.Close()
			if got := inotifyFDs(t); got != before+1 {
				t.Errorf("inotify instances while watching = %d, want %d", got, before+1)
			}
			tt.end(w, cancel, conn)
			testenv.Eventually(t, 10*time.Second, func() bool { return inotifyFDs(t) == before })
		})
	}
}

// TestWatchOverflow checks that a host reading too slowly gets an
// overflow event in place of what the agent could not hold, and that the
// watch goes on after it.
func TestWatchOverflow(t *testing.T) {
	_, c := inProcessWith(t, server.Config{Version: "test", WatchQueue: 8})
	dir := t.TempDir()
	w, err := c.Watch(t.Context(), proto.WatchArgs{Path: dir})
	if err != nil {
		t.Fatalf("Watch = %v", err)
	}
	defer w.Close()
	// Enough events to fill the stream's window (1 MiB) and then the
	// agent's queue, while nobody reads.
	const files = 12000
	for i := range files {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	overflows, events := 0, 0
	for overflows == 0 {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("Next after %d events = %v", events, err)
		}
		events++
		if ev.Op == proto.WatchOverflow {
			overflows++
		}
		if events > files {
			t.Fatalf("no overflow event in %d events", events)
		}
	}
	// The watch goes on: a file made from now on is reported (made again
	// until it is, as it may meet another overflow).
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("after%d", i)), nil, 0o644)
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); <-stopped }()
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("Next after the overflow = %v", err)
		}
		if ev.Op == proto.WatchCreate && strings.HasPrefix(filepath.Base(ev.Path), "after") {
			return
		}
	}
}
