package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"space/api"
	"space/internal/errkind"
	"space/internal/kube/kubefake"
	"space/internal/kube/workerlease"
	"space/internal/testenv"
)

// startFakeLeaseWorker runs a standalone worker on the fake VMM that
// publishes its Lease in namespace "space" on kube instead of
// registering with ts; it returns once it serves.
func startFakeLeaseWorker(t *testing.T, ts *testServer, kube kubernetes.Interface, dataDir string) *testServer {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(ts.dataDir, WorkerTokenFile))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	wt := &testServer{dataDir: dataDir, workerID: newWorkerID(t)}
	wt.url, wt.stop = runTestWorker(t, WorkerConfig{
		ID: wt.workerID, DataDir: wt.dataDir, Listen: "127.0.0.1:0", VMM: VMMFake, CacheBase: t.TempDir(),
		Discovery: DiscoveryKubernetes, KubeNamespace: "space", kube: kube, Token: strings.TrimSpace(string(token)),
	})
	return wt
}

// TestSandboxOnLeaseWorkerWithFakeAPIServer checks a sandbox is created
// and served on a standalone worker that the control plane (with no
// worker of its own) knows only through the worker's Lease, on a fake
// API server; the worker never registers over HTTP. A second worker
// process with the same id is refused while the first runs.
func TestSandboxOnLeaseWorkerWithFakeAPIServer(t *testing.T) {
	kube := kubefake.NewAPIServer(t)
	ts := startFakeServerWith(t, Config{NoWorker: true, WorkerDiscovery: DiscoveryKubernetes, KubeNamespace: "space", kube: kube})
	w := startFakeLeaseWorker(t, ts, kube, newDataDir(t))
	testenv.Eventually(t, 30*time.Second, func() bool {
		ws, err := ts.client.Workers(t.Context())
		return err == nil && len(ws) == 1 && ws[0].ID == w.workerID && ws[0].Healthy
	})
	sb, err := ts.client.CreateSandbox(t.Context(), api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox() = %v", err)
	}
	if sb.Worker != w.workerID {
		t.Errorf("CreateSandbox() on worker %q, want %q (the one found through its Lease)", sb.Worker, w.workerID)
	}
	if out, _, code := execOut(t, ts.client, sb.ID, sh("echo hi")); out != "hi\n" || code != 0 {
		t.Errorf("exec echo hi = %q, exit %d; want hi", out, code)
	}

	// Another process with the same worker id (another data dir).
	token, _ := os.ReadFile(filepath.Join(ts.dataDir, WorkerTokenFile))
	err = RunWorker(t.Context(), WorkerConfig{
		ID: w.workerID, DataDir: newDataDir(t), Listen: "127.0.0.1:0", VMM: VMMFake, CacheBase: t.TempDir(),
		Discovery: DiscoveryKubernetes, KubeNamespace: "space", kube: kube, Token: strings.TrimSpace(string(token)),
	})
	if !errors.Is(err, workerlease.ErrHeld) {
		t.Errorf("a second worker with id %s = %v, want refused: its Lease is held", w.workerID, err)
	}

	if err := ts.client.DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Errorf("DeleteSandbox() = %v", err)
	}
	w.stop()
	if _, err := kube.CoordinationV1().Leases("space").Get(t.Context(), workerlease.Name(w.workerID), metav1.GetOptions{}); err == nil {
		t.Errorf("the worker's Lease is left after it stopped")
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		ws, err := ts.client.Workers(t.Context())
		return err == nil && len(ws) == 1 && !ws[0].Healthy
	})
}

// TestWorkerDiscoveryRefusesBadSettings checks an unknown discovery mode
// is refused, and that a worker without a control plane needs
// kubernetes discovery, changing nothing.
func TestWorkerDiscoveryRefusesBadSettings(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	for _, tt := range []struct {
		name string
		cfg  WorkerConfig
		kind error
		says string
	}{
		{"unknown", WorkerConfig{Discovery: "dns", ControlPlane: "http://127.0.0.1:1"}, errkind.InvalidArgument, "want token or kubernetes"},
		{"no control plane", WorkerConfig{}, errkind.InvalidArgument, "control plane's url is required"},
		{"outside a cluster", WorkerConfig{Discovery: DiscoveryKubernetes}, errkind.FailedPrecondition, "not in a cluster"},
	} {
		tt.cfg.DataDir, tt.cfg.Token, tt.cfg.CacheBase, tt.cfg.VMM = filepath.Join(dir, tt.name), "test-worker-token-0123456789abcdef", dir, VMMFake
		err := RunWorker(t.Context(), tt.cfg)
		if !errors.Is(err, tt.kind) || !strings.Contains(strings.ToLower(fmtErr(err)), tt.says) {
			t.Errorf("RunWorker(%s) = %v, want %v saying %q", tt.name, err, tt.kind, tt.says)
		}
		if _, err := os.Stat(tt.cfg.DataDir); err == nil {
			t.Errorf("RunWorker(%s) made its data dir", tt.name)
		}
	}
	err := Run(t.Context(), Config{DataDir: filepath.Join(dir, "server"), CacheBase: dir, VMM: VMMFake, NoWorker: true, WorkerDiscovery: "dns"})
	if !errors.Is(err, errkind.InvalidArgument) || !strings.Contains(fmtErr(err), "want token or kubernetes") {
		t.Errorf("Run with worker discovery dns = %v, want invalid argument", err)
	}
}
