#!/usr/bin/env bash
# build-kube.sh builds the binaries of the k8s test tier
# (internal/testenv/kubetest) from the Go module proxy, once per version,
# into the shared tool cache:
#
#   ${SPACE_CACHE_DIR:-$HOME/.cache/space}/v1/tools/kubernetes-<version>/
#     etcd kube-apiserver kube-controller-manager kube-scheduler kubelet
#     kube-proxy kubectl helm
#
# and prints that directory. It builds the tools module kept in
# internal/testenv/kubetest/tools (its go.mod and go.sum pin
# k8s.io/kubernetes, etcd and helm; SPACE's go.mod never sees them) with
# -trimpath and the version stamped in. A file lock makes parallel callers
# (this script, test processes) wait for one build, and the directory
# appears only by an atomic rename once every binary is built. On 2 cores
# a cold build takes about 25 minutes (build cache +5.4 GB); later calls
# return at once.
#
# Usage: scripts/build-kube.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./internal/testenv/kubetest/buildkube "$@"
