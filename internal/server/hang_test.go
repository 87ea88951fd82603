package server

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/chunkstore/chunkloc"
	"space/internal/testenv"
)

// Environment of a worker child process (see TestMain).
const (
	envWorkerChild   = "SPACE_TEST_WORKER_CHILD"
	envWorkerDataDir = "SPACE_TEST_WORKER_DATA_DIR"
	envWorkerCP      = "SPACE_TEST_WORKER_CONTROL_PLANE"
	envWorkerToken   = "SPACE_TEST_WORKER_TOKEN"
	envWorkerChunks  = "SPACE_TEST_WORKER_CHUNKS"
	// envWorkerOwnID is WorkerConfig.ID ("" = the data dir's), envWorkerVMM
	// its VMM.
	envWorkerOwnID = "SPACE_TEST_WORKER_ID"
	envWorkerVMM   = "SPACE_TEST_WORKER_VMM"
	// envWorkerEgress is the gateways' Egress of a worker child, for
	// an upstream of package egresstest: "NETNS;CA_FILE;HOST=ADDR,..."
	// ("" = the defaults).
	envWorkerEgress = "SPACE_TEST_WORKER_EGRESS"
)

// childEgress decodes envWorkerEgress.
func childEgress() (Egress, error) {
	v := os.Getenv(envWorkerEgress)
	if v == "" {
		return Egress{}, nil
	}
	parts := strings.Split(v, ";")
	if len(parts) != 3 {
		return Egress{}, fmt.Errorf("%s=%q: want NETNS;CA_FILE;HOST=ADDR,...", envWorkerEgress, v)
	}
	pem, err := os.ReadFile(parts[1])
	if err != nil {
		return Egress{}, err
	}
	e := Egress{Netns: parts[0], Roots: x509.NewCertPool(), Hosts: map[string][]netip.Addr{}}
	if !e.Roots.AppendCertsFromPEM(pem) {
		return Egress{}, fmt.Errorf("%s: no certificate", parts[1])
	}
	for _, kv := range strings.Split(parts[2], ",") {
		host, addr, _ := strings.Cut(kv, "=")
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return Egress{}, fmt.Errorf("%s: %q: %v", envWorkerEgress, kv, err)
		}
		e.Hosts[host] = append(e.Hosts[host], a)
	}
	return e, nil
}

func workerChildMain() int {
	ctx, stop := signalContext()
	defer stop()
	vmm := os.Getenv(envWorkerVMM)
	vcpus, memoryMiB := 8, int64(2048)
	if vmm == VMMFake {
		// Fake guests use neither: room for hundreds of sandboxes.
		vcpus, memoryMiB = 512, 512<<10
	}
	egress, err := childEgress()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	err = RunWorker(ctx, WorkerConfig{
		ID: os.Getenv(envWorkerOwnID), DataDir: os.Getenv(envWorkerDataDir), Listen: "127.0.0.1:0", ControlPlane: os.Getenv(envWorkerCP),
		Token: os.Getenv(envWorkerToken), CacheBase: guesttest.CacheBase(), AgentPath: os.Getenv(envAgent), VMM: vmm,
		Chunks: ChunkStore{Location: os.Getenv(envWorkerChunks), Credentials: chunkloc.CredentialsFromEnv(os.Getenv)}, VCPUs: vcpus, MemoryMiB: memoryMiB, Progress: os.Stderr, Log: childLog(),
		Ready: func(url string) { fmt.Printf("READY %s\n", url) }, Egress: egress,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// startWorkerChild runs a standalone worker registered with ts in a child
// process (so a test can stop it with SIGSTOP) and returns it.
func startWorkerChild(t *testing.T, ts *testServer) *exec.Cmd {
	t.Helper()
	agent := guesttest.Agent(t)
	token, err := os.ReadFile(filepath.Join(ts.dataDir, WorkerTokenFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	dataDir := newDataDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWorkerChild+"=1", envWorkerDataDir+"="+dataDir, envWorkerCP+"="+ts.url,
		envWorkerToken+"="+strings.TrimSpace(string(token)), envAgent+"="+agent,
		envWorkerChunks+"="+filepath.Join(ts.dataDir, "chunks"))
	logf, err := os.Create(filepath.Join(t.TempDir(), "worker.log"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("setup: start worker: %v", err)
	}
	done := make(chan struct{})
	ready := make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				ready <- struct{}{}
			}
		}
	}()
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
	})
	select {
	case <-ready:
	case <-done:
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("setup: worker exited before serving:\n%s", b)
	case <-time.After(5 * time.Minute):
		t.Fatalf("setup: worker not ready in 5m")
	}
	return cmd
}

