package server

import (
	"errors"
	"os"
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
	"space/internal/egress/egresstest"
	"space/internal/testenv"
	"space/internal/testenv/weedtest"
	"space/internal/workerproto"
)

// recoveryAfter is the tests' RecoverAfter: short, for time, and above
// the minimum.
const recoveryAfter = 10 * time.Second

// s3Worker is a standalone worker on real VMs in a child process, on an
// S3 chunk store, with a fixed ID and data dir so it can be restarted.
type s3Worker struct {
	id, dataDir string
	env         []string
	p           *proc
	rm          *controlplane.Remote
}

// startS3Worker runs a worker registered with ts on srv's bucket.
func startS3Worker(t testing.TB, ts *testServer, srv weedtest.Server, logDir string, env ...string) *s3Worker {
	t.Helper()
	agent := guesttest.Agent(t)
	token, err := os.ReadFile(filepath.Join(ts.dataDir, WorkerTokenFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	w := &s3Worker{id: newWorkerID(t), dataDir: newDataDir(t)}
	w.env = []string{envWorkerChild + "=1", envWorkerDataDir + "=" + w.dataDir, envWorkerCP + "=" + ts.url,
		envWorkerToken + "=" + strings.TrimSpace(string(token)), envAgent + "=" + agent, envWorkerOwnID + "=" + w.id,
		envWorkerChunks + "=" + s3Chunks(srv).Location, "SPACE_S3_ACCESS_KEY=" + srv.AccessKey, "SPACE_S3_SECRET_KEY=" + srv.SecretKey,
		"SPACE_TEST_LOG=1"}
	w.env = append(w.env, env...)
	w.start(t, logDir)
	t.Cleanup(func() {
		if w.p != nil {
			w.p.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	return w
}

func (w *s3Worker) start(t testing.TB, logDir string) {
	t.Helper()
	w.p = startProc(t, "worker-"+w.id, logDir, w.env...)
	rm, err := controlplane.NewRemote(w.id, w.p.url, envValue(w.env, envWorkerToken))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { rm.Close() })
	w.rm = rm
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// holds reports whether worker w lists sandbox id.
func (w *s3Worker) holds(t testing.TB, id string) bool {
	t.Helper()
	infos, err := w.rm.List(t.Context())
	if err != nil {
		t.Fatalf("list worker %s: %v", w.id, err)
	}
	return slices.ContainsFunc(infos, func(i workerproto.Info) bool { return i.ID == id })
}

// procState returns the state letter of process pid ("" if it is gone).
func procState(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+1:])
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// alive reports whether process pid exists (and is not a zombie).
func alive(pid int) bool {
	st := procState(pid)
	return st != "" && st != "Z"
}

// startRecoveryRig starts, on all the VM slots, an S3 chunk store, a
// control plane without a worker that recovers after recoveryAfter, and
// two standalone workers on real VMs, and waits until both are healthy.
// The workers' gateways reach an egresstest upstream as api.test and
// other.test. It returns the workers' log dir too (for restarts).
func startRecoveryRig(tb testing.TB) (ts *testServer, a, b *s3Worker, logDir string, up *egresstest.Upstream) {
	tb.Helper()
	testenv.RequireSlow(tb)
	tb.Cleanup(guesttest.AcquireAllSlots(tb))
	srv := weedtest.Start(tb)
	up = egresstest.Start(tb)
	ca := filepath.Join(tb.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, up.CAPEM, 0o600); err != nil {
		tb.Fatalf("setup: %v", err)
	}
	egress := envWorkerEgress + "=" + up.Netns + ";" + ca + ";api.test=" + egresstest.Addr.String() + ",other.test=" + egresstest.Addr.String()
	ts = startServerTB(tb, Config{NoWorker: true, Chunks: s3Chunks(srv), RecoverAfter: recoveryAfter})
	logDir = tb.TempDir()
	a, b = startS3Worker(tb, ts, srv, logDir, egress), startS3Worker(tb, ts, srv, logDir, egress)
	ts.deleteAllOnCleanup(tb) // before the workers stop
	waitWorkersHealthy(tb, ts, 2)
	return ts, a, b, logDir, up
}

// waitWorkersHealthy waits until ts lists n workers healthy.
func waitWorkersHealthy(tb testing.TB, ts *testServer, n int) {
	tb.Helper()
	testenv.Eventually(tb, time.Minute, func() bool {
		status, body := rawCall(tb, ts, "GET", "/v1/workers", "")
		return status == 200 && strings.Count(body, `"healthy":true`) == n
	})
}

// TestRecoverFromLostWorker: two standalone workers on real VMs and an S3
// chunk store; a sandbox with a 5 s checkpoint policy, a network policy,
// a secret and labels counts in a file every 0.2 s on worker A. Worker A
// and its VMM are killed (the host is gone): the sandbox comes back on B
// with the same ID, its counter continuing from no more than one policy
// interval (plus the time a checkpoint takes) before the kill, and exec,
// files, the network policy and the secret work there (through a real
// TLS upstream in a namespace). A restarted afterwards removes its
// stale record without touching B's copy. Then the partition: a second
// sandbox on A, A's worker process SIGSTOPped past the recovery delay:
// A's fence watchdog stops A's guest before the sandbox is recovered on
// B; A SIGCONTed: its guest is removed and it never serves the sandbox
// again.
func TestRecoverFromLostWorker(t *testing.T) {
	ts, a, b, logDir, up := startRecoveryRig(t)
	c := ts.client
	ctx := t.Context()
	secret := "sk-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := c.CreateSecret(ctx, api.CreateSecret{Name: "token", Value: []byte(secret), Hosts: []string{"api.test"}}); err != nil {
		t.Fatalf("CreateSecret = %v", err)
	}
	create := func(label string) api.Sandbox {
		t.Helper()
		var sb api.Sandbox
		body := `{"memory_mib":384,"labels":{"run":"` + label + `"},"secrets":["token"],"network":{"allow":["other.test:443"]},"checkpoints":{"every":"5s"}}`
		if code, raw := apiJSON(t, ts, "POST", "/v1/sandboxes", body, &sb); code != 201 {
			t.Fatalf("create = %d %s", code, raw)
		}
		return sb
	}
	// Both workers are empty: the first sandbox goes to either; call that
	// one A.
	x := create("x")
	if x.Worker == b.id {
		a, b = b, a
	}
	startCounter(t, c, x.ID)
	envBefore, _, _ := execOut(t, c, x.ID, sh("env | grep -i secret | sort"))
	testenv.Eventually(t, time.Minute, func() bool { return len(history(t, ts, x.ID).Checkpoints) >= 2 })

	// The host is gone: the worker and its VMM, at once.
	vmPID := x.VM.PID
	atKill := readCounter(t, c, x.ID)
	killedAt := time.Now()
	a.p.cmd.Process.Signal(syscall.SIGKILL)
	if vmPID > 0 {
		syscall.Kill(vmPID, syscall.SIGKILL)
	}
	<-a.p.done
	var sawRecovering time.Duration
	testenv.Eventually(t, 3*time.Minute, func() bool {
		sb, err := c.Sandbox(ctx, x.ID)
		if err == nil && sb.State == "recovering" && sawRecovering == 0 {
			sawRecovering = time.Since(killedAt)
		}
		return err == nil && sb.State == "running" && sb.Worker == b.id
	})
	back := time.Since(killedAt)
	got, err := c.Sandbox(ctx, x.ID)
	if err != nil || got.RecoveredFrom == nil || got.Labels["run"] != "x" || len(got.Secrets) != 1 || got.Network == nil || !slices.Contains(got.Network.Allow, "other.test:443") {
		t.Fatalf("recovered sandbox = %+v, %v; want it with recovered_from, its labels, secret and network", got, err)
	}
	t.Logf("kill → recovering seen after %v, running on the other worker after %v; recovered_from %+v", sawRecovering, back, *got.RecoveredFrom)
	n := readCounter(t, c, x.ID)
	// The counter counts 5 a second and a checkpoint comes every 5 s (and
	// takes a moment to store): at most ~35 counts are lost.
	if n < atKill-40 {
		t.Errorf("counter on B = %d, it was %d at the kill: more than one policy interval lost", n, atKill)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return readCounter(t, c, x.ID) > n })
	if envAfter, _, _ := execOut(t, c, x.ID, sh("env | grep -i secret | sort")); envAfter != envBefore || envAfter == "" {
		t.Errorf("secret placeholders after recovery = %q, before %q", envAfter, envBefore)
	}
	if _, err := c.WriteFile(ctx, x.ID, "/root/after", strings.NewReader("on b\n"), client.WriteOptions{Mode: 0o600}); err != nil {
		t.Errorf("WriteFile after recovery = %v", err)
	}
	// The network policy and the secret hold on B: the gateway adds the
	// secret for api.test, lets other.test through without it, and
	// nothing else.
	if out, errOut, code := execOut(t, c, x.ID, sh(`curl -sS --max-time 10 -H "Authorization: Bearer $TOKEN" https://api.test/after`)); code != 0 || out != "hello api.test" {
		t.Errorf("curl api.test after recovery = %q %q (exit %d)", out, errOut, code)
	} else if got := up.Requests(); len(got) == 0 || !strings.HasPrefix(got[len(got)-1].String(), "api.test /after Bearer "+secret) {
		t.Errorf("the upstream saw %q; want the secret added on the recovered sandbox's request", got)
	}
	if _, _, code := execOut(t, c, x.ID, sh(`curl -sS --max-time 10 https://other.test/`)); code != 0 {
		t.Errorf("curl other.test after recovery: exit %d, want it allowed", code)
	}
	if _, _, code := execOut(t, c, x.ID, sh(`curl -sS --max-time 5 https://`+egresstest.Addr.String()+`/`)); code == 0 {
		t.Errorf("curl to an address the policy does not allow succeeded after recovery")
	}

	// A comes back (a new process on its data dir): it drops its stale
	// record, and B's copy runs on.
	a.start(t, logDir)
	testenv.Eventually(t, time.Minute, func() bool { return !a.holds(t, x.ID) })
	if out, _, code := execOut(t, c, x.ID, sh("cat /root/after")); code != 0 || out != "on b\n" {
		t.Errorf("B's copy after A came back: cat = %q, exit %d", out, code)
	}

	// The partition: y on A (B is busier), A stopped past the delay.
	waitWorkersHealthy(t, ts, 2)
	y := create("y")
	if y.Worker != a.id {
		t.Fatalf("second sandbox placed on %s, want %s (the emptier)", y.Worker, a.id)
	}
	startCounter(t, c, y.ID)
	testenv.Eventually(t, time.Minute, func() bool { return len(history(t, ts, y.ID).Checkpoints) >= 1 })
	a.p.cmd.Process.Signal(syscall.SIGSTOP)
	// A's fence watchdog stops A's guest once A is silent past its lease,
	// before the leader recovers the sandbox: never two running.
	testenv.Eventually(t, time.Minute, func() bool { return procState(y.VM.PID) == "T" })
	testenv.Eventually(t, 3*time.Minute, func() bool {
		sb, err := c.Sandbox(ctx, y.ID)
		return err == nil && sb.State == "running" && sb.Worker == b.id
	})
	if st := procState(y.VM.PID); st != "T" {
		t.Errorf("A's guest of %s is in state %q while B runs it, want stopped (T)", y.ID, st)
	}
	a.p.cmd.Process.Signal(syscall.SIGCONT)
	testenv.Eventually(t, time.Minute, func() bool { return !alive(y.VM.PID) })
	testenv.Eventually(t, time.Minute, func() bool { return !a.holds(t, y.ID) })
	if n := readCounter(t, c, y.ID); n == 0 {
		t.Errorf("y's counter on B = 0, want it carried over")
	}
	for _, id := range []string{x.ID, y.ID} {
		if !b.holds(t, id) {
			t.Errorf("worker B lost %s", id)
		}
	}
	if err := errors.Join(c.DeleteSandbox(ctx, x.ID), c.DeleteSandbox(ctx, y.ID)); err != nil {
		t.Errorf("delete = %v", err)
	}
}

// BenchmarkRecovery measures, in one run on real VMs and an S3 chunk
// store, how long a sandbox is down when its worker host dies: from the
// kill (worker and VMM) to the sandbox running on the other worker, and
// its parts: detection (the kill until the leader declares the worker
// lost: the recovery delay, 10 s here, after the last lease), then
// fencing and marking, then the restore from the latest checkpoint
// (fetching it from S3 into the other worker and starting the VM).
func BenchmarkRecovery(b *testing.B) {
	ts, wa, wb, logDir, _ := startRecoveryRig(b)
	c := ts.client
	ctx := b.Context()
	for b.Loop() {
		var sb api.Sandbox
		if code, raw := apiJSON(b, ts, "POST", "/v1/sandboxes", `{"memory_mib":384,"checkpoints":{"every":"5s"}}`, &sb); code != 201 {
			b.Fatalf("create = %d %s", code, raw)
		}
		victim, other := wa, wb
		if sb.Worker == wb.id {
			victim, other = wb, wa
		}
		startCounter(b, c, sb.ID)
		testenv.Eventually(b, time.Minute, func() bool { return len(history(b, ts, sb.ID).Checkpoints) >= 2 })
		killed := time.Now()
		victim.p.cmd.Process.Signal(syscall.SIGKILL)
		if sb.VM != nil && sb.VM.PID > 0 {
			syscall.Kill(sb.VM.PID, syscall.SIGKILL)
		}
		var recovering time.Time
		testenv.Eventually(b, 3*time.Minute, func() bool {
			got, err := c.Sandbox(ctx, sb.ID)
			if err == nil && got.State == "recovering" && recovering.IsZero() {
				recovering = time.Now()
			}
			return err == nil && got.State == "running" && got.Worker == other.id
		})
		running := time.Now()
		got, err := c.Sandbox(ctx, sb.ID)
		if err != nil || got.RecoveredFrom == nil {
			b.Fatalf("recovered sandbox = %+v, %v", got, err)
		}
		rf := got.RecoveredFrom
		b.ReportMetric(running.Sub(killed).Seconds(), "down-s")
		b.ReportMetric(rf.LostAt.Sub(killed).Seconds(), "detect-s")
		b.ReportMetric(rf.RecoveredAt.Sub(rf.LostAt).Seconds(), "fence+restore-s")
		b.ReportMetric(rf.LostWorkSeconds, "lost-work-s")
		b.Logf("kill → lost %v (recovery delay %v) → recovering seen %v → running %v (restore %v); lost work %.1fs",
			rf.LostAt.Sub(killed).Round(10*time.Millisecond), recoveryAfter, recovering.Sub(killed).Round(10*time.Millisecond),
			running.Sub(killed).Round(10*time.Millisecond), rf.RecoveredAt.Sub(rf.LostAt).Round(10*time.Millisecond), rf.LostWorkSeconds)
		b.StopTimer()
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			b.Fatalf("delete = %v", err)
		}
		<-victim.p.done
		victim.start(b, logDir) // for a further round
		b.StartTimer()
	}
}
