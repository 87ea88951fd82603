package server

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/controlplane"
	"space/internal/testenv"
	"space/internal/worker"
)

// Environment of a server child process (see TestMain).
const (
	envChild    = "SPACE_TEST_SERVER_CHILD"
	envDataDir  = "SPACE_TEST_SERVER_DATA_DIR"
	envWorkerID = "SPACE_TEST_SERVER_WORKER_ID"
	envAgent    = "SPACE_TEST_SERVER_AGENT"
	envCrashAt  = "SPACE_TEST_SERVER_CRASH_AT"
	envPool     = "SPACE_TEST_SERVER_POOL" // "1": prewarm and keep a pool of one
	// envNoWorker "1" runs the server without an embedded worker, and
	// envDataPlane is its Config.DataPlaneURL.
	envNoWorker  = "SPACE_TEST_SERVER_NO_WORKER"
	envDataPlane = "SPACE_TEST_SERVER_DATA_PLANE"
	// For replicas on PostgreSQL (replicas_test.go): Config.StoreURL,
	// VMM, Listen ("" = any port), WorkerToken and SecretsKeyFile.
	envStore      = "SPACE_TEST_SERVER_STORE"
	envVMM        = "SPACE_TEST_SERVER_VMM"
	envListen     = "SPACE_TEST_SERVER_LISTEN"
	envToken      = "SPACE_TEST_SERVER_WORKER_TOKEN"
	envSecretsKey = "SPACE_TEST_SERVER_SECRETS_KEY"
)

