package chartcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/cachedir"
	"space/internal/hostimage"
	"space/internal/testenv"
	"space/internal/testenv/kubetest"
	"space/internal/testenv/pgtest"
)

const (
	namespace = "space"
	release   = "space" // fullname "space": the release name holds the chart's
	workerID  = kubetest.NodeName
	// hostDir holds the worker's data dir and chunk store on the node;
	// uninstalling must leave it empty.
	hostDir = "/var/lib/space-chartcluster"
	// counterFile is where the sandbox's detached counter writes.
	counterFile = "/tmp/counter"
)

// TestChartOnCluster installs the chart on a real one-node cluster and runs
// what an operator does to it: use, a worker pod deleted, the leader
// replica deleted, an upgrade to a new image tag with a sandbox running,
// and an uninstall that must leave nothing of SPACE on the node.
func TestChartOnCluster(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierK8s)
	testenv.RequireQEMU(t)
	guesttest.Images(t) // the worker pod finds the guest artifacts in the shared cache
	// The worker pod runs its VMs outside the test slots' accounting: take
	// them all, so no other package boots VMs beside it on two cores.
	defer guesttest.AcquireAllSlots(t)()
	cacheBase := guesttest.CacheBase()
	space, agent := buildBinaries(t)
	first := buildImages(t, cacheBase, space, agent, "chartcluster-1")
	second := buildImages(t, cacheBase, space, agent, "chartcluster-2")
	if first.Tag == second.Tag {
		t.Fatalf("setup: two image builds with different versions share tag %s", first.Tag)
	}

	cl := kubetest.Start(t)
	for _, img := range []hostimage.Image{first, second} {
		cl.ImportImage(t, img.Archive)
	}
	cl.Kubectl(t, "label", "node", cl.NodeName, "space/vm-host=true", "--overwrite")
	dsn := pgtest.ListenTCP(t, pgtest.Start(t), cl.NodeIP.String())
	sharedHostDir(t)
	values := writeValues(t, dsn, cacheBase, first)

	t0 := time.Now()
	cl.Helm(t, "install", release, chartDir(t), "--namespace", namespace, "--create-namespace",
		"--values", values, "--wait", "--timeout", "15m")
	t.Logf("helm install --wait: %v", time.Since(t0).Round(time.Millisecond))
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			cl.Helm(t, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "5m")
		}
	})

	c := apiClient(t, cl)
	waitWorker(t, c)

	t.Run("use", func(t *testing.T) { use(t, c) })

	sb, err := c.CreateSandbox(t.Context(), api.CreateSandbox{})
	if err != nil {
		t.Fatalf("create the counting sandbox: %v", err)
	}
	if _, err := c.StartDetached(t.Context(), sb.ID, api.Exec{
		Shell: "i=0; while :; do i=$((i+1)); echo $i > " + counterFile + "; sleep 0.2; done",
	}); err != nil {
		t.Fatalf("start the counter: %v", err)
	}
	last := waitCounting(t, c, sb.ID, 0)

	t.Run("worker pod deleted", func(t *testing.T) {
		old := podOf(t, cl, "worker")
		t0 := time.Now()
		cl.Kubectl(t, "--namespace", namespace, "delete", "pod", old.Name, "--wait")
		replaced := waitPodReady(t, cl, "worker", old.Name)
		t.Logf("worker pod %s replaced by %s, ready in %v", old.Name, replaced.Name, time.Since(t0).Round(time.Millisecond))
		last = waitCounting(t, c, sb.ID, last)
	})

	t.Run("leader replica deleted", func(t *testing.T) {
		leader, holder := leaderPod(t, cl)
		t0 := time.Now()
		cl.Kubectl(t, "--namespace", namespace, "delete", "pod", leader, "--wait")
		testenv.Eventually(t, 2*time.Minute, func() bool {
			l, err := cl.Client.CoordinationV1().Leases(namespace).Get(t.Context(), "space-leader", metav1.GetOptions{})
			return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != holder
		})
		t.Logf("leadership moved off %s in %v", leader, time.Since(t0).Round(time.Millisecond))
		// The other replica serves: the API and the sandbox through it.
		last = waitCounting(t, c, sb.ID, last)
		if _, err := retry(t, func(ctx context.Context) (string, error) { return run(ctx, c, sb.ID, "echo served") }); err != nil {
			t.Fatalf("exec after the leader went: %v", err)
		}
	})

	t.Run("upgrade", func(t *testing.T) {
		t0 := time.Now()
		cl.Helm(t, "upgrade", release, chartDir(t), "--namespace", namespace, "--values", values,
			"--set", "image.tag="+second.Tag, "--wait", "--timeout", "15m")
		t.Logf("helm upgrade --wait to %s: %v", second.Tag, time.Since(t0).Round(time.Millisecond))
		testenv.Eventually(t, 5*time.Minute, func() bool {
			pods := pods(t, cl, "")
			for _, p := range pods {
				if p.DeletionTimestamp != nil || !ready(p) || !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+second.Tag) {
					return false
				}
			}
			return len(pods) == 3
		})
		last = waitCounting(t, c, sb.ID, last)
	})

	t.Run("uninstall", func(t *testing.T) {
		// What leftovers looks for is there before: the check sees it.
		if before := leftovers(t); len(before) == 0 {
			t.Fatalf("nothing of the running worker found on the node: leftovers looks in the wrong places")
		} else {
			t.Logf("on the node before uninstall: %d things, e.g. %s", len(before), before[0])
		}
		cl.Helm(t, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "10m")
		uninstalled = true
		testenv.Eventually(t, 3*time.Minute, func() bool { return len(pods(t, cl, "")) == 0 })
		for _, left := range leftovers(t) {
			t.Errorf("left on the node after uninstall: %s", left)
		}
	})
}

