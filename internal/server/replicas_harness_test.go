package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/controlplane"
	"space/internal/sandbox"
	"space/internal/secrets"
	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/testenv"
	"space/internal/testenv/pgtest"
)

// Timeouts of the replica tests' child processes and calls.
const (
	procReadyTimeout = 2 * time.Minute // start until READY
	procStopTimeout  = 30 * time.Second
	callTimeout      = 2 * time.Minute // one API call
	// callAttempts bounds the tries of one API call that keeps failing in
	// transport (its replica down or dying under it), over the replicas
	// in turn.
	callAttempts = 30
)

// leaderLease is the name of the lease the background-work leader holds
// (package leader's default).
const leaderLease = "leader"

// proc is a control-plane replica or a worker running as a child process
// of this test binary (see TestMain).
type proc struct {
	cmd  *exec.Cmd
	url  string        // what it printed on READY
	log  string        // its stderr (kept across restarts)
	done chan struct{} // closed once it has exited and been waited for
	// exited is when it was waited for; read it once done is closed.
	exited time.Time
}

// startProc runs this test binary as a child with env (which selects
// what it runs) and returns once it serves. name names its log file in
// logDir. When tb ends the child gets SIGTERM, then SIGKILL, if it still
// runs.
func startProc(tb testing.TB, name, logDir string, env ...string) *proc {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatalf("setup: %v", err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatalf("setup: %v", err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("setup: start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, log: logf.Name(), done: make(chan struct{})}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				select {
				case urlc <- u:
				default:
				}
			}
		}
		io.Copy(io.Discard, out)
	}()
	go func() { cmd.Wait(); p.exited = time.Now(); close(p.done) }()
	tb.Cleanup(p.stop)
	select {
	case p.url = <-urlc:
	case <-p.done:
		tb.Fatalf("setup: %s exited before serving (%v):\n%s", name, cmd.ProcessState, tail(p.log, 40))
	case <-time.After(procReadyTimeout):
		tb.Fatalf("setup: %s not ready in %v:\n%s", name, procReadyTimeout, tail(p.log, 40))
	}
	return p
}

// stop ends the child if it still runs: SIGTERM, then SIGKILL after
// procStopTimeout.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(procStopTimeout):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// kill sends sig to the child and waits for it to exit.
func (p *proc) kill(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Fatalf("signal %v: %v", sig, err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		tb.Fatalf("process %d did not exit within 1m of %v", p.cmd.Process.Pid, sig)
	}
}