// TestMain runs this test binary as a server process when asked to, so
// crash tests can kill -9 a real server at a named step.
func TestMain(m *testing.M) {
	if os.Getenv(envFakeFirecracker) == "1" {
		os.Exit(fakeFirecrackerMain())
	}
	if os.Getenv(envWorkerChild) == "1" {
		os.Exit(workerChildMain())
	}
	if os.Getenv(envChild) == "1" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func childMain() int {
	ctx, stop := signalContext()
	defer stop()
	pool := os.Getenv(envPool) == "1"
	poolSize := 0
	if pool {
		poolSize = 1
	}
	err := Run(ctx, Config{
		DataDir: os.Getenv(envDataDir), Listen: cmp.Or(os.Getenv(envListen), "127.0.0.1:0"), CacheBase: guesttest.CacheBase(),
		AgentPath: os.Getenv(envAgent), WorkerID: os.Getenv(envWorkerID), CrashAt: os.Getenv(envCrashAt),
		Version: "test", Progress: os.Stderr, Log: childLog(), Prewarm: pool, Pool: poolSize,
		NoWorker: os.Getenv(envNoWorker) == "1", DataPlaneURL: os.Getenv(envDataPlane),
		StoreURL: os.Getenv(envStore), VMM: os.Getenv(envVMM), WorkerToken: os.Getenv(envToken),
		SecretsKeyFile: os.Getenv(envSecretsKey),
		Ready:          func(url string) { fmt.Printf("READY %s\n", url) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 1
	}
	return 0
}

// childLog is a child process's event log: text on stderr (its log file)
// when SPACE_TEST_LOG is set, else nil.
func childLog() *slog.Logger {
	if os.Getenv("SPACE_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signalNotify(ch)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// child is a server running in a child process.
type child struct {
	cmd    *exec.Cmd
	url    string
	done   chan struct{}
	client *client.Client
}

// startChild starts a server process on dataDir; crashAt names its crash
// point or is "".
func startChild(t *testing.T, dataDir, workerID, crashAt string, env ...string) *child {
	t.Helper()
	agent := guesttest.Agent(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", envDataDir+"="+dataDir, envWorkerID+"="+workerID,
		envAgent+"="+agent, envCrashAt+"="+crashAt)
	cmd.Env = append(cmd.Env, env...)
	logf, err := os.OpenFile(filepath.Join(t.TempDir(), "server.log"), os.O_CREATE|os.O_WRONLY, 0o600)
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
		t.Fatalf("setup: start server: %v", err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				urlc <- u
			}
		}
		io.Copy(io.Discard, out)
	}()
	go func() { cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-c.done
	})
	select {
	case c.url = <-urlc:
	case <-c.done:
		b, _ := os.ReadFile(logf.Name())
		t.Fatalf("setup: server exited before serving:\n%s", b)
	case <-time.After(5 * time.Minute):
		t.Fatalf("setup: server not ready in 5m")
	}
	key, err := os.ReadFile(filepath.Join(dataDir, AdminKeyFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	c.client, _ = client.New(c.url, strings.TrimSpace(string(key)))
	return c
}

// waitExit waits for the child to die by itself (a crash point).
func (c *child) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("server did not exit at its crash point")
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("server exit = %v, want killed by SIGKILL at the crash point", c.cmd.ProcessState)
	}
}

func (c *child) kill(t *testing.T, sig syscall.Signal) {
	t.Helper()
	c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		t.Fatalf("server did not exit on %v", sig)
	}
}

// TestCrashAtEveryStep kills the server at each named step of create and
// delete, restarts it, and checks that the sandbox was completed or rolled
// back (create) or finished (delete), with nothing left behind.
func TestCrashAtEveryStep(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	var steps []string
	for _, step := range append(slices.Clone(controlplane.CrashPoints), worker.CrashPoints...) {
		if !isSnapshotStep(step) && step != poolStep && step != templateStep && step != forkStep { // tested on their own
			steps = append(steps, step)
		}
	}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			dataDir, workerID := newDataDir(t), newWorkerID(t)
			deleting := strings.Contains(step, "delete")
			restoring := strings.HasPrefix(step, "restore.")
			suspending, resuming := strings.HasPrefix(step, "api.suspend."), strings.HasPrefix(step, "api.resume.")
			var id string
			if deleting || restoring || suspending || resuming {
				c := startChild(t, dataDir, workerID, "")
				sb, err := c.client.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 192})
				if err != nil {
					t.Fatalf("CreateSandbox = %v", err)
				}
				id = sb.ID
				if restoring {
					var out strings.Builder
					c.client.Exec(t.Context(), id, sh("echo one > /root/f; sync"), &out, io.Discard)
					if _, err := c.client.CreateSnapshot(t.Context(), id, "s"); err != nil {
						t.Fatalf("CreateSnapshot = %v", err)
					}
					c.client.Exec(t.Context(), id, sh("echo two > /root/f; sync"), &out, io.Discard)
				}
				if resuming {
					if _, err := c.client.SuspendSandbox(t.Context(), id); err != nil {
						t.Fatalf("SuspendSandbox = %v", err)
					}
				}
				c.kill(t, syscall.SIGTERM)
			}
			c := startChild(t, dataDir, workerID, step)
			switch {
			case deleting:
				if err := c.client.DeleteSandbox(t.Context(), id); err == nil {
					t.Fatalf("DeleteSandbox returned before the crash point %s", step)
				}
			case restoring:
				if _, err := c.client.RestoreSandbox(t.Context(), id, "s"); err == nil {
					t.Fatalf("RestoreSandbox returned before the crash point %s", step)
				}
			case suspending:
				if _, err := c.client.SuspendSandbox(t.Context(), id); err == nil {
					t.Fatalf("SuspendSandbox returned before the crash point %s", step)
				}
			case resuming:
				if _, err := c.client.ResumeSandbox(t.Context(), id); err == nil {
					t.Fatalf("ResumeSandbox returned before the crash point %s", step)
				}
			default:
				if sb, err := c.client.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 192}); err == nil {
					t.Fatalf("CreateSandbox = %s, want the server to die at %s", sb.ID, step)
				}
			}
			c.waitExit(t)

			c = startChild(t, dataDir, workerID, "")
			all, err := c.client.Sandboxes(t.Context(), client.ListOptions{})
			if err != nil {
				t.Fatalf("Sandboxes after restart = %v", err)
			}
			ts := &testServer{dataDir: dataDir, workerID: workerID}
			switch {
			case (suspending || resuming) && len(all) == 1 && all[0].State == "suspended" && all[0].SuspendedSnapshot != "":
				// Suspended (the suspend finished, or the resume rolled
				// back): it resumes, then goes.
				t.Logf("%s: suspended", step)
				if sb, err := c.client.ResumeSandbox(t.Context(), id); err != nil || sb.State != "running" {
					t.Fatalf("ResumeSandbox after restart = %+v, %v", sb, err)
				}
				if err := c.client.DeleteSandbox(t.Context(), id); err != nil {
					t.Fatalf("DeleteSandbox = %v", err)
				}
			case len(all) == 0:
				t.Logf("%s: rolled back / finished", step)
			case len(all) == 1 && !deleting && all[0].State == "running":
				t.Logf("%s: completed", step)
				if restoring {
					var f strings.Builder
					if _, err := c.client.Exec(t.Context(), id, sh("cat /root/f"), &f, io.Discard); err != nil || f.String() != "one\n" {
						t.Errorf("after the interrupted restore /root/f = %q, %v; want the snapshot's one", f.String(), err)
					}
					if err := c.client.DeleteSnapshot(t.Context(), "s"); err != nil {
						t.Errorf("DeleteSnapshot = %v", err)
					}
				}
				var out strings.Builder
				exit, err := c.client.Exec(t.Context(), all[0].ID, sh("echo alive"), &out, io.Discard)
				if err != nil || exit.Code != 0 || out.String() != "alive\n" {
					t.Errorf("exec in completed sandbox = %q, %+v, %v", out.String(), exit, err)
				}
				if err := c.client.DeleteSandbox(t.Context(), all[0].ID); err != nil {
					t.Fatalf("DeleteSandbox = %v", err)
				}
			default:
				t.Fatalf("after restart: sandboxes = %+v, want none or one running", all)
			}
			assertNoLeftovers(t, ts)
		})
	}
}

