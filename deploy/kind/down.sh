#!/usr/bin/env bash
# down.sh removes what up.sh made (`make kind-down`): it uninstalls the
# release, whose post-delete Jobs purge what the workers made on the VM
# nodes (VMs, their run files in the host's /dev/shm/space-kind, mounts,
# data), and deletes the Kind cluster. The workers' artifact cache stays
# in /var/cache/space-kind on the Docker host for the next make kind-up.
# The same environment as up.sh names the cluster, namespace and release.
set -euo pipefail

me=kind-down
# shellcheck source=deploy/kind/up.sh
source "$(dirname "${BASH_SOURCE[0]}")/up.sh"

need_tool kind "install kind v0.20 or newer"
clusters=$(kind get clusters)
if ! grep -qx -- "$cluster" <<<"$clusters"; then
	echo "$me: no Kind cluster $cluster"
	exit 0
fi

if ! command -v helm >/dev/null 2>&1; then
	echo "$me: helm not found on PATH: deleting the cluster without uninstalling; remove /dev/shm/space-kind on the Docker host yourself" >&2
elif helm status "$release" --kube-context "$context" --namespace "$namespace" >/dev/null 2>&1; then
	helm uninstall "$release" --kube-context "$context" --namespace "$namespace" --wait --timeout 10m ||
		echo "$me: helm uninstall failed: deleting the cluster anyway; remove /dev/shm/space-kind on the Docker host yourself" >&2
fi

kind delete cluster --name "$cluster"
echo "$me: deleted Kind cluster $cluster; the workers' artifact cache stays in /var/cache/space-kind"