// crashed waits up to timeout for the child to die at its crash point
// and reports whether it did (killed by SIGKILL).
func (p *proc) crashed(timeout time.Duration) bool {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// cluster is a control plane of replica processes sharing one
// PostgreSQL database, with standalone workers on the fake VMM, also in
// processes of their own.
type cluster struct {
	storeURL   string          // the replicas' store
	store      *postgres.Store // the test's own connection to it
	token      string          // the worker token the replicas and workers share
	secretsKey string          // the secrets key file the replicas share
	chunks     string          // the chunk store the workers share
	logDir     string
	replicas   []*replica
	workers    []*fakeWorker
	adminKey   string // replica 0's first admin key
}

// replica is one control-plane replica: a data dir and an address of its
// own, and the process serving them while it runs.
type replica struct {
	i       int
	id      string // its data dir's identity (Config.WorkerID)
	dataDir string
	// addr is where it always listens: a restarted replica is where the
	// workers whose heartbeats it took last time look for it.
	addr string
	url  string
	p    *proc // the running process; owned by the test's goroutine
}

// fakeWorker is a standalone worker on the fake VMM.
type fakeWorker struct {
	id string
	rm *controlplane.Remote // the worker protocol, as replicas call it
	p  *proc
}

// startCluster starts PostgreSQL, replicas control-plane replicas (no
// embedded worker, all on one database) and workers standalone workers
// on the fake VMM (worker i registers with replica i mod replicas), and
// returns once every replica sees every worker healthy.
func startCluster(tb testing.TB, replicas, workers int) *cluster {
	tb.Helper()
	testenv.RequireRoot(tb, testenv.TierNetns) // the fake VMM jails its guests
	dsn := pgtest.Start(tb)
	c := &cluster{storeURL: pgURL(tb, dsn), token: randomHex(32), chunks: tb.TempDir(), logDir: tb.TempDir()}
	c.secretsKey = filepath.Join(tb.TempDir(), "secrets.key")
	if _, err := secrets.LoadOrCreateKey(c.secretsKey); err != nil {
		tb.Fatalf("setup: %v", err)
	}
	c.addReplicas(tb, 1)
	st, err := postgres.Open(tb.Context(), dsn) // after replica 0 migrated it
	if err != nil {
		tb.Fatalf("setup: %v", err)
	}
	tb.Cleanup(func() { st.Close() })
	c.store = st
	key, err := os.ReadFile(filepath.Join(c.replicas[0].dataDir, AdminKeyFile))
	if err != nil {
		tb.Fatalf("setup: %v", err)
	}
	c.adminKey = strings.TrimSpace(string(key))
	c.addReplicas(tb, replicas-1)
	for i := range workers {
		c.startWorker(tb, c.replicas[i%replicas].url)
	}
	// Registered last, so it runs first: before the workers and replicas
	// stop, it removes from the workers what a failed test left there
	// (guests outlive their worker).
	tb.Cleanup(func() { c.clearWorkers(tb) })
	c.waitWorkers(tb)
	return c
}

// addReplicas starts n more replicas.
func (c *cluster) addReplicas(tb testing.TB, n int) {
	tb.Helper()
	for range n {
		i := len(c.replicas)
		r := &replica{i: i, id: fmt.Sprintf("replica%d-%s", i, randomHex(4)), dataDir: tb.TempDir(), addr: freeAddr(tb)}
		r.url = "http://" + r.addr
		c.replicas = append(c.replicas, r)
		c.start(tb, r, "")
	}
}

// start runs replica r; crashAt names its crash point or is "".
func (c *cluster) start(tb testing.TB, r *replica, crashAt string) {
	tb.Helper()
	r.p = startProc(tb, fmt.Sprintf("replica%d", r.i), c.logDir,
		envChild+"=1", envDataDir+"="+r.dataDir, envWorkerID+"="+r.id, envNoWorker+"=1", envVMM+"="+VMMFake,
		envStore+"="+c.storeURL, envListen+"="+r.addr, envToken+"="+c.token, envSecretsKey+"="+c.secretsKey,
		envCrashAt+"="+crashAt, "SPACE_TEST_LOG=1")
	if r.p.url != r.url {
		tb.Fatalf("setup: replica %d serves on %s, want %s", r.i, r.p.url, r.url)
	}
}

// restart stops replica r (SIGTERM) and starts it again on its data dir
// with crash point crashAt.
func (c *cluster) restart(tb testing.TB, r *replica, crashAt string) {
	tb.Helper()
	r.p.kill(tb, syscall.SIGTERM)
	c.start(tb, r, crashAt)
}

// startWorker runs a standalone worker on the fake VMM that registers
// with the replica at cpURL.
func (c *cluster) startWorker(tb testing.TB, cpURL string) {
	tb.Helper()
	dataDir, id := newDataDir(tb), newWorkerID(tb) // their cleanups run after the worker stops
	w := &fakeWorker{id: id}
	w.p = startProc(tb, "worker-"+id, c.logDir,
		envWorkerChild+"=1", envWorkerDataDir+"="+dataDir, envWorkerCP+"="+cpURL, envWorkerToken+"="+c.token,
		envWorkerChunks+"="+c.chunks, envWorkerVMM+"="+VMMFake, envWorkerOwnID+"="+id, "SPACE_TEST_LOG=1")
	rm, err := controlplane.NewRemote(id, w.p.url, c.token)
	if err != nil {
		tb.Fatalf("setup: %v", err)
	}
	tb.Cleanup(func() { rm.Close() })
	w.rm = rm
	c.workers = append(c.workers, w)
}

// waitWorkers waits until every replica lists every worker healthy.
func (c *cluster) waitWorkers(tb testing.TB) {
	tb.Helper()
	for _, r := range c.replicas {
		var n int
		var err error
		if poll(tb.Context(), 50*time.Millisecond, time.Minute, func() bool {
			n, err = c.healthyWorkers(tb.Context(), r)
			return err == nil && n == len(c.workers)
		}) {
			continue
		}
		var logs strings.Builder
		for _, p := range append([]*proc{r.p}, c.workerProcs()...) {
			fmt.Fprintf(&logs, "%s:\n%s\n", filepath.Base(p.log), tail(p.log, 20))
		}
		tb.Fatalf("setup: replica %d sees %d of %d workers healthy after 1m (%v)\n%s", r.i, n, len(c.workers), err, logs.String())
	}
}

func (c *cluster) workerProcs() []*proc {
	var out []*proc
	for _, w := range c.workers {
		out = append(out, w.p)
	}
	return out
}

// healthyWorkers returns how many workers replica r lists healthy.
func (c *cluster) healthyWorkers(ctx context.Context, r *replica) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/v1/workers", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var l api.WorkerList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &l) != nil {
		return 0, fmt.Errorf("GET /v1/workers = %d %s", resp.StatusCode, body)
	}
	n := 0
	for _, w := range l.Workers {
		if w.Healthy {
			n++
		}
	}
	return n, nil
}

