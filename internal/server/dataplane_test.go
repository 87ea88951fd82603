package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"space/api"
	"space/internal/agent/guesttest"
	"space/internal/testenv"
)

// lineWriter is an io.Writer that reports each line it gets.
type lineWriter struct {
	lines chan string // each complete line, while there is room

	mu sync.Mutex
	// +checklocks:mu
	buf bytes.Buffer // the last line, until it is complete
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		select {
		case w.lines <- strings.TrimSuffix(line, "\n"):
		default:
		}
	}
}

// TestDataPlaneOutlivesReplica runs a control plane without a worker in
// a child process, a standalone worker and a data-plane proxy, starts a
// command whose output streams through the proxy, kills the control
// plane with SIGKILL mid-stream, and checks the stream goes on to the
// command's end, byte for byte, while the control plane is gone.
func TestDataPlaneOutlivesReplica(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	dataDir := newDataDir(t)
	token := "dataplane-test-token-0123456789abcdef"
	if err := os.WriteFile(filepath.Join(dataDir, WorkerTokenFile), []byte(token+"\n"), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	proxyURL := startProxy(t, token)
	env := []string{envNoWorker + "=1", envDataPlane + "=" + proxyURL}
	cp := startChild(t, dataDir, "", "", env...)
	ts := &testServer{url: cp.url, dataDir: dataDir}
	wk := startWorker(t, ts, 2048)
	ctx := t.Context()
	var sb api.Sandbox
	testenv.Eventually(t, time.Minute, func() bool {
		var err error
		sb, err = cp.client.CreateSandbox(ctx, api.CreateSandbox{})
		return err == nil
	})
	if sb.Worker != wk.workerID || sb.DataPlane == nil || sb.DataPlane.URL != proxyURL {
		t.Fatalf("sandbox = worker %q data plane %+v, want worker %s and the proxy %s", sb.Worker, sb.DataPlane, wk.workerID, proxyURL)
	}
	const n = 40
	out := &lineWriter{lines: make(chan string, n)}
	var stderr bytes.Buffer
	type result struct {
		exit api.Exit
		err  error
	}
	done := make(chan result, 1)
	go func() {
		exit, err := cp.client.Exec(ctx, sb.ID, api.Exec{Shell: fmt.Sprintf("for i in $(seq 1 %d); do echo line $i; sleep 0.1; done", n)}, out, &stderr)
		done <- result{exit, err}
	}()
	select {
	case l := <-out.lines:
		if l != "line 1" {
			t.Fatalf("first line %q, want line 1", l)
		}
	case r := <-done:
		t.Fatalf("exec ended before its first line: %+v %v", r.exit, r.err)
	case <-time.After(time.Minute):
		t.Fatalf("no output in a minute")
	}
	cp.kill(t, syscall.SIGKILL) // the replica that served the create
	r := <-done
	if r.err != nil || r.exit.Code != 0 {
		t.Fatalf("exec after the control plane died = %+v, %v (stderr %q), want exit 0", r.exit, r.err, stderr.String())
	}
	if len(out.lines) != n-1 {
		t.Errorf("got %d more lines after the kill, want %d", len(out.lines), n-1)
	}
	for i := 2; i <= n; i++ {
		if l := <-out.lines; l != fmt.Sprintf("line %d", i) {
			t.Fatalf("line %d = %q", i, l)
		}
	}
	// The next replica start cleans up.
	cp2 := startChild(t, dataDir, "", "", env...)
	testenv.Eventually(t, time.Minute, func() bool {
		err := cp2.client.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)
		return err == nil
	})
}

// startProxy runs a data-plane proxy for the cluster of token and returns
// its URL.
func startProxy(t testing.TB, token string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunProxy(ctx, ProxyConfig{Token: token, Listen: "127.0.0.1:0", Ready: func(u string) { ready <- u }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	select {
	case u := <-ready:
		return u
	case err := <-done:
		t.Fatalf("setup: proxy: %v", err)
	}
	return ""
}