func isSnapshotStep(step string) bool {
	return strings.HasPrefix(step, "snapshot.") || strings.HasPrefix(step, "api.snapshot.")
}

// templateStep is the crash point of a template build
// (TestCrashDuringTemplateBuild).
const templateStep = "api.template.step-cached"

// forkStep is the crash point of a fork (TestCrashDuringFork).
const forkStep = "api.fork.child-created"

// TestCrashDuringFork kills the server once the first of a fork's two
// children runs: the fork never answered, so after the restart its
// snapshot is gone (not listed, nothing of it on the worker's disk) and
// so is the child; the parent runs with its file, and nothing is left
// once it is deleted.
func TestCrashDuringFork(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	dataDir, workerID := newDataDir(t), newWorkerID(t)
	ctx := t.Context()
	c := startChild(t, dataDir, workerID, "")
	parent, err := c.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	execOut(t, c.client, parent.ID, sh("echo forked > /root/f; sync"))
	c.kill(t, syscall.SIGTERM)

	c = startChild(t, dataDir, workerID, forkStep)
	if kids, err := c.client.ForkSandbox(ctx, parent.ID, 2); err == nil {
		t.Fatalf("ForkSandbox = %+v, want the server to die at %s", kids, forkStep)
	}
	c.waitExit(t)
	c = startChild(t, dataDir, workerID, "") // reconciles before it serves
	if sns, err := c.client.Snapshots(ctx, ""); err != nil || len(sns) != 0 {
		t.Errorf("Snapshots after restart = %+v, %v; want none (the fork's rolled back)", sns, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(dataDir, "worker", "snapshots")); len(entries) != 0 {
		t.Errorf("the worker still holds %d snapshot directories, want none", len(entries))
	}
	all, err := c.client.Sandboxes(ctx, client.ListOptions{})
	if err != nil || len(all) != 1 || all[0].ID != parent.ID {
		t.Fatalf("Sandboxes after restart = %+v, %v; want only the parent (the child of the unanswered fork removed)", all, err)
	}
	for _, sb := range all {
		if out, _, _ := execOut(t, c.client, sb.ID, sh("cat /root/f")); sb.State != "running" || out != "forked\n" {
			t.Errorf("%s after restart: %s, /root/f = %q; want running with the parent's file", sb.ID, sb.State, out)
		}
		if err := c.client.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatalf("DeleteSandbox = %v", err)
		}
	}
	assertNoLeftovers(t, &testServer{dataDir: dataDir, workerID: workerID})
}