// use runs each kind of call through the chart's API Service.
func use(t *testing.T, c *client.Client) {
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.State != "running" {
		t.Errorf("created sandbox state %q, want running", sb.State)
	}

	// exec, streamed: the first line arrives while the command runs.
	var out timedWriter
	exit, err := c.Exec(ctx, sb.ID, api.Exec{Shell: "for i in 1 2 3 4 5; do echo $i; sleep 0.3; done"}, &out, nil)
	if err != nil || exit.Code != 0 {
		t.Fatalf("exec: %+v, %v", exit, err)
	}
	if got := out.String(); got != "1\n2\n3\n4\n5\n" {
		t.Errorf("exec stdout = %q", got)
	}
	if spread := out.spread(); spread < 700*time.Millisecond {
		t.Errorf("exec output arrived within %v: not streamed", spread)
	}

	// files, byte-exact both ways.
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	if _, err := c.WriteFile(ctx, sb.ID, "/root/data.bin", bytes.NewReader(data), client.WriteOptions{}); err != nil {
		t.Fatalf("file put: %v", err)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, sb.ID, "/root/data.bin", &back); err != nil {
		t.Fatalf("file get: %v", err)
	}
	if !bytes.Equal(back.Bytes(), data) {
		t.Fatalf("file get returned %d bytes, not the %d put", back.Len(), len(data))
	}
	if got, err := run(ctx, c, sb.ID, "sha256sum /root/data.bin | cut -c1-16"); err != nil || len(got) != 16 {
		t.Errorf("sha256sum in the guest = %q, %v", got, err)
	}

	// snapshot, then fork: the fork has the file, and each goes its way.
	snap, err := c.CreateSnapshot(ctx, sb.ID, "chartcluster")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Logf("snapshot %s: vmm %s %s", snap.ID, snap.VMM, snap.VMMVersion)
	forks, err := c.ForkSandbox(ctx, sb.ID, 1)
	if err != nil || len(forks) != 1 {
		t.Fatalf("fork: %v, %v", forks, err)
	}
	if _, err := run(ctx, c, forks[0].ID, "echo fork > /root/who"); err != nil {
		t.Fatalf("exec in the fork: %v", err)
	}
	if got, err := run(ctx, c, forks[0].ID, "wc -c < /root/data.bin"); err != nil || got != strconv.Itoa(len(data)) {
		t.Errorf("the fork's copy of the file: %q bytes, %v", got, err)
	}
	if got, err := run(ctx, c, sb.ID, "cat /root/who 2>/dev/null || echo none"); err != nil || got != "none" {
		t.Errorf("the parent sees the fork's write: %q, %v", got, err)
	}
	for _, id := range []string{forks[0].ID, sb.ID} {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Errorf("delete snapshot: %v", err)
	}
}

