// Package kubetest runs a real one-node Kubernetes cluster for tests (test
// tier k8s): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// containerd and runc (Debian packages), the kubelet and kube-proxy.
//
// The Kubernetes binaries, etcd, kubectl and helm are built from the Go
// module proxy by the tools module in tools/ (its go.mod pins every
// version), once per Version, into <cache>/v1/tools/kubernetes-<Version>
// (scripts/build-kube.sh, or Build). A cold build takes about 25 minutes
// on 2 cores, so Start builds only where the k8s tier is required; elsewhere
// missing binaries skip the test with a hint to run the script.
//
// There is no registry: images are OCI archives loaded with ImportImage
// (BuildImage makes one from a Go main package), and pods must use
// imagePullPolicy Never. The sandbox (pause) image is built the same way.
// There is no CoreDNS either: tests address Services by ClusterIP and pods
// by pod IP.
//
// The node address NodeIP (10.251.0.1, on an interface of its own) is the
// apiserver's bind and advertise address, so the kubernetes Service's
// endpoint is real and pods reach the apiserver through the in-cluster
// config (its ClusterIP, routed by kube-proxy in iptables mode). Pods are
// on a CNI bridge (PodCIDR) whose gateway is the host, so the host and the
// pods route to each other: a server a test runs on the host and binds to
// NodeIP is reachable from every pod.
//
// One cluster runs per machine at a time: Start takes a machine-wide lock
// and holds it until the test's cleanup, which stops everything and
// removes what the cluster left on the host. Everything lives under
// StateDir with pid files, so a run that was killed is cleaned up by the
// next Start before it begins.
package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"space/internal/cachedir"
	"space/internal/proc"
	"space/internal/testenv"
)

const (
	lockTimeout  = 20 * time.Minute // another package's cluster test may hold the machine
	startTimeout = 3 * time.Minute
	stopGrace    = 5 * time.Second
)

// Cluster is a running one-node cluster. Its fields are set by Start and
// never change.
type Cluster struct {
	// Kubeconfig is the path of an admin (system:masters) kubeconfig.
	Kubeconfig string
	// Client is an admin client of the apiserver.
	Client kubernetes.Interface
	// Config is the admin client's configuration.
	Config *rest.Config
	// NodeIP is the node's address, on a host interface.
	NodeIP net.IP
	// NodeName is the name of the node.
	NodeName string
	// Bin holds the tier's binaries (kubectl, helm, ...).
	Bin Binaries

	paths      paths
	containerd string // its socket
	comps      []*component
}