// poolStep is the crash point of a create served from the pool
// (TestCrashDuringPoolHandover).
const poolStep = "create.pool-handed-over"

// TestCrashDuringPoolHandover kills the server while a pool member is
// being handed to a create: after the restart the create is rolled back,
// the member is gone, and nothing is left.
func TestCrashDuringPoolHandover(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	dataDir, workerID := newDataDir(t), newWorkerID(t)
	t.Setenv(envPool, "1")
	c := startChild(t, dataDir, workerID, poolStep)
	ts := &testServer{dataDir: dataDir, workerID: workerID}
	testenv.Eventually(t, 3*time.Minute, ts.poolReady)
	if sb, err := c.client.CreateSandbox(t.Context(), api.CreateSandbox{}); err == nil {
		t.Fatalf("CreateSandbox = %+v, want the server to die at %s", sb, poolStep)
	}
	c.waitExit(t)
	t.Setenv(envPool, "0")
	c = startChild(t, dataDir, workerID, "")
	all, err := c.client.Sandboxes(t.Context(), client.ListOptions{})
	if err != nil || len(all) != 0 {
		t.Fatalf("Sandboxes after restart = %+v, %v; want the interrupted create rolled back", all, err)
	}
	sb, err := c.client.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("CreateSandbox after restart = %v", err)
	}
	if err := c.client.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	assertNoLeftovers(t, ts)
}

// TestCrashDuringSnapshot kills the server at each step of taking a
// snapshot of a sandbox that already has one. After each restart the
// earlier snapshot is listed and usable, the interrupted one is nowhere
// (not listed, no directory on the worker, no manifest in the chunk
// store), and the sandbox runs on (a crash while the guest was paused
// must not leave it frozen).
func TestCrashDuringSnapshot(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	dataDir, workerID := newDataDir(t), newWorkerID(t)
	ctx := t.Context()
	c := startChild(t, dataDir, workerID, "")
	sb, err := c.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	counter := startCounter(t, c.client, sb.ID)
	count := func(t *testing.T) int { return readCounter(t, c.client, sb.ID) }
	execOut(t, c.client, sb.ID, sh("echo kept > /root/f; sync"))
	good, err := c.client.CreateSnapshot(ctx, sb.ID, "good")
	if err != nil {
		t.Fatalf("CreateSnapshot(good) = %v", err)
	}
	c.kill(t, syscall.SIGTERM)

	for _, step := range append(slices.Clone(controlplane.CrashPoints), worker.CrashPoints...) {
		if !isSnapshotStep(step) {
			continue
		}
		t.Run(step, func(t *testing.T) {
			c = startChild(t, dataDir, workerID, step)
			if sn, err := c.client.CreateSnapshot(ctx, sb.ID, "interrupted"); err == nil {
				t.Fatalf("CreateSnapshot = %s, want the server to die at %s", sn.ID, step)
			}
			c.waitExit(t)
			c = startChild(t, dataDir, workerID, "")
			sns, err := c.client.Snapshots(ctx, "")
			if err != nil {
				t.Fatalf("Snapshots = %v", err)
			}
			if len(sns) != 1 || sns[0].ID != good.ID || sns[0].State != "ready" {
				t.Errorf("Snapshots after restart = %+v, want only %s ready", sns, good.ID)
			}
			for dir, want := range map[string]string{
				filepath.Join(dataDir, "worker", "snapshots"): good.ID,
				filepath.Join(dataDir, "chunks", "manifests"): good.ID,
			} {
				entries, _ := os.ReadDir(dir)
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				if len(names) != 1 || names[0] != want {
					t.Errorf("%s holds %q, want only %s", dir, names, want)
				}
			}
			if got, err := c.client.Sandbox(ctx, sb.ID); err != nil || got.State != "running" {
				t.Fatalf("Sandbox after restart = %+v, %v; want running", got, err)
			}
			before := count(t) // it advances: the guest is not left paused
			testenv.Eventually(t, 30*time.Second, func() bool { return count(t) > before })
			c.kill(t, syscall.SIGTERM)
		})
	}

	// The earlier snapshot still restores: file and counter as they were.
	c = startChild(t, dataDir, workerID, "")
	if err := c.client.Signal(ctx, sb.ID, counter.ID, int(syscall.SIGKILL)); err != nil {
		t.Fatalf("Signal(counter) = %v", err)
	}
	execOut(t, c.client, sb.ID, sh("echo changed > /root/f; echo 0 > /tmp/count"))
	if _, err := c.client.RestoreSandbox(ctx, sb.ID, "good"); err != nil {
		t.Fatalf("RestoreSandbox(good) = %v", err)
	}
	if out, _, _ := execOut(t, c.client, sb.ID, sh("cat /root/f")); out != "kept\n" {
		t.Errorf("after restore /root/f = %q, want kept", out)
	}
	at := count(t)
	if at == 0 {
		t.Errorf("after restore the counter reads 0, want its value at the snapshot")
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return count(t) > at })
	if err := c.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	if err := c.client.DeleteSnapshot(ctx, good.ID); err != nil {
		t.Fatalf("DeleteSnapshot = %v", err)
	}
	assertNoLeftovers(t, &testServer{dataDir: dataDir, workerID: workerID})
}

