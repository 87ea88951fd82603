#!/usr/bin/env bash
# regen.sh regenerates this tools module's go.mod/go.sum (and helm/'s) from
# the pinned versions below. k8s.io/kubernetes cannot be `go install`ed (its
# go.mod replaces its staging modules with local paths), so this module
# requires it and replaces each staging module with its published v0.x.y.
# Helm has a module of its own so its newer shared dependencies (grpc,
# otel) never change what the Kubernetes binaries are built from.
#
# Usage: internal/testenv/kubetest/tools/regen.sh
set -euo pipefail
cd "$(dirname "$0")"

kube=v1.37.2
staging=v0.37.2
etcd=v3.7.0
helm=v4.3.2

export GOWORK=off GOFLAGS=-mod=mod
mod=$(go mod download -json "k8s.io/kubernetes@$kube" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
{
	echo "// Module tools builds the binaries of the k8s test tier (see ../tools.go)."
	echo "// Regenerate with regen.sh; do not edit by hand."
	echo "module space/internal/testenv/kubetest/tools"
	echo
	echo "go 1.26.0"
	echo
	echo "require k8s.io/kubernetes $kube"
	echo
	echo "replace ("
	grep -E '^\s+k8s.io/[^ ]+ => \./staging/' "$mod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
	echo ")"
} >go.mod
rm -f go.sum
go get -tool \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubelet \
	k8s.io/kubernetes/cmd/kube-proxy \
	k8s.io/kubernetes/cmd/kubectl \
	"go.etcd.io/etcd/server/v3@$etcd"
go mod tidy

cd helm
{
	echo "// Module helm builds the helm CLI of the k8s test tier (see ../../tools.go)."
	echo "// Regenerate with ../regen.sh; do not edit by hand."
	echo "module space/internal/testenv/kubetest/tools/helm"
	echo
	echo "go 1.26.0"
} >go.mod
rm -f go.sum
go get -tool "helm.sh/helm/v4/cmd/helm@$helm"
go mod tidy