// clients returns a client of each replica with key.
func (c *cluster) clients(tb testing.TB, key string) []*client.Client {
	tb.Helper()
	var out []*client.Client
	for _, r := range c.replicas {
		cl, err := client.New(r.url, key)
		if err != nil {
			tb.Fatalf("setup: %v", err)
		}
		out = append(out, cl)
	}
	return out
}

// clearWorkers deletes every sandbox left on the workers, directly.
func (c *cluster) clearWorkers(tb testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, w := range c.workers {
		infos, err := w.rm.List(ctx)
		if err != nil {
			tb.Errorf("cleanup: list worker %s: %v", w.id, err)
			continue
		}
		for _, inf := range infos {
			if err := w.rm.Delete(ctx, inf.ID); err != nil {
				tb.Errorf("cleanup: delete %s on worker %s: %v", inf.ID, w.id, err)
			}
		}
		if len(infos) > 0 {
			tb.Logf("cleanup: deleted %d sandboxes left on worker %s", len(infos), w.id)
		}
	}
}

// leader returns the replica that holds the leader lease and the lease;
// ok is false while no replica holds it.
func (c *cluster) leader(ctx context.Context) (r *replica, l store.Lease, ok bool, err error) {
	ls, err := c.store.ListLeases(ctx, leaderLease)
	if err != nil {
		return nil, store.Lease{}, false, err
	}
	for _, l := range ls {
		if l.Name != leaderLease || l.Expired {
			continue
		}
		for _, r := range c.replicas {
			if r.holds(l) {
				return r, l, true, nil
			}
		}
		return nil, l, false, fmt.Errorf("lease %q is held by %q, which names none of the replicas", l.Name, l.Holder)
	}
	return nil, store.Lease{}, false, nil
}

// holds reports whether lease l's holder is r: holders are
// "REPLICA/LIFE", REPLICA being the ID in the data dir's replica.id.
func (r *replica) holds(l store.Lease) bool {
	b, err := os.ReadFile(filepath.Join(r.dataDir, "replica.id"))
	id := strings.TrimSpace(string(b))
	return err == nil && id != "" && strings.HasPrefix(l.Holder, id+"/")
}

// logEvents counts, in replica r's log, the lines of each reconcile
// event that tells what a replica did to another's work.
func (r *replica) logEvents() map[string]int {
	b, _ := os.ReadFile(r.p.log)
	out := map[string]int{}
	for _, ev := range []string{
		"rolling back interrupted create", "completing interrupted create", "finishing interrupted delete",
		"settling interrupted snapshot", "worker lost the sandbox",
	} {
		if n := bytes.Count(b, []byte(`msg="`+ev+`"`)); n > 0 {
			out[ev] = n
		}
	}
	return out
}