// TestReadoptAfterRestart kills the server (SIGKILL, then SIGTERM) while
// a sandbox runs a detached counter: the VM keeps running, the restarted
// server re-adopts it (same VMM pid) and the counter keeps advancing.
func TestReadoptAfterRestart(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	dataDir, workerID := newDataDir(t), newWorkerID(t)
	c := startChild(t, dataDir, workerID, "")
	ctx := t.Context()
	sb, err := c.client.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	counter, err := c.client.StartDetached(ctx, sb.ID, api.Exec{Detach: true,
		Shell: "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"})
	if err != nil {
		t.Fatalf("StartDetached = %v", err)
	}
	pid := sb.VM.PID
	read := func(c *child) int {
		var out strings.Builder
		if _, err := c.client.ReadFile(ctx, sb.ID, "/tmp/count", &out); client.IsNotFound(err) {
			return 0 // not written yet
		} else if err != nil {
			t.Fatalf("read counter: %v", err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(out.String()))
		return n
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return read(c) > 0 })
	before := read(c)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		c.kill(t, sig)
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("after %v of the server: vm pid %d: %v", sig, pid, err)
		}
		c = startChild(t, dataDir, workerID, "")
		got, err := c.client.Sandbox(ctx, sb.ID)
		if err != nil || got.State != "running" || got.VM == nil || got.VM.PID != pid {
			t.Fatalf("after %v: Sandbox = %+v, %v; want running on vm pid %d", sig, got, err, pid)
		}
		testenv.Eventually(t, 30*time.Second, func() bool { return read(c) > before })
		before = read(c)
		p, err := c.client.Process(ctx, sb.ID, counter.ID)
		if err != nil || !p.Running {
			t.Errorf("after %v: counter process = %+v, %v; want running", sig, p, err)
		}
		t.Logf("after %v: same vm pid %d, counter at %d", sig, pid, before)
	}
	if err := c.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox = %v", err)
	}
	// The VMM's parent was the first server process; init reaps it.
	testenv.Eventually(t, 10*time.Second, func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) })
	assertNoLeftovers(t, &testServer{dataDir: dataDir, workerID: workerID})
}