// buildBinaries builds the static space and space-agent that go into the
// images, the agent exactly as guesttest builds it (so the worker pod
// finds its initramfs in the cache).
func buildBinaries(t *testing.T) (space, agent string) {
	t.Helper()
	agent = guesttest.Agent(t)
	space = filepath.Join(t.TempDir(), "space")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-ldflags=-s -w", "-o", space, "./cmd/space")
	cmd.Dir = moduleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("setup: build space: %v\n%s", err, out)
	}
	return space, agent
}

// buildImages builds the image archives with version as their label (and
// so a tag of their own) and returns the worker's, whose image every pod
// of the chart runs.
func buildImages(t *testing.T, cacheBase, space, agent, version string) hostimage.Image {
	t.Helper()
	cache, err := cachedir.Open(cacheBase)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	out := t.TempDir()
	imgs, err := hostimage.Build(t.Context(), hostimage.Config{
		Cache: cache, Space: space, Agent: agent, OutDir: out, Images: []string{hostimage.Worker},
		Version: version, Revision: version, Epoch: time.Unix(1_780_000_000, 0),
	})
	if err != nil || len(imgs) != 1 {
		t.Fatalf("setup: build images: %v, %v", imgs, err)
	}
	img := imgs[0]
	img.Archive = filepath.Join(out, img.Archive)
	t.Logf("image %s (%d MiB)", img.Reference, img.Size>>20)
	return img
}

