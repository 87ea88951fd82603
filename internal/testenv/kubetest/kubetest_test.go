package kubetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"space/internal/testenv"
)

const (
	serverPackage = "space/internal/testenv/kubetest/testserver"
	serverImage   = "localhost/space-kubetest-server:1"
)

func TestClusterRunsPods(t *testing.T) {
	c := Start(t)
	c.ImportImage(t, BuildImage(t, serverPackage, serverImage))
	ctx := t.Context()

	// A server on the host, bound to the node address, as the chart's
	// PostgreSQL will be.
	hostLn, err := net.Listen("tcp", net.JoinHostPort(c.NodeIP.String(), "0"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "host ok\n") })}
	go hostSrv.Serve(hostLn)
	t.Cleanup(func() { hostSrv.Close() })
	hostURL := "http://" + hostLn.Addr().String() + "/"

	t.Run("HostNetworkPrivileged", func(t *testing.T) {
		port := freeNodePort(t, c)
		pod := serverPod("hostnet", "-listen="+net.JoinHostPort(c.NodeIP.String(), strconv.Itoa(port)))
		pod.Spec.HostNetwork = true
		privileged := true
		pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
		pod.Spec.Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromInt(port)
		pod.Spec.Containers[0].ReadinessProbe.HTTPGet.Host = c.NodeIP.String()
		for i, dev := range []string{"/dev/kvm", "/dev/net/tun"} {
			name := fmt.Sprintf("dev%d", i)
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name,
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dev}}})
			pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
				corev1.VolumeMount{Name: name, MountPath: dev})
		}
		runPod(t, c, pod)
		got := httpBody(t, fmt.Sprintf("http://%s/", net.JoinHostPort(c.NodeIP.String(), strconv.Itoa(port))))
		if want := "ok hostnet\n"; got != want {
			t.Errorf("GET / of the hostNetwork pod = %q, want %q", got, want)
		}
		// apiserver → kubelet (exec, logs) goes to localhost.
		c.Kubectl(t, "exec", "hostnet", "--", "/testserver", "-h") // prints usage to stderr, exits 0
		if got := c.Kubectl(t, "logs", "hostnet"); !strings.Contains(got, "testserver hostnet listening") {
			t.Errorf("kubectl logs hostnet = %q, want the server's start line", got)
		}
	})

	t.Run("Apply", func(t *testing.T) {
		out := c.Apply(t, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied}\ndata: {k: v}\n")
		if !strings.Contains(out, "configmap/applied created") {
			t.Errorf("Apply output = %q, want configmap/applied created", out)
		}
		if got := c.Kubectl(t, "get", "configmap", "applied", "-o", "jsonpath={.data.k}"); got != "v" {
			t.Errorf("kubectl get configmap applied .data.k = %q, want v", got)
		}
	})

	t.Run("PodNetworkAndServices", func(t *testing.T) {
		a, b := serverPod("server-a"), serverPod("server-b")
		for _, p := range []*corev1.Pod{a, b} {
			p.Labels = map[string]string{"app": "server"}
			p.Spec.AutomountServiceAccountToken = nil // the default: mounted, for the in-cluster config
		}
		a, b = runPod(t, c, a), runPod(t, c, b)
		svc, err := c.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "server"},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "server"},
				Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt(8080)}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create service: %v", err)
		}
		clusterURL := "http://" + svc.Spec.ClusterIP + "/"
		get := func(path string) string { return httpBody(t, clusterURL+path) }

		// Host → ClusterIP (kube-proxy), as soon as the rules are in.
		var body string
		var last error
		defer func() {
			if t.Failed() {
				t.Logf("last GET %s: %v", clusterURL, last)
			}
		}()
		testenv.Eventually(t, 30*time.Second, func() bool {
			body, last = tryGet(clusterURL)
			return last == nil
		})
		if !strings.HasPrefix(body, "ok server-") {
			t.Errorf("GET %s = %q, want ok server-a or -b", clusterURL, body)
		}
		// Pod → kubernetes Service → apiserver, with the in-cluster config.
		if got, want := get("apiserver"), Version+" via https://"+serviceIP.String()+":443"; !strings.HasPrefix(got, want) {
			t.Errorf("GET /apiserver = %q, want %q", got, want)
		}
		// Pod → host server on the node address.
		if got := get("get?url=" + url.QueryEscape(hostURL)); got != "host ok\n" {
			t.Errorf("pod GET %s = %q, want %q", hostURL, got, "host ok\n")
		}
		// Pod → pod, both ways, by pod IP.
		for _, pair := range [][2]*corev1.Pod{{a, b}, {b, a}} {
			from, to := pair[0], pair[1]
			got := httpBody(t, fmt.Sprintf("http://%s:8080/get?url=%s", from.Status.PodIP, url.QueryEscape("http://"+to.Status.PodIP+":8080/")))
			if want := "ok " + to.Name + "\n"; got != want {
				t.Errorf("%s GET %s = %q, want %q", from.Name, to.Name, got, want)
			}
		}
		// Pod → ClusterIP → pod (a pod may land on itself: hairpin).
		for range 4 {
			if got := httpBody(t, fmt.Sprintf("http://%s:8080/get?url=%s", a.Status.PodIP, url.QueryEscape(clusterURL))); !strings.HasPrefix(got, "ok server-") {
				t.Errorf("server-a GET %s = %q, want ok server-a or -b", clusterURL, got)
			}
		}
	})

	t.Run("Helm", func(t *testing.T) {
		chart, err := filepath.Abs("testdata/chart")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c.Helm(t, "install", "smoke", chart, "--wait", "--timeout=2m", "--set=image="+serverImage)
		t.Logf("helm install --wait took %v", time.Since(start).Round(time.Millisecond))
		checkReady(t, c, "app=smoke-web", 1)
		checkReady(t, c, "app=smoke-agent", 1)
		c.Helm(t, "upgrade", "smoke", chart, "--wait", "--timeout=2m", "--set=image="+serverImage, "--set=replicas=2")
		checkReady(t, c, "app=smoke-web", 2)
		if out := c.Helm(t, "list", "--short"); strings.TrimSpace(out) != "smoke" {
			t.Errorf("helm list = %q, want smoke", out)
		}
		c.Helm(t, "uninstall", "smoke", "--wait", "--timeout=2m")
		// The workloads are gone at once; their pods are garbage
		// collected after.
		testenv.Eventually(t, 30*time.Second, func() bool {
			pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app in (smoke-web, smoke-agent)"})
			return err == nil && len(pods.Items) == 0
		})
	})
}