// Start brings up a cluster for t and tears it down in t's cleanup, even
// when Start itself fails. It needs root (the k8s tier is unavailable
// otherwise), Debian's containerd, runc, containernetworking-plugins and
// iptables (scripts/install-deps.sh), and the tier's binaries
// (LoadBinaries). It waits for the machine-wide lock while another test
// process has a cluster, then removes what a killed earlier run left.
func Start(t testing.TB) *Cluster {
	t.Helper()
	testenv.RequireRoot(t, testenv.TierK8s)
	for _, tool := range []struct{ name, pkg string }{
		{"containerd", "containerd"}, {"ctr", "containerd"}, {"runc", "runc"},
		{"iptables", "iptables"}, {"ip", "iproute2"},
	} {
		testenv.RequireTool(t, testenv.TierK8s, tool.name, tool.pkg)
	}
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Unavailable(t, testenv.TierK8s, "go: not on PATH, to build the pause image")
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		testenv.Unavailable(t, testenv.TierK8s, "/usr/lib/cni/bridge: not found (apt package containernetworking-plugins)")
	}
	bins := LoadBinaries(t)

	unlock, err := lockMachine(t)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	c := &Cluster{
		Kubeconfig: paths{StateDir}.kubeconfig(certAdmin),
		NodeIP:     nodeIP,
		NodeName:   NodeName,
		Bin:        bins,
		paths:      paths{StateDir},
		containerd: paths{StateDir}.containerdSock(),
	}
	t.Cleanup(func() {
		start := time.Now()
		if t.Failed() {
			c.Logs(t)
		}
		if err := c.stop(); err != nil {
			t.Errorf("cleanup: kubernetes cluster: %v", err)
		}
		t.Logf("kubernetes cluster stopped and removed in %v", time.Since(start).Round(time.Millisecond))
		unlock()
	})
	if err := cleanHost(c.paths); err != nil {
		t.Fatalf("setup: remove an earlier run's leftovers: %v", err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	if err := c.start(ctx); err != nil {
		t.Fatalf("setup: start kubernetes cluster: %v", err)
	}
	t.Logf("kubernetes %s cluster ready in %v; memory: %s", Version, time.Since(start).Round(time.Millisecond), c.memory())
	return c
}

// memory says how much memory (RSS) each component uses, and the total.
func (c *Cluster) memory() string {
	var b strings.Builder
	var total int64
	for _, comp := range c.comps {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", comp.cmd.Process.Pid))
		if err != nil {
			continue
		}
		if rss, ok, err := proc.ParseVmRSS(status); err == nil && ok {
			total += rss
			fmt.Fprintf(&b, "%s %d MiB, ", comp.name, rss>>20)
		}
	}
	fmt.Fprintf(&b, "total %d MiB", total>>20)
	return b.String()
}

// lockMachine takes the machine-wide cluster lock, waiting for another
// test process's cluster to go.
func lockMachine(t testing.TB) (func(), error) {
	d, err := cachedir.Open(lockDir) // for its cross-process file lock
	if err != nil {
		return nil, err
	}
	if unlock, ok, err := d.TryLock("cluster"); err != nil || ok {
		return unlock, err
	}
	t.Logf("waiting for another test process's kubernetes cluster to stop (lock in %s)", lockDir)
	ctx, cancel := context.WithTimeout(t.Context(), lockTimeout)
	defer cancel()
	return d.Lock(ctx, "cluster")
}

func (c *Cluster) start(ctx context.Context) error {
	p := c.paths
	for _, d := range []string{p.root, p.pids(), p.logs(), p.podLogs()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	certs, err := newPKI(p.pki())
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := certs.writeCluster(nodeIP); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := writeConfigs(p); err != nil {
		return fmt.Errorf("configs: %w", err)
	}
	if err := setupNetwork(p); err != nil {
		return err
	}
	if err := c.startContainerd(ctx); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	if err := c.startNode(ctx); err != nil {
		return err
	}
	for _, comp := range c.comps {
		if done, err := comp.exited(); done {
			return fmt.Errorf("%s exited: %v\n%s", comp.name, err, logTail(comp.log, 3000))
		}
	}
	return nil
}

// setupNetwork makes the node address's interface and sets the sysctls
// the pod network needs. The interface is a dummy, or where the kernel has
// no dummy driver (as on our CI machines) an ifb: any interface that is up
// with carrier holds a local address the same way.
func setupNetwork(p paths) error {
	var out []byte
	var err error
	for _, kind := range []string{"dummy", "ifb"} {
		if out, err = exec.Command("ip", "link", "add", nodeIface, "type", kind).CombinedOutput(); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("ip link add %s (dummy or ifb): %v: %s", nodeIface, err, out)
	}
	// ClusterIPs route to the node interface, which drops what it is sent:
	// traffic to a Service kube-proxy has not programmed yet (or never
	// will) stays on the machine instead of taking the default route.
	for _, args := range [][]string{
		{"addr", "add", nodeIP.String() + "/32", "dev", nodeIface},
		{"link", "set", nodeIface, "up"},
		{"route", "add", ServiceCIDR, "dev", nodeIface, "src", nodeIP.String()},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// Pods reach the host, each other and Services, and nothing beyond
	// the machine: forwarding is on while the cluster runs.
	isolate := []string{"-w", "-I", "FORWARD", "-s", PodCIDR, "!", "-o", bridgeIface,
		"-m", "comment", "--comment", ruleComment, "-j", "DROP"}
	if out, err := exec.Command("iptables", isolate...).CombinedOutput(); err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(isolate, " "), err, out)
	}
	return setSysctls(p)
}

// run starts the component name from the binary bin; stop stops it.
func (c *Cluster) run(name, bin string, args ...string) (*component, error) {
	comp, err := startComponent(c.paths, name, bin, args...)
	if err != nil {
		return nil, err
	}
	c.comps = append(c.comps, comp)
	return comp, nil
}

// runBin starts the tier's binary name.
func (c *Cluster) runBin(name string, args ...string) (*component, error) {
	return c.run(name, c.Bin.Path(name), args...)
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	comp, err := c.run("containerd", "containerd", "--config", c.paths.join("containerd", "config.toml"))
	if err != nil {
		return err
	}
	if err := waitFor(ctx, comp, "containerd", func(ctx context.Context) error {
		_, err := c.ctr(ctx, "version")
		return err
	}); err != nil {
		return err
	}
	archive, err := buildImage(ctx, pausePackage, pauseImage, c.paths.join("images"))
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	if _, err := c.ctr(ctx, "-n", "k8s.io", "images", "import", "--platform", "linux/amd64", archive); err != nil {
		return fmt.Errorf("import pause image: %w", err)
	}
	return nil
}

func (c *Cluster) ctr(ctx context.Context, args ...string) ([]byte, error) {
	args = append([]string{"--address", c.containerd}, args...)
	out, err := exec.CommandContext(ctx, "ctr", args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	p := c.paths
	pki := func(f string) string { return filepath.Join(p.pki(), f) }
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	etcd, err := c.runBin(binEtcd,
		"--name=kubetest", "--data-dir="+p.join("etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPort+1),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPort+1),
		fmt.Sprintf("--initial-cluster=kubetest=http://127.0.0.1:%d", etcdPort+1),
		"--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	if err := waitFor(ctx, etcd, "etcd", func(ctx context.Context) error {
		return httpGet(ctx, http.DefaultClient, etcdURL+"/health")
	}); err != nil {
		return err
	}
	api, err := c.runBin(binAPIServer,
		"--etcd-servers="+etcdURL,
		"--bind-address="+nodeIP.String(), "--advertise-address="+nodeIP.String(),
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--service-cluster-ip-range="+ServiceCIDR,
		"--client-ca-file="+pki("ca.crt"),
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--kubelet-client-certificate="+pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+pki("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=Hostname,InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki("sa.pub"),
		"--service-account-signing-key-file="+pki("sa.key"),
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1")
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	c.Config = cfg
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, api, "kube-apiserver", func(ctx context.Context) error {
		return httpGet(ctx, hc, apiURL()+"/readyz")
	}); err != nil {
		return err
	}
	common := func(name string) []string {
		return []string{
			"--kubeconfig=" + p.kubeconfig(name),
			"--authentication-kubeconfig=" + p.kubeconfig(name),
			"--authorization-kubeconfig=" + p.kubeconfig(name),
			"--bind-address=" + nodeIP.String(),
			"--leader-elect=false",
		}
	}
	if _, err := c.runBin(binKCM, append(common(certKCM),
		"--service-account-private-key-file="+pki("sa.key"),
		"--root-ca-file="+pki("ca.crt"),
		"--cluster-signing-cert-file="+pki("ca.crt"),
		"--cluster-signing-key-file="+pki("ca.key"),
		"--use-service-account-credentials=true",
		"--service-cluster-ip-range="+ServiceCIDR)...); err != nil {
		return err
	}
	if _, err := c.runBin(binScheduler, common(certScheduler)...); err != nil {
		return err
	}
	return nil
}

func (c *Cluster) startNode(ctx context.Context) error {
	p := c.paths
	kubelet, err := c.runBin(binKubelet,
		"--config="+p.join("kubelet-config.yaml"),
		"--kubeconfig="+p.kubeconfig(certKubelet),
		"--root-dir="+p.kubeletRoot(),
		"--cert-dir="+p.join("kubelet", "pki"),
		"--hostname-override="+NodeName,
		"--node-ip="+nodeIP.String(),
		"--v=1")
	if err != nil {
		return err
	}
	proxy, err := c.runBin(binKubeProxy, "--config="+p.join("kube-proxy-config.yaml"), "--v=1")
	if err != nil {
		return err
	}
	// Ready, with the not-ready taint gone (pods schedule), the default
	// service account made (pods are admitted), and the kubernetes
	// Service's endpoint in place (pods reach the apiserver).
	return waitFor(ctx, kubelet, "node "+NodeName, func(ctx context.Context) error {
		if done, err := proxy.exited(); done {
			return fmt.Errorf("kube-proxy exited: %v (log %s)", err, proxy.log)
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				ready = cond.Status == corev1.ConditionTrue
			}
		}
		if !ready {
			return errors.New("not ready")
		}
		if len(n.Spec.Taints) > 0 {
			return fmt.Errorf("tainted %v", n.Spec.Taints)
		}
		if _, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		ep, err := c.Client.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(ep.Subsets) == 0 || len(ep.Subsets[0].Addresses) == 0 || ep.Subsets[0].Addresses[0].IP != nodeIP.String() {
			return fmt.Errorf("kubernetes endpoints %v, want %s", ep.Subsets, nodeIP)
		}
		return nil
	})
}

// waitFor polls check until it succeeds, failing early when comp exits.
func waitFor(ctx context.Context, comp *component, what string, check func(context.Context) error) error {
	var last error
	for {
		if done, err := comp.exited(); done {
			return fmt.Errorf("%s exited while waiting for %s: %v\n%s", comp.name, what, err, logTail(comp.log, 3000))
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %v (log %s)", what, last, comp.log)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func httpGet(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	return tail(b, n)
}

// stop stops the components (the node first, containers by cgroup, the
// apiserver before etcd) and removes what the cluster left on the host.
func (c *Cluster) stop() error {
	for i := len(c.comps) - 1; i >= 0; i-- {
		comp := c.comps[i]
		grace := stopGrace
		if comp.name == binKubelet || comp.name == "containerd" {
			grace = 0 // their containers are killed by cgroup below
		}
		comp.stop(grace)
	}
	var errs []error
	if out, err := exec.Command(c.Bin.Path(binKubeProxy), "--cleanup").CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy --cleanup: %v: %s", err, tail(out, 2000)))
	}
	errs = append(errs, cleanHost(c.paths))
	return errors.Join(errs...)
}
