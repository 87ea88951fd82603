package worker

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/api"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/store"
	"space/internal/testenv"
	"space/internal/workerproto"
)

// Heartbeat settings of these tests: short, so a frozen agent is declared
// in about a second.
const (
	testHeartbeat = 100 * time.Millisecond
	testSilence   = time.Second
)

// fastHeartbeat makes the worker's heartbeat fast.
func fastHeartbeat(c *Config) { c.AgentHeartbeat, c.AgentTimeout = testHeartbeat, testSilence }

// agentPID is the pid of sandbox id's agent: the fake guest's PID 1.
func agentPID(t *testing.T, w *Worker, id string) int {
	t.Helper()
	s, err := w.get(id)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vm.Handle().PID
}

// freezeAgent stops sandbox id's agent as guest root would (SIGSTOP of
// PID 1); it is continued when the test ends, if not before.
func freezeAgent(t *testing.T, w *Worker, id string) (thaw func()) {
	t.Helper()
	pid := agentPID(t, w, id)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("setup: SIGSTOP agent %d: %v", pid, err)
	}
	thaw = func() { syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(thaw)
	return thaw
}

// agentState is Info.Agent of sandbox id.
func agentState(t *testing.T, w *Worker, id string) string {
	t.Helper()
	inf, err := w.Sandbox(t.Context(), id)
	if err != nil {
		t.Fatalf("Sandbox(%s) = %v", id, err)
	}
	return inf.Agent
}

// dataCall serves one data-plane request of sandbox id.
func dataCall(h http.Handler, method, id, rest, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, workerproto.DataPath(id, rest), strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestFrozenAgent: guest root stops the agent. The worker declares it
// unresponsive within its heartbeat timeout: an exec waiting on it
// fails with the clear error, the sandbox's state says so, data-plane
// calls fail at once (503) instead of hanging, and once the agent is
// continued the sandbox is healthy again.
func TestFrozenAgent(t *testing.T) {
	w := newFakeHost(t).startWith(t, fastHeartbeat)
	id := store.NewSandboxID()
	if _, err := w.Create(t.Context(), CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	if got := agentState(t, w, id); got != workerproto.AgentOK {
		t.Errorf("Info.Agent of a new sandbox = %q, want %q", got, workerproto.AgentOK)
	}
	a, err := w.agentFor(t.Context(), id)
	if err != nil {
		t.Fatalf("agentFor = %v", err)
	}
	p, _, err := a.StartAttached(t.Context(), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"sleep", "600"}}}, client.IO{})
	if err != nil {
		t.Fatalf("StartAttached(sleep 600) = %v", err)
	}
	thaw := freezeAgent(t, w, id)

	// The exec in flight fails with the declaration (the test's own
	// timeout is the bound).
	_, err = p.Wait()
	if !errors.Is(err, client.ErrUnresponsive) || !errors.Is(err, errkind.Unavailable) {
		t.Errorf("Wait of an exec on a frozen agent = %v, want ErrUnresponsive (Unavailable)", err)
	}
	if got := agentState(t, w, id); got != workerproto.AgentUnresponsive {
		t.Errorf("Info.Agent after the declaration = %q, want %q", got, workerproto.AgentUnresponsive)
	}
	h := w.Handler("")
	// Nothing piles up while it is so: a hundred calls leave no
	// goroutine (nor stream) behind.
	before := runtime.NumGoroutine()
	for range 100 {
		dataCall(h, "GET", id, "/files/stat?path=/", "")
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= before+2 })
	for _, call := range []struct{ method, rest, body string }{
		{"GET", "/files/list?path=/", ""},
		{"GET", "/files/stat?path=/", ""},
		{"POST", "/exec", `{"command":["true"]}`},
		{"GET", "/processes", ""},
	} {
		rec := dataCall(h, call.method, id, call.rest, call.body)
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "agent unresponsive: no heartbeat answer for 1s") {
			t.Errorf("%s %s on a frozen agent = %d %s, want 503 saying the agent is unresponsive", call.method, call.rest, rec.Code, rec.Body)
		}
	}

	thaw()
	testenv.Eventually(t, 30*time.Second, func() bool { return agentState(t, w, id) == workerproto.AgentOK })
	if rec := dataCall(h, "GET", id, "/files/list?path=/", ""); rec.Code != http.StatusOK {
		t.Errorf("list after the agent was continued = %d %s, want 200", rec.Code, rec.Body)
	}
}

