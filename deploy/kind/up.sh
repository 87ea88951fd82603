#!/usr/bin/env bash
# up.sh brings SPACE up on a local Kind cluster (`make kind-up`): it builds
# the images (make images), creates the cluster of deploy/kind/cluster.yaml
# or reuses it, loads the image archives into its nodes, labels the VM
# nodes and installs the chart with deploy/kind/values.yaml. Run it again
# after a change: every step is idempotent. docs/kubernetes.md explains it.
#
# Environment: KIND_CLUSTER (default space), SPACE_NAMESPACE (default
# space), SPACE_RELEASE (default space), HELM_TIMEOUT (default 30m: a
# node's first worker start bootstraps Debian).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cluster=${KIND_CLUSTER:-space}
namespace=${SPACE_NAMESPACE:-space}
release=${SPACE_RELEASE:-space}
context=kind-${cluster}

# me prefixes messages; down.sh, which sources this file, sets its own.
me=${me:-kind-up}

die() {
	echo "$me: $*" >&2
	exit 1
}

# need_tool exits with how to get TOOL when it is not on PATH.
need_tool() {
	command -v "$1" >/dev/null 2>&1 || die "$1 not found on PATH: $2"
}

# worker_image prints the repository and the tag of the worker image in
# the index DIR/images.json that `make images` writes (a JSON array of
# objects, one field per line), separated by a space.
worker_image() {
	local index=$1/images.json ref
	[[ -f $index ]] || die "$index not found: run make images"
	ref=$(sed -n 's/^ *"reference": *"\([^"]*\/space-worker:[^"]*\)",\{0,1\}$/\1/p' "$index")
	[[ -n $ref && $ref != *$'\n'* ]] || die "$index names no single space-worker image"
	echo "${ref%:*} ${ref##*:}"
}

# archives prints the path of every image archive in DIR/images.json, one
# a line.
archives() {
	local index=$1/images.json name names
	[[ -f $index ]] || die "$index not found: run make images"
	names=$(sed -n 's/^ *"archive": *"\([^"/]*\.tar\)",\{0,1\}$/\1/p' "$index")
	[[ -n $names ]] || die "$index names no image archive: run make images"
	while read -r name; do
		[[ -f $1/$name ]] || die "$1/$name (in $index) not found: run make images"
		echo "$1/$name"
	done <<<"$names"
}

# check_host fails unless the Docker host has the devices cluster.yaml
# mounts into the VM node: Docker would make empty directories for
# missing ones. Only a local Docker host can be checked.
check_host() {
	if [[ -n ${DOCKER_HOST:-} && ${DOCKER_HOST} != unix://* ]]; then
		echo "$me: DOCKER_HOST=$DOCKER_HOST: not checking that it has /dev/kvm and /dev/net/tun" >&2
		return
	fi
	[[ -c /dev/kvm ]] || die "/dev/kvm is not a character device here: the VM node needs KVM on the Docker host (docs/kubernetes.md)"
	[[ -c /dev/net/tun ]] || die "/dev/net/tun is not a character device here: load the tun module (modprobe tun)"
}

main() {
	need_tool docker "install Docker (Kind runs its nodes as containers)"
	need_tool kind "install kind v0.20 or newer"
	need_tool kubectl "install kubectl"
	need_tool helm "install Helm v3.8 or newer"
	docker info >/dev/null 2>&1 || die "docker info failed: start the Docker daemon, or let this user reach it"
	check_host

	cd "$repo"
	make images

	local clusters
	clusters=$(kind get clusters)
	if grep -qx -- "$cluster" <<<"$clusters"; then
		echo "$me: reusing Kind cluster $cluster"
	else
		kind create cluster --config deploy/kind/cluster.yaml --name "$cluster"
	fi

	local list a
	list=$(archives dist/images)
	while read -r a; do
		kind load image-archive "$a" --name "$cluster"
	done <<<"$list"

	# cluster.yaml labels the VM node; a cluster made from an older config
	# gets the label here.
	kubectl --context "$context" label nodes --overwrite \
		--selector '!node-role.kubernetes.io/control-plane' space/vm-host=true

	local image repository tag
	image=$(worker_image dist/images)
	repository=${image% *}
	tag=${image#* }
	helm upgrade --install "$release" deploy/helm/space \
		--kube-context "$context" --namespace "$namespace" --create-namespace \
		--values deploy/kind/values.yaml \
		--set-string image.repository="$repository" --set-string image.tag="$tag" \
		--wait --timeout "${HELM_TIMEOUT:-30m}"

	local server=$release-server
	[[ $release == *space* ]] || server=$release-space-server
	cat <<-EOF

		SPACE is up on Kind cluster $cluster (namespace $namespace, image $repository:$tag).
		Reach the API (keep this running):
		  kubectl --context $context -n $namespace port-forward svc/$server 7070
		Then, in another terminal:
		  export SPACE_API_URL=http://127.0.0.1:7070
		  export SPACE_API_KEY=\$(kubectl --context $context -n $namespace exec deploy/$server -- cat /var/lib/space/admin.key)
		  bin/space sandbox create --memory 512 --timeout 30m
		Remove it all with make kind-down.
	EOF
}

# Sourced (by down.sh and the tests), it only defines the functions and
# the names.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	main "$@"
fi
