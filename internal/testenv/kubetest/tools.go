package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"space/internal/hostimage"
)

// pausePackage is the sandbox container's program.
const pausePackage = "space/internal/testenv/kubetest/pause"

// BuildImage builds the Go main package pkg of the space module (an
// import path, "space/internal/testenv/kubetest/testserver") as a static
// binary and returns the path of a one-layer image archive named ref
// ("localhost/name:tag") whose entrypoint it is, in t's temporary
// directory. Load it with ImportImage; pods run it with imagePullPolicy
// Never.
func BuildImage(t testing.TB, pkg, ref string) string {
	t.Helper()
	archive, err := buildImage(t.Context(), pkg, ref, t.TempDir())
	if err != nil {
		t.Fatalf("setup: image %s: %v", ref, err)
	}
	return archive
}

func buildImage(ctx context.Context, pkg, ref, dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, path.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v: %s", pkg, err, tail(out, 4000))
	}
	archive := bin + ".tar"
	os.Remove(archive)
	if err := hostimage.WriteBinaryArchive(ctx, bin, ref, archive); err != nil {
		return "", err
	}
	return archive, nil
}

func moduleRoot() (string, error) {
	tools, err := ToolsDir()
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(tools, "/"+toolsRel), nil
}

// ImportImage loads the image archive (OCI layout or docker-archive
// tarball, linux/amd64) into the node's containerd, for the kubelet.
func (c *Cluster) ImportImage(t testing.TB, archive string) {
	t.Helper()
	if _, err := c.ctr(t.Context(), "-n", "k8s.io", "images", "import", "--platform", "linux/amd64", archive); err != nil {
		t.Fatalf("setup: import image: %v", err)
	}
}

// Kubectl runs kubectl (the one built with the cluster, of Version) with
// the admin kubeconfig and returns its standard output; it fails t when
// kubectl fails.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	return c.runTool(t, nil, binKubectl, append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
}

// Apply applies manifest (YAML, one or more documents) with kubectl apply
// and returns kubectl's output; it fails t when kubectl fails.
func (c *Cluster) Apply(t testing.TB, manifest string) string {
	t.Helper()
	return c.runTool(t, strings.NewReader(manifest), binKubectl, "--kubeconfig="+c.Kubeconfig, "apply", "-f", "-")
}

// Helm runs the helm CLI (HelmVersion) against the cluster as admin and
// returns its standard output; it fails t when helm fails. Its cache,
// config and data directories are in t's temporary directory.
func (c *Cluster) Helm(t testing.TB, args ...string) string {
	t.Helper()
	return c.runTool(t, nil, binHelm, append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
}

func (c *Cluster) runTool(t testing.TB, stdin io.Reader, name string, args ...string) string {
	t.Helper()
	home := t.TempDir()
	cmd := exec.CommandContext(t.Context(), c.Bin.Path(name), args...)
	cmd.Stdin = stdin
	cmd.Env = append(os.Environ(), "HOME="+home,
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, tail(stdout.Bytes(), 4000), tail(stderr.Bytes(), 4000))
	}
	return stdout.String()
}

// Logs writes to t's log the state of every pod and event, each
// container's log, and the tail of every component's log. Start's cleanup
// calls it when t failed.
func (c *Cluster) Logs(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c.Client != nil {
		c.logPods(ctx, t)
	}
	for _, comp := range c.comps {
		t.Logf("--- %s log (tail) %s:\n%s", comp.name, comp.log, logTail(comp.log, 6000))
	}
}

func (c *Cluster) logPods(ctx context.Context, t testing.TB) {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("--- pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		t.Logf("--- pod %s/%s phase %s node %q ip %s", p.Namespace, p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.PodIP)
		for _, cond := range p.Status.Conditions {
			t.Logf("    condition %s=%s %s %s", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
		for _, st := range p.Status.ContainerStatuses {
			t.Logf("    container %s ready=%v restarts=%d state=%+v last=%+v", st.Name, st.Ready, st.RestartCount, st.State, st.LastTerminationState)
			raw, err := c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: st.Name}).DoRaw(ctx)
			if err != nil {
				t.Logf("    logs of %s: %v", st.Name, err)
				continue
			}
			t.Logf("    logs of %s (tail):\n%s", st.Name, tail(raw, 3000))
		}
	}
	events, err := c.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("--- events: %v", err)
		return
	}
	for _, e := range events.Items {
		t.Logf("--- event %s %s/%s %s: %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
}
