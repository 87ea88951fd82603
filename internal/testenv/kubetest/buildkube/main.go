// Command buildkube builds the binaries the k8s test tier runs (etcd, the
// Kubernetes control plane, kubelet, kube-proxy, kubectl, helm) into the
// shared tool cache, once per version, and prints their directory.
// scripts/build-kube.sh runs it.
//
// Usage: buildkube
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"space/internal/cachedir"
	"space/internal/testenv/kubetest"
)

func main() {
	flag.Parse()
	base := cachedir.DefaultBase(nil)
	if base == "" {
		fmt.Fprintln(os.Stderr, "buildkube: no cache directory: set SPACE_CACHE_DIR")
		os.Exit(1)
	}
	tools, err := kubetest.ToolsDir()
	if err != nil {
		fmt.Fprintf(os.Stderr, "buildkube: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	bins, err := kubetest.Build(ctx, base, tools, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "buildkube: %v\n", err)
		os.Exit(1)
	}
	if time.Since(start) > 5*time.Second {
		fmt.Fprintf(os.Stderr, "buildkube: kubernetes %s ready after %v\n", kubetest.Version, time.Since(start).Round(time.Second))
	}
	fmt.Println(bins.Dir)
}