// TestStoppedWorker stops a standalone worker with SIGSTOP (it holds a
// sandbox, and its TCP port still accepts connections) and checks the
// control plane marks it unhealthy within seconds, keeps placing and
// serving on the other worker without waiting for it, and takes it back
// once it runs again (SIGCONT) with its sandbox intact.
func TestStoppedWorker(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	// (Recovery waits longer than the test stops the worker: this is
	// the worker taken back, recovery_test.go the worker replaced.)
	ts := startServerWith(t, Config{VCPUs: 1, MemoryMiB: 64, RecoverAfter: 5 * time.Minute}) // takes nothing
	stopped := startWorkerChild(t, ts)
	workers := func() map[string]bool {
		status, body := rawCall(t, ts, "GET", "/v1/workers", "")
		var l api.WorkerList
		if status != 200 || json.Unmarshal([]byte(body), &l) != nil {
			t.Fatalf("GET /v1/workers = %d %s", status, body)
		}
		out := map[string]bool{}
		for _, w := range l.Workers {
			if w.ID != ts.workerID {
				out[w.ID] = w.Healthy
			}
		}
		return out
	}
	var aID string
	testenv.Eventually(t, time.Minute, func() bool {
		for id, ok := range workers() {
			aID = id
			return ok
		}
		return false
	})
	ctx := t.Context()
	onA, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{})
	if err != nil || onA.Worker != aID {
		t.Fatalf("create = %+v, %v, want it on %s", onA, err, aID)
	}
	b := startWorker(t, ts, 2048)
	ts.deleteAllOnCleanup(t) // before the workers stop
	testenv.Eventually(t, time.Minute, func() bool { return workers()[b.workerID] })

	if err := stopped.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
	t0 := time.Now()
	testenv.Eventually(t, 30*time.Second, func() bool { return !workers()[aID] })
	t.Logf("stopped worker marked unhealthy after %s", time.Since(t0).Round(100*time.Millisecond))
	// Creates go to the other worker and list and get answer, none
	// waiting for the stopped one.
	for range 2 {
		sb, err := ts.client.CreateSandbox(ctx, api.CreateSandbox{})
		if err != nil || sb.Worker != b.workerID {
			t.Fatalf("create while %s is stopped = %+v, %v, want it on %s", aID, sb, err, b.workerID)
		}
		if _, err := ts.client.Sandboxes(ctx, client.ListOptions{}); err != nil {
			t.Fatalf("list while a worker is stopped: %v", err)
		}
	}
	if err := stopped.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT: %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return workers()[aID] })
	if out, _, code := execOut(t, ts.client, onA.ID, sh("echo back")); code != 0 || out != "back\n" {
		t.Errorf("exec in the sandbox of the worker that ran again = %q, exit %d", out, code)
	}
}

// TestFrozenAgentShown: guest root stops the agent (SIGSTOP of PID 1; on
// the fake VMM the agent is the VM's process). The sandbox's get says
// agent unresponsive, an exec with a timeout and a file list fail with
// the clear error instead of hanging, and once the agent is continued
// the sandbox is healthy again.
func TestFrozenAgentShown(t *testing.T) {
	ts := startFakeServerWith(t, Config{AgentHeartbeat: 100 * time.Millisecond, AgentTimeout: time.Second})
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox() = %v", err)
	}
	if got, err := c.Sandbox(ctx, sb.ID); err != nil || got.Agent != api.AgentOK {
		t.Errorf("Sandbox() agent = %q, %v; want %q", got.Agent, err, api.AgentOK)
	}
	if sb.VM == nil || sb.VM.PID == 0 {
		t.Fatalf("CreateSandbox() VM = %+v, want its pid", sb.VM)
	}
	pid := sb.VM.PID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP agent: %v", err)
	}
	continued := false
	cont := func() {
		if !continued {
			syscall.Kill(pid, syscall.SIGCONT)
			continued = true
		}
	}
	defer cont()

	testenv.Eventually(t, 30*time.Second, func() bool {
		got, err := c.Sandbox(ctx, sb.ID)
		return err == nil && got.Agent == api.AgentUnresponsive
	})
	_, err = c.Exec(ctx, sb.ID, api.Exec{Command: []string{"sleep", "60"}, TimeoutSeconds: 5}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "agent unresponsive") {
		t.Errorf("Exec(timeout 5s) on a frozen agent = %v, want an error saying the agent is unresponsive", err)
	}
	if _, err := c.ListFiles(ctx, sb.ID, "/"); err == nil || !strings.Contains(err.Error(), "agent unresponsive: no heartbeat answer for 1s") {
		t.Errorf("ListFiles on a frozen agent = %v, want an error saying the agent is unresponsive", err)
	}

	cont()
	testenv.Eventually(t, 30*time.Second, func() bool {
		got, err := c.Sandbox(ctx, sb.ID)
		return err == nil && got.Agent == api.AgentOK
	})
	if out, _, code := execOut(t, c, sb.ID, sh("echo back")); out != "back\n" || code != 0 {
		t.Errorf("exec after the agent was continued = %q, exit %d; want back", out, code)
	}
}
