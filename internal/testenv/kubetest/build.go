package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/internal/cachedir"
	"space/internal/testenv"
)

const (
	// Version is the Kubernetes release the tier runs: kube-apiserver,
	// kube-controller-manager, kube-scheduler, kubelet, kube-proxy and
	// kubectl are built from k8s.io/kubernetes at this version.
	Version = "v1.37.2"
	// EtcdVersion is the go.etcd.io/etcd/server/v3 version etcd is built
	// from (the one Version requires).
	EtcdVersion = "v3.7.0"
	// HelmVersion is the helm.sh/helm/v4 version of the helm CLI.
	HelmVersion = "v4.3.2"

	// toolsRel is the tools module, relative to the root of the space
	// module. Its go.mod pins every version above (regen.sh writes it).
	toolsRel = "internal/testenv/kubetest/tools"
)

// The binaries in the tool cache entry.
const (
	binEtcd       = "etcd"
	binAPIServer  = "kube-apiserver"
	binKCM        = "kube-controller-manager"
	binScheduler  = "kube-scheduler"
	binKubelet    = "kubelet"
	binKubeProxy  = "kube-proxy"
	binKubectl    = "kubectl"
	binHelm       = "helm"
	etcdBuildName = "server" // go build names etcd after its package
)

var allBinaries = []string{binEtcd, binAPIServer, binKCM, binScheduler, binKubelet, binKubeProxy, binKubectl, binHelm}

// ldflags strips the binaries and stamps the release into them: without
// it the node reports v0.0.0-master and kubectl balks.
func ldflags() string {
	minor := strings.Split(Version, ".")[1]
	var b strings.Builder
	b.WriteString("-s -w")
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		fmt.Fprintf(&b, " -X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean",
			pkg, Version, pkg, pkg, minor, pkg)
	}
	return b.String()
}

// Binaries is the tool cache entry with the tier's binaries, by name.
type Binaries struct {
	Dir string // <cache>/v1/tools/kubernetes-<Version>
}

// Path returns the path of the binary name ("kubelet", "etcd", "helm").
func (b Binaries) Path(name string) string { return filepath.Join(b.Dir, name) }

func (b Binaries) check() error {
	var missing []string
	for _, n := range allBinaries {
		if fi, err := os.Stat(b.Path(n)); err != nil || !fi.Mode().IsRegular() {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("tool cache entry %s lacks %s (remove it and run scripts/build-kube.sh)", b.Dir, strings.Join(missing, ", "))
	}
	return nil
}

func cacheKey() string { return "kubernetes-" + Version }

// LoadBinaries returns the tier's binaries, building them first where the
// k8s tier is required. Elsewhere, binaries not yet built make the tier
// unavailable, with a hint to run scripts/build-kube.sh.
func LoadBinaries(t testing.TB) Binaries {
	t.Helper()
	base := testenv.CacheDir(t)
	d, err := cachedir.Open(base)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	bins := Binaries{Dir: d.Path("tools", cacheKey())}
	if _, err := os.Stat(bins.Dir); err == nil {
		if err := bins.check(); err != nil {
			t.Fatalf("setup: %v", err)
		}
		return bins
	}
	if !testenv.Required(testenv.TierK8s) {
		testenv.Unavailable(t, testenv.TierK8s, fmt.Sprintf(
			"kubernetes %s is not in the tool cache: run scripts/build-kube.sh once (about 25 minutes on 2 cores)", Version))
	}
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Unavailable(t, testenv.TierK8s, "kubernetes is not in the tool cache and go is not on PATH to build it")
	}
	tools, err := ToolsDir()
	if err != nil {
		testenv.Unavailable(t, testenv.TierK8s, fmt.Sprintf("kubernetes is not in the tool cache: %v", err))
	}
	ctx := context.Background()
	if dl, ok := deadline(t); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-30*time.Second))
		defer cancel()
	}
	t.Logf("building kubernetes %s into the tool cache (once per version; about 25 minutes; scripts/build-kube.sh does it ahead)", Version)
	var out bytes.Buffer
	bins, err = Build(ctx, base, tools, &out)
	if err != nil {
		testenv.Unavailable(t, testenv.TierK8s, fmt.Sprintf("build kubernetes: %v\n%s", err, tail(out.Bytes(), 4000)))
	}
	return bins
}

func deadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}

// ToolsDir returns the tools module's directory in the space module that
// holds the working directory (tests run in their package's directory).
func ToolsDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isSpaceModule(filepath.Join(dir, "go.mod")) {
			return filepath.Join(dir, toolsRel), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the space module: cannot find the kubetest tools module")
		}
		dir = parent
	}
}

func isSpaceModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == "space"
		}
	}
	return false
}

// Build returns the tier's binaries in the tool cache under base
// (base/v1/tools/kubernetes-<Version>/), building them first if they are
// not there: `go build -trimpath` of the tools module at tools (its go.mod
// and go.sum pin every version) and of its helm module, with the go
// command on PATH, writing the go command's output to log. Concurrent
// callers, in any process, wait for one build; the entry appears, by an
// atomic rename, only once every binary is built.
func Build(ctx context.Context, base, tools string, log io.Writer) (Binaries, error) {
	d, err := cachedir.Open(base)
	if err != nil {
		return Binaries{}, err
	}
	if _, err := os.Stat(filepath.Join(tools, "go.mod")); err != nil {
		return Binaries{}, fmt.Errorf("tools module: %w", err)
	}
	dir, err := d.Ensure(ctx, "tools", cacheKey(), func(ctx context.Context, tmp string) error {
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return err
		}
		env := append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly -buildvcs=false")
		for _, mod := range []string{tools, filepath.Join(tools, "helm")} {
			cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags="+ldflags(), "-o", tmp+"/", "tool")
			cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = mod, env, log, log
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("go build in %s: %w", mod, err)
			}
		}
		if err := os.Rename(filepath.Join(tmp, etcdBuildName), filepath.Join(tmp, binEtcd)); err != nil {
			return err
		}
		return Binaries{Dir: tmp}.check()
	})
	if err != nil {
		return Binaries{}, err
	}
	bins := Binaries{Dir: dir}
	return bins, bins.check()
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