// TestSilentExecNotUnresponsive: a command that runs far longer than the
// heartbeat's timeout without a byte of output is no sign of a frozen
// agent: it ends normally and the agent stays ok.
func TestSilentExecNotUnresponsive(t *testing.T) {
	w := newFakeHost(t).startWith(t, fastHeartbeat)
	id := store.NewSandboxID()
	if _, err := w.Create(t.Context(), CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	rec := dataCall(w.Handler(""), "POST", id, "/exec", `{"command":["sleep","4"]}`)
	if ev := lastEvent(t, rec); ev.Type != api.EventExit || ev.Exit.Code != 0 {
		t.Errorf("exec sleep 4 (4 heartbeat timeouts, no output) ended with %+v, want exit 0", ev)
	}
	if got := agentState(t, w, id); got != workerproto.AgentOK {
		t.Errorf("Info.Agent after a silent exec = %q, want %q", got, workerproto.AgentOK)
	}
}

// TestExecTimeoutOnHost: the host enforces an exec's timeout_seconds
// itself: with the agent frozen (and the heartbeat too slow to notice),
// the exec still ends shortly after its timeout, as timed out.
func TestExecTimeoutOnHost(t *testing.T) {
	w := newFakeHost(t).startWith(t, func(c *Config) { c.AgentHeartbeat = time.Hour })
	id := store.NewSandboxID()
	if _, err := w.Create(t.Context(), CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	h := w.Handler("")
	done := make(chan *httptest.ResponseRecorder, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		done <- dataCall(h, "POST", id, "/exec", `{"shell":"sleep 1; sleep 600","timeout_seconds":1}`)
	}()
	<-started
	// Freeze once the command runs: the guest's timer can no longer
	// end it (nor report its end).
	a, err := w.agentFor(t.Context(), id)
	if err != nil {
		t.Fatalf("agentFor = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		ps, _ := a.Processes(t.Context())
		for _, p := range ps {
			if p.Running && strings.Contains(p.Shell, "sleep 600") {
				return true
			}
		}
		return false
	})
	freezeAgent(t, w, id)
	rec := <-done
	ev := lastEvent(t, rec)
	if ev.Type != api.EventExit || !ev.Exit.TimedOut {
		t.Errorf("exec with timeout_seconds 1 on a frozen agent ended with %+v, want a timed-out exit", ev)
	}
}

// lastEvent is the last event of an exec's NDJSON response.
func lastEvent(t *testing.T, rec *httptest.ResponseRecorder) api.Event {
	t.Helper()
	var last api.Event
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			t.Fatalf("exec event %q: %v", sc.Text(), err)
		}
	}
	return last
}

// TestPausedNotUnresponsive: a VM its user paused does not answer (the
// fake stops every process of the guest), and that is no frozen agent:
// over three heartbeat timeouts it is never declared unresponsive, and
// once resumed it serves at once.
func TestPausedNotUnresponsive(t *testing.T) {
	w := newFakeHost(t).startWith(t, fastHeartbeat)
	id := store.NewSandboxID()
	if _, err := w.Create(t.Context(), CreateRequest{ID: id, Team: "team", Spec: fakeSpec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	if _, err := w.Pause(t.Context(), id); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	time.Sleep(3 * testSilence) // what is checked is that nothing happens
	s, err := w.get(id)
	if err != nil {
		t.Fatalf("get = %v", err)
	}
	s.mu.Lock()
	down := s.agentDown
	s.mu.Unlock()
	if down != nil {
		t.Errorf("agent of a paused sandbox declared unresponsive: %v", down)
	}
	if _, err := w.Resume(t.Context(), id); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	if rec := dataCall(w.Handler(""), "GET", id, "/files/stat?path=/", ""); rec.Code != http.StatusOK {
		t.Errorf("stat right after resume = %d %s, want 200", rec.Code, rec.Body)
	}
	if got := agentState(t, w, id); got != workerproto.AgentOK {
		t.Errorf("Info.Agent after resume = %q, want %q", got, workerproto.AgentOK)
	}
}