// writeValues writes the chart values of the test's release: two
// replicas on the test's PostgreSQL, the leader and the workers found
// through the API server, one worker on the node with its data under
// hostDir and the shared artifact cache; the rest (the workers'
// RollingUpdate among it) the chart's defaults.
func writeValues(t *testing.T, dsn, cacheBase string, img hostimage.Image) string {
	t.Helper()
	repo, _, _ := strings.Cut(img.Reference, ":")
	v := map[string]any{
		"image": map[string]any{"repository": repo, "tag": img.Tag, "pullPolicy": "Never"},
		"rbac":  map[string]any{"create": true},
		"server": map[string]any{
			"replicas":       2,
			"leaderElection": "kubernetes",
			// The worker pod is deleted and replaced, and upgraded: a
			// restart the control plane waits for, not a lost host (its
			// chunk store is the node's own: nothing could be recovered).
			"recoverAfter": "10m",
			"store":        map[string]any{"type": "postgres", "postgres": map[string]any{"dsn": dsn}},
			"resources":    map[string]any{"requests": map[string]any{"cpu": "10m", "memory": "64Mi"}},
		},
		"workerDiscovery": "kubernetes",
		"worker": map[string]any{
			"vcpus":     8,
			"memoryMiB": 4096,
			"resources": map[string]any{"requests": map[string]any{"cpu": "10m", "memory": "64Mi"}},
			"hostPaths": map[string]any{
				"dataDir":   hostDir + "/data",
				"chunksDir": hostDir + "/chunks",
				"cacheDir":  cacheBase,
			},
		},
	}
	// The node is this machine: a host without KVM (its kernel has no
	// /dev/kvm) runs its guests under TCG, and a worker there mounts none.
	if fi, err := os.Stat("/dev/kvm"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Logf("this node has no /dev/kvm: the worker mounts none (worker.hostDevices.kvm=false) and runs TCG guests")
		v["worker"].(map[string]any)["hostDevices"] = map[string]any{"kvm": false}
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return path
}

// apiClient returns a client of the chart's API Service (its ClusterIP,
// which kube-proxy routes on the node) with the admin key from the
// cluster Secret.
func apiClient(t *testing.T, cl *kubetest.Cluster) *client.Client {
	t.Helper()
	svc, err := cl.Client.CoreV1().Services(namespace).Get(t.Context(), release+"-server", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("setup: the API Service: %v", err)
	}
	sec, err := cl.Client.CoreV1().Secrets(namespace).Get(t.Context(), release+"-cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("setup: the cluster Secret: %v", err)
	}
	url := fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
	c, err := client.New(url, string(sec.Data["admin-key"]))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return c
}

// waitWorker waits for the worker the node's pod publishes to be healthy.
func waitWorker(t *testing.T, c *client.Client) {
	t.Helper()
	var seen []api.Worker
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		ws, err := c.Workers(t.Context())
		seen = ws
		for _, w := range ws {
			if err == nil && w.ID == workerID && w.Healthy && w.Capabilities != nil {
				t.Logf("worker %s at %s: vmm %s %s, accel %s", w.ID, w.Address, w.Capabilities.VMM, w.Capabilities.VMMVersion, w.Capabilities.Accel)
				return
			}
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("worker %s not healthy within 5m; workers %+v", workerID, seen)
}

// run runs a shell command in sandbox id and returns its trimmed stdout;
// a non-zero exit is an error.
func run(ctx context.Context, c *client.Client, id, shell string) (string, error) {
	var out, errOut bytes.Buffer
	exit, err := c.Exec(ctx, id, api.Exec{Shell: shell}, &out, &errOut)
	if err != nil {
		return "", err
	}
	if exit.Code != 0 {
		return "", fmt.Errorf("%q exited %d: %s", shell, exit.Code, errOut.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// retry calls f until it succeeds or two minutes pass: while a pod goes,
// the Service may still send a connection to it.
func retry(t *testing.T, f func(ctx context.Context) (string, error)) (string, error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		s, err := f(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return s, err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitCounting waits until the sandbox's counter is past after and still
// counting (its process, and so its VM, never stopped), and returns the
// last value read.
func waitCounting(t *testing.T, c *client.Client, id string, after int) int {
	t.Helper()
	read := func() (int, error) {
		s, err := retry(t, func(ctx context.Context) (string, error) { return run(ctx, c, id, "cat "+counterFile) })
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(s)
	}
	a, err := read()
	if err != nil {
		t.Fatalf("read the counter: %v", err)
	}
	if a <= after {
		t.Fatalf("counter %d, want past %d: it did not keep counting (a restarted VM starts again from 1)", a, after)
	}
	time.Sleep(time.Second)
	b, err := read()
	if err != nil {
		t.Fatalf("read the counter: %v", err)
	}
	if b <= a {
		t.Fatalf("counter %d a second after %d: stopped", b, a)
	}
	t.Logf("counter at %d (was %d)", b, after)
	return b
}

// pods lists the release's pods of component ("" = all).
func pods(t *testing.T, cl *kubetest.Cluster, component string) []corev1.Pod {
	t.Helper()
	sel := "app.kubernetes.io/instance=" + release
	if component != "" {
		sel += ",app.kubernetes.io/component=" + component
	}
	l, err := cl.Client.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		// The purge Jobs' pods belong to the release but not to a component we watch.
		if p.Labels["app.kubernetes.io/component"] == "worker-purge" {
			continue
		}
		out = append(out, p)
	}
	return out
}

func ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podOf returns the one ready pod of component.
func podOf(t *testing.T, cl *kubetest.Cluster, component string) corev1.Pod {
	t.Helper()
	ps := pods(t, cl, component)
	if len(ps) != 1 || !ready(ps[0]) {
		t.Fatalf("%s pods: want one ready, have %d", component, len(ps))
	}
	return ps[0]
}

// waitPodReady waits for a ready pod of component other than old.
func waitPodReady(t *testing.T, cl *kubetest.Cluster, component, old string) corev1.Pod {
	t.Helper()
	var found corev1.Pod
	testenv.Eventually(t, 10*time.Minute, func() bool {
		for _, p := range pods(t, cl, component) {
			if p.Name != old && p.DeletionTimestamp == nil && ready(p) {
				found = p
				return true
			}
		}
		return false
	})
	return found
}

// leaderPod returns the control-plane pod that holds the leader Lease and
// the Lease's holder identity (REPLICA/LIFE, the replica's ID being in its
// data dir).
func leaderPod(t *testing.T, cl *kubetest.Cluster) (pod, holder string) {
	t.Helper()
	var l string
	testenv.Eventually(t, time.Minute, func() bool {
		lease, err := cl.Client.CoordinationV1().Leases(namespace).Get(t.Context(), "space-leader", metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false
		}
		l = *lease.Spec.HolderIdentity
		return l != ""
	})
	replica, _, _ := strings.Cut(l, "/")
	for _, p := range pods(t, cl, "server") {
		id := strings.TrimSpace(cl.Kubectl(t, "--namespace", namespace, "exec", p.Name, "--", "cat", "/var/lib/space/replica.id"))
		if id == replica {
			return p.Name, l
		}
	}
	t.Fatalf("no control-plane pod has replica id %s (leader %s)", replica, l)
	return "", ""
}

// leftovers lists what SPACE left on the node: VMM processes, control
// groups, network namespaces (the sandboxes' taps are in them), run
// directories, mounts, and files of the worker's data dir and chunk store.
func leftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte("qemu-system")) && bytes.Contains(b, []byte("space-"+workerID)) {
			left = append(left, "process "+filepath.Base(filepath.Dir(p))+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	groups, _ := filepath.Glob("/sys/fs/cgroup/*/space-" + workerID)
	unified, _ := filepath.Glob("/sys/fs/cgroup/space-" + workerID)
	for _, g := range append(groups, unified...) {
		left = append(left, "control group "+g)
	}
	nets, _ := filepath.Glob("/run/netns/space-" + workerID + "-*")
	for _, n := range nets {
		left = append(left, "network namespace "+n)
	}
	runs, _ := filepath.Glob("/dev/shm/space-" + workerID + "*")
	for _, r := range runs {
		left = append(left, "run directory "+r)
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if strings.Contains(line, hostDir) && len(f) > 4 && f[4] != hostDir { // the test's own shared bind
				left = append(left, "mount "+strings.TrimSpace(line))
			}
		}
	}
	for _, dir := range []string{"data", "chunks"} {
		entries, _ := os.ReadDir(filepath.Join(hostDir, dir))
		for _, e := range entries {
			left = append(left, "file "+filepath.Join(hostDir, dir, e.Name()))
		}
	}
	return left
}

// sharedHostDir makes hostDir a mount point of its own in a shared peer
// group, as every directory of a systemd host is: the worker's data dir is
// mounted Bidirectional (the XFS image it mounts there must outlive its
// pod), which the runtime refuses on a private mount such as this
// machine's root.
func sharedHostDir(t *testing.T) {
	t.Helper()
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := unix.Mount(hostDir, hostDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("setup: bind %s: %v", hostDir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(hostDir, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s: %v", hostDir, err)
		}
		os.RemoveAll(hostDir)
	})
	if err := unix.Mount("", hostDir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatalf("setup: make %s shared: %v", hostDir, err)
	}
}

func chartDir(t *testing.T) string { return filepath.Join(moduleRoot(t), "deploy", "helm", "space") }

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("setup: go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// timedWriter keeps what is written and when the first and last writes
// came.
type timedWriter struct {
	mu sync.Mutex
	// +checklocks:mu
	buf bytes.Buffer
	// +checklocks:mu
	first time.Time
	// +checklocks:mu
	last time.Time
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.first.IsZero() {
		w.first = now
	}
	w.last = now
	return w.buf.Write(p)
}

func (w *timedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func (w *timedWriter) spread() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last.Sub(w.first)
}