// pgURL turns pgtest's key=value DSN into the postgres:// URL `space
// server --store` takes.
func pgURL(tb testing.TB, dsn string) string {
	tb.Helper()
	kv := map[string]string{}
	for _, f := range strings.Fields(dsn) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			tb.Fatalf("setup: dsn %q: field %q", dsn, f)
		}
		kv[k] = v
	}
	q := url.Values{"host": {kv["host"]}, "port": {kv["port"]}, "sslmode": {kv["sslmode"]}}
	u := url.URL{Scheme: "postgres", User: url.User(kv["user"]), Path: "/" + kv["dbname"], RawQuery: q.Encode()}
	return u.String()
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("setup: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// poll calls cond every interval until it returns true, timeout passes
// or ctx ends, and reports whether cond returned true: for waits whose
// failure the caller reports in its own words.
func poll(ctx context.Context, interval, timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for !cond() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// transportFailure reports whether err is a call that got no answer of
// the API's: its replica was down, or died during the call.
func transportFailure(err error) bool {
	var e *client.Error
	return err != nil && !errors.As(err, &e)
}

// hasStatus reports whether err is the API's answer with HTTP status.
func hasStatus(err error, status int) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Status == status
}

// onReplicas calls f with replica first, then with the next ones in turn
// for as long as it fails in transport (a replica that is down or dies
// mid-call), up to callAttempts calls, each under callTimeout. It returns
// f's last error and how many calls failed in transport before it.
func onReplicas(ctx context.Context, n, first int, f func(ctx context.Context, i int) error) (retries int, err error) {
	for a := 0; ; a++ {
		actx, cancel := context.WithTimeout(ctx, callTimeout)
		err = f(actx, (first+a)%n)
		cancel()
		if !transportFailure(err) || ctx.Err() != nil || a+1 == callAttempts {
			return a, err
		}
		if (a+1)%n == 0 { // every replica failed: one may be restarting
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

// monitor polls, until stopped, the team's quota usage through the
// replicas and the team's guests on the workers, and keeps the highest
// of each.
type monitor struct {
	stop func() // stops the polling and waits for it

	mu sync.Mutex
	// +checklocks:mu
	maxUsed int // highest quota usage a replica reported
	// +checklocks:mu
	maxGuests int // highest count of the team's sandboxes on the workers
	// +checklocks:mu
	polls int
}

func startMonitor(c *cluster, clients []*client.Client, team string) *monitor {
	m := &monitor{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	m.stop = func() { cancel(); wg.Wait() }
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			used := -1
			for a := range clients { // the first live replica
				qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
				q, err := clients[(i+a)%len(clients)].Quota(qctx)
				qcancel()
				if err == nil {
					used = q.Used.Sandboxes
					break
				}
			}
			guests := 0
			for _, w := range c.workers {
				lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
				infos, _ := w.rm.List(lctx)
				lcancel()
				for _, inf := range infos {
					if inf.Team == team {
						guests++
					}
				}
			}
			m.mu.Lock()
			m.maxUsed, m.maxGuests = max(m.maxUsed, used), max(m.maxGuests, guests)
			m.polls++
			m.mu.Unlock()
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	})
	return m
}

func (m *monitor) highs() (used, guests, polls int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxUsed, m.maxGuests, m.polls
}

// awaitNewLeader waits up to a minute for a replica other than dead to
// take the leader lease after dead (which held old) died, and returns
// how long that took; it fails t if none does.
func (c *cluster) awaitNewLeader(ctx context.Context, t *testing.T, dead *replica, old store.Lease) time.Duration {
	t.Helper()
	t0 := time.Now()
	var took time.Duration
	if !poll(ctx, 50*time.Millisecond, time.Minute, func() bool {
		r, l, ok, err := c.leader(ctx)
		if err != nil || !ok || r == dead || l.Token <= old.Token {
			return false
		}
		took = time.Since(t0)
		t.Logf("replica %d took the lease (holder %q, token %d)", r.i, l.Holder, l.Token)
		return true
	}) {
		t.Errorf("no live replica took the %q lease within 1m of its holder's death", leaderLease)
	}
	return took
}

// unsettled returns what is not yet as it must be once the replicas have
// settled: acked are the creates answered 201 (sandbox → the worker
// named), deleted the sandboxes deleted since, snapped the snapshots
// answered 201 (snapshot → sandbox).
func (c *cluster) unsettled(ctx context.Context, team string, acked map[string]string, deleted map[string]bool, snapped map[string]string) []string {
	var problems []string
	recs, err := c.store.ListSandboxes(ctx, team, store.Filter{})
	if err != nil {
		return []string{fmt.Sprintf("list the team's sandboxes: %v", err)}
	}
	byID := map[string]store.Sandbox{}
	for _, rec := range recs {
		if rec.State == store.StateDeleted {
			continue
		}
		byID[rec.ID] = rec
		if rec.State != store.StateRunning {
			problems = append(problems, fmt.Sprintf("record %s is %s on worker %q, want running or gone", rec.ID, rec.State, rec.WorkerID))
		}
	}
	on := map[string][]string{} // sandbox → the workers that run it
	for _, w := range c.workers {
		infos, err := w.rm.List(ctx)
		if err != nil {
			problems = append(problems, fmt.Sprintf("list worker %s: %v", w.id, err))
			continue
		}
		for _, inf := range infos {
			if inf.Team != team {
				continue
			}
			on[inf.ID] = append(on[inf.ID], w.id)
			rec, ok := byID[inf.ID]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("worker %s runs %s (%s), which the store has no record of", w.id, inf.ID, inf.State))
			case rec.WorkerID != w.id:
				problems = append(problems, fmt.Sprintf("worker %s runs %s, which the store places on %q", w.id, inf.ID, rec.WorkerID))
			case inf.State != store.StateRunning:
				problems = append(problems, fmt.Sprintf("worker %s has %s %s, want running", w.id, inf.ID, inf.State))
			}
		}
	}
	for id, ws := range on {
		if len(ws) > 1 {
			problems = append(problems, fmt.Sprintf("%s runs on %d workers: %v", id, len(ws), ws))
		}
	}
	for _, rec := range byID {
		if rec.State == store.StateRunning && len(on[rec.ID]) == 0 {
			problems = append(problems, fmt.Sprintf("record %s says running on %q, but no worker runs it", rec.ID, rec.WorkerID))
		}
	}
	for id, named := range acked {
		_, recorded := byID[id]
		switch {
		case deleted[id] && (recorded || len(on[id]) > 0):
			problems = append(problems, fmt.Sprintf("deleted %s is still recorded (%v) or on workers %v", id, recorded, on[id]))
		case !deleted[id] && !recorded:
			problems = append(problems, fmt.Sprintf("%s, created (201, on %s), has no record", id, named))
		case !deleted[id] && !slices.Contains(on[id], named):
			problems = append(problems, fmt.Sprintf("%s, created (201) on %s, runs on %v", id, named, on[id]))
		}
	}
	sns, err := c.store.ListSnapshots(ctx, team, "")
	if err != nil {
		return append(problems, fmt.Sprintf("list the team's snapshots: %v", err))
	}
	ready := map[string]bool{}
	for _, sn := range sns {
		if sn.State != store.SnapshotReady {
			problems = append(problems, fmt.Sprintf("snapshot %s of %s is %s, want ready or gone", sn.ID, sn.SandboxID, sn.State))
		}
		ready[sn.ID] = sn.State == store.SnapshotReady
	}
	for id, sb := range snapped {
		if !ready[id] {
			problems = append(problems, fmt.Sprintf("snapshot %s of %s (201) is not listed ready", id, sb))
		}
	}
	slices.Sort(problems)
	return problems
}

// deleteAll deletes the team's snapshots and sandboxes through the
// replicas and checks the workers are left with none of the team's.
func (c *cluster) deleteAll(ctx context.Context, t *testing.T, clients []*client.Client, team string) {
	t.Helper()
	sns, err := c.store.ListSnapshots(ctx, team, "")
	if err != nil {
		t.Fatalf("ListSnapshots = %v", err)
	}
	for i, sn := range sns {
		if _, err := onReplicas(ctx, len(clients), i, func(ctx context.Context, j int) error {
			return clients[j].DeleteSnapshot(ctx, sn.ID)
		}); err != nil && !client.IsNotFound(err) {
			t.Errorf("DeleteSnapshot(%s) = %v", sn.ID, err)
		}
	}
	recs, err := c.store.ListSandboxes(ctx, team, store.Filter{})
	if err != nil {
		t.Fatalf("ListSandboxes = %v", err)
	}
	for i, rec := range recs {
		if _, err := onReplicas(ctx, len(clients), i, func(ctx context.Context, j int) error {
			return clients[j].DeleteSandbox(ctx, rec.ID)
		}); err != nil && !client.IsNotFound(err) {
			t.Errorf("DeleteSandbox(%s) = %v", rec.ID, err)
		}
	}
	for _, w := range c.workers {
		infos, err := w.rm.List(ctx)
		if err != nil {
			t.Errorf("list worker %s: %v", w.id, err)
		}
		for _, inf := range infos {
			if inf.Team == team {
				t.Errorf("worker %s still runs %s (%s) after every record's delete", w.id, inf.ID, inf.State)
			}
		}
	}
}

// BenchmarkReplicaCreates measures creates through the API on the fake
// VMM (two standalone workers), 8 at a time, round-robin over one
// replica and then three on one PostgreSQL database, deleting each
// sandbox as soon as it is made so that neither quota nor capacity
// binds. It reports creates/s, the latency's p50 and p99, the guest's
// own boot time (VM.BootMS: VMM start until the agent answered) and the
// latency beyond it: the control plane's and the worker's other work.
//
//	go test -run '^$' -bench ReplicaCreates -benchtime 100x ./internal/server
func BenchmarkReplicaCreates(b *testing.B) {
	c := startCluster(b, 1, 2)
	key := c.newTeamKey(b, "bench", api.Quota{Sandboxes: 1 << 20}) // never binds
	b.Run("replicas=1", func(b *testing.B) { benchCreates(b, c.clients(b, key)) })
	c.addReplicas(b, 2)
	c.waitWorkers(b)
	b.Run("replicas=3", func(b *testing.B) { benchCreates(b, c.clients(b, key)) })
}

// newTeamKey makes team with quota q and returns the secret of a key of
// the team's.
func (c *cluster) newTeamKey(tb testing.TB, team string, q api.Quota) string {
	tb.Helper()
	admin, err := client.New(c.replicas[0].url, c.adminKey)
	if err != nil {
		tb.Fatalf("setup: %v", err)
	}
	k, err := admin.CreateAPIKey(tb.Context(), api.CreateAPIKey{Name: team, Team: team})
	if err != nil {
		tb.Fatalf("setup: CreateAPIKey = %v", err)
	}
	if _, err := admin.SetQuota(tb.Context(), team, q); err != nil {
		tb.Fatalf("setup: SetQuota = %v", err)
	}
	return k.Secret
}

func benchCreates(b *testing.B, clients []*client.Client) {
	const par = 8
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()
	spec := api.CreateSandbox{VCPUs: 1, MemoryMiB: 128, DiskMiB: 512}
	// Each worker's first create boots and captures the warm template.
	for i := range 4 {
		sb, err := clients[i%len(clients)].CreateSandbox(ctx, spec)
		if err == nil {
			err = clients[i%len(clients)].DeleteSandbox(ctx, sb.ID)
		}
		if err != nil {
			b.Fatalf("warm-up: %v", err)
		}
	}
	var (
		took = make([]time.Duration, b.N)
		boot = make([]time.Duration, b.N)
		next atomic.Int64
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		dwg  sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	made := make(chan string, b.N)
	for i := range par / 2 {
		dwg.Go(func() {
			for id := range made {
				if err := clients[i%len(clients)].DeleteSandbox(ctx, id); err != nil {
					fail(fmt.Errorf("delete %s: %w", id, err))
				}
			}
		})
	}
	b.ResetTimer()
	t0 := time.Now()
	for range par {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N || ctx.Err() != nil {
					return
				}
				t := time.Now()
				sb, err := clients[i%len(clients)].CreateSandbox(ctx, spec)
				took[i] = time.Since(t)
				if err != nil {
					fail(fmt.Errorf("create %d: %w", i, err))
					continue
				}
				if sb.VM != nil {
					boot[i] = time.Duration(sb.VM.BootMS) * time.Millisecond
				}
				made <- sb.ID
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	close(made)
	dwg.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d creates or deletes failed, first: %v", len(errs), b.N, errs[0])
	}
	over := make([]time.Duration, b.N)
	for i := range took {
		over[i] = took[i] - boot[i]
	}
	for _, s := range [][]time.Duration{took, boot, over} {
		slices.Sort(s)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "creates/s")
	b.ReportMetric(ms(took[b.N/2]), "p50-ms")
	b.ReportMetric(ms(took[b.N*99/100]), "p99-ms")
	b.ReportMetric(ms(boot[b.N/2]), "boot-p50-ms")
	b.ReportMetric(ms(over[b.N/2]), "beyond-boot-p50-ms")
	b.ReportMetric(ms(over[b.N*99/100]), "beyond-boot-p99-ms")
}

// createAll sends n creates of spec, inFlight at once, round-robin over
// clients, and returns the sandboxes answered 201, how many were refused
// with 429, and every other failure.
func createAll(ctx context.Context, clients []*client.Client, spec api.CreateSandbox, n, inFlight int) (ok []string, refused int, failures []string) {
	var mu sync.Mutex
	jobs := make(chan int)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(jobs)
		for i := range n {
			jobs <- i
		}
	})
	for range inFlight {
		wg.Go(func() {
			for i := range jobs {
				sb, err := clients[i%len(clients)].CreateSandbox(ctx, spec)
				mu.Lock()
				switch {
				case err == nil:
					ok = append(ok, sb.ID)
				case hasStatus(err, http.StatusTooManyRequests):
					refused++
				default:
					failures = append(failures, err.Error())
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ok, refused, failures
}

// claimsOf returns the keys of the claims replica r's processes hold in
// the store (the sandboxes and snapshots it was working on).
func (c *cluster) claimsOf(ctx context.Context, tb testing.TB, r *replica) []string {
	tb.Helper()
	ls, err := c.store.ListLeases(ctx, "claim/")
	if err != nil {
		tb.Fatalf("list claims: %v", err)
	}
	var keys []string
	for _, l := range ls {
		if r.holds(l) {
			key, _ := strings.CutSuffix(strings.TrimPrefix(l.Name, "claim/"), "/"+l.Holder)
			keys = append(keys, key)
		}
	}
	return keys
}

// settledBy bounds how long the other replicas may take to settle what a
// dead one was doing: its claims expire (5 s), and the leader, which
// watches for dead claims every second (or a new leader, within its
// lease's 8 s), settles them; with room for a loaded machine.
const settledBy = 15 * time.Second

// awaitSettled waits, while the replica that claimed them is down, until
// the other replicas have settled the records with keys: no sandbox
// among them is creating or stopping and no snapshot creating or
// deleting. It fails the test past settledBy and returns the time taken.
func (c *cluster) awaitSettled(ctx context.Context, tb testing.TB, team string, keys []string, died time.Time) time.Duration {
	tb.Helper()
	var left []string
	done := poll(ctx, 100*time.Millisecond, time.Until(died.Add(settledBy)), func() bool {
		left = left[:0]
		for _, key := range keys {
			if strings.HasPrefix(key, "sbx_") {
				sb, err := c.store.Sandbox(ctx, team, key)
				if err == nil && (sb.State == sandbox.Creating || sb.State == sandbox.Stopping) {
					left = append(left, key+" "+string(sb.State))
				}
			}
			if strings.HasPrefix(key, "snp_") {
				sn, err := c.store.Snapshot(ctx, team, key)
				if err == nil && (sn.State == store.SnapshotCreating || sn.State == store.SnapshotDeleting) {
					left = append(left, key+" "+string(sn.State))
				}
			}
		}
		return len(left) == 0
	})
	if !done {
		tb.Errorf("%d records a dead replica claimed are not settled by the others %v after its death: %v", len(keys), settledBy, left)
	}
	return time.Since(died)
}