// serverPod is a pod of the test server image named name.
func serverPod(name string, args ...string) *corev1.Pod {
	noToken := false
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &noToken,
			Containers: []corev1.Container{{
				Name:            "server",
				Image:           serverImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            append([]string{"-name=" + name}, args...),
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(8080)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

// runPod creates pod and waits until it is ready.
func runPod(t *testing.T, c *Cluster, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	start := time.Now()
	if _, err := c.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	var got *corev1.Pod
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for {
		var err error
		got, err = c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && podReady(got) {
			t.Logf("pod %s ready in %v, ip %s", pod.Name, time.Since(start).Round(time.Millisecond), got.Status.PodIP)
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s not ready within 90s: %v %+v", pod.Name, err, got.Status)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// checkReady fails t unless want pods match selector, all ready.
func checkReady(t *testing.T, c *Cluster, selector string, want int) {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	for i := range pods.Items {
		if podReady(&pods.Items[i]) {
			ready++
		}
	}
	if ready != want {
		t.Errorf("ready pods %s = %d (of %d), want %d", selector, ready, len(pods.Items), want)
	}
}

func tryGet(u string) (string, error) {
	// A new connection each time: one made before kube-proxy programmed
	// a Service would otherwise be reused.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", u, resp.Status, b)
	}
	return string(b), nil
}

func httpBody(t *testing.T, u string) string {
	t.Helper()
	b, err := tryGet(u)
	if err != nil {
		t.Errorf("%v", err)
	}
	return b
}

// freeNodePort returns a TCP port free on the node address a moment ago.
func freeNodePort(t *testing.T, c *Cluster) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(c.NodeIP.String(), "0"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// killedRunEnv makes the test binary a run that brings a cluster up, runs
// a pod, says so, and waits to be killed (TestStartAfterKilledRun).
const killedRunEnv = "SPACE_KUBETEST_KILLED_RUN"

func TestStartAfterKilledRun(t *testing.T) {
	if os.Getenv(killedRunEnv) != "" {
		c := Start(t)
		c.ImportImage(t, BuildImage(t, serverPackage, serverImage))
		runPod(t, c, serverPod("leftover"))
		fmt.Println("READY")
		select {} // killed by the parent
	}
	testenv.RequireRoot(t, testenv.TierK8s)
	LoadBinaries(t) // skip before spending a child on a missing tier
	child := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestStartAfterKilledRun$", "-test.v", "-test.timeout=5m")
	// The child's temporary files go under ours: killed, it cannot
	// remove them itself.
	child.Env = append(os.Environ(), killedRunEnv+"=1", "TMPDIR="+t.TempDir())
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatalf("setup: start the run to kill: %v", err)
	}
	ready := make(chan bool, 1)
	var childOut strings.Builder
	go func() { // ends when the child's stdout closes
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			childOut.WriteString(sc.Text() + "\n")
			if sc.Text() == "READY" {
				ready <- true
			}
		}
		close(ready)
	}()
	if ok := <-ready; !ok {
		child.Wait()
		t.Fatalf("setup: the run to kill ended before its cluster was up:\n%s", childOut.String())
	}
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
	leftovers := cmdlinePids(t, StateDir+"/")
	if len(leftovers) == 0 {
		t.Fatalf("setup: no containerd shim outlived the killed run; the test proves nothing")
	}
	t.Logf("the killed run left %d processes (containerd shims), %s and its state behind", len(leftovers), nodeIface)
	if _, err := os.Stat("/sys/class/net/" + nodeIface); err != nil {
		t.Fatalf("setup: the killed run left no %s: %v", nodeIface, err)
	}

	c := Start(t)
	for _, pid := range leftovers {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); strings.Contains(string(b), StateDir+"/") {
				t.Errorf("process %d of the killed run (%q) still runs after Start", pid, b)
			}
		}
	}
	pods, err := c.Client.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		t.Errorf("pod %s/%s of the killed run is in the new cluster", p.Namespace, p.Name)
	}
	c.ImportImage(t, BuildImage(t, serverPackage, serverImage))
	runPod(t, c, serverPod("after"))
}

// cmdlinePids returns the processes whose command line mentions s.
func cmdlinePids(t *testing.T, s string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(b), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// brokenRunEnv makes the test binary a run whose cluster cannot start
// (TestFailedStartLeavesNothing).
const brokenRunEnv = "SPACE_KUBETEST_BROKEN_RUN"

func TestFailedStartLeavesNothing(t *testing.T) {
	if os.Getenv(brokenRunEnv) != "" {
		// etcd cannot bind its client port: Start fails after containerd,
		// the interface, the sysctls and the iptables rule are in place.
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(etcdPort)))
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		defer l.Close()
		Start(t)
		return
	}
	testenv.RequireRoot(t, testenv.TierK8s)
	LoadBinaries(t)
	forward, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	child := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestFailedStartLeavesNothing$", "-test.v", "-test.timeout=5m")
	child.Env = append(os.Environ(), brokenRunEnv+"=1")
	out, err := child.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "etcd exited") {
		t.Fatalf("a Start whose etcd cannot bind: err %v, want a failure that says etcd exited; output:\n%s", err, tail(out, 4000))
	}
	// Check under the lock: no other test process's cluster is up.
	unlock, err := lockMachine(t)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := os.Stat(StateDir); err == nil {
		t.Errorf("%s left behind", StateDir)
	}
	if pids := cmdlinePids(t, StateDir+"/"); len(pids) > 0 {
		t.Errorf("processes %v left behind", pids)
	}
	if _, err := os.Stat("/sys/class/net/" + nodeIface); err == nil {
		t.Errorf("interface %s left behind", nodeIface)
	}
	if rules, err := exec.Command("iptables", "-w", "-S", "FORWARD").Output(); err != nil || strings.Contains(string(rules), ruleComment) {
		t.Errorf("iptables FORWARD = %q (%v), want no rule of ours", rules, err)
	}
	if got, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); string(got) != string(forward) {
		t.Errorf("ip_forward = %q after the failed run, want %q as before", got, forward)
	}
}
