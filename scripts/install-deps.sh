#!/usr/bin/env bash
# install-deps.sh installs the host packages SPACE needs on Debian 12 or
# Ubuntu and checks for Go. It is idempotent: it installs only what is
# missing, refreshes the apt index only when it has to, and uses sudo only
# when not run as root.
set -euo pipefail

# QEMU boots the sandbox VMs; e2fsprogs (mkfs.ext4) and debootstrap build the
# guest images; xfsprogs makes reflink-capable storage; iproute2 sets up
# network namespaces; postgresql and sqlite3 back the control plane's store.
# containerd, runc, containernetworking-plugins and iptables run the k8s test
# tier's one-node cluster (internal/testenv/kubetest; its Kubernetes binaries
# come from scripts/build-kube.sh, kubectl included: Debian 12 has none recent).
# The Python SDK's tests (sdk/python) run on Debian's python3 with its httpx,
# websockets, yaml (the type generator) and pytest packages. The TypeScript
# SDK (sdk/typescript) and the E2B SDK tests (tests/e2b) need Node.js 18 or
# newer with npm: Debian's nodejs and npm when the machine has no node;
# their npm packages are installed from their lock files (npm ci).
# openssl makes the E2B tests' throwaway certificates.
packages=(
	qemu-system-x86
	qemu-utils
	e2fsprogs
	debootstrap
	xfsprogs
	iproute2
	ca-certificates
	postgresql
	sqlite3
	containerd
	runc
	containernetworking-plugins
	iptables
	python3
	python3-httpx
	python3-websockets
	python3-yaml
	python3-pytest
	python3-pytest-asyncio
	openssl
	curl
)
# Node.js: the machine's own when it has one, else Debian's.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	packages+=(nodejs npm)
fi

# The guest kernel is fetched as this package through the host's apt index
# (Debian only; see internal/image/kernel).
kernel_package=linux-image-cloud-amd64

min_go_major=1
min_go_minor=26

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
	die "needs a Debian or Ubuntu system (dpkg-query or apt-get not found)"
fi

missing=()
for p in "${packages[@]}"; do
	if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
		missing+=("$p")
	fi
done

need_update=false
if ((${#missing[@]} > 0)); then
	need_update=true
fi
os_id=
if [[ -r /etc/os-release ]]; then
	# shellcheck disable=SC1091
	os_id=$(. /etc/os-release && echo "${ID:-}")
fi
if [[ $os_id == debian ]] && ! apt-cache show "$kernel_package" >/dev/null 2>&1; then
	log "the apt index does not list $kernel_package (the guest kernel)"
	need_update=true
fi

sudo=()
if $need_update && [[ $EUID -ne 0 ]]; then
	command -v sudo >/dev/null ||
		die "apt-get must run (missing: ${missing[*]:-none}) but this is not root and sudo is not installed: run this script as root"
	sudo=(sudo)
fi
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
if $need_update; then
	log "updating the apt index"
	"${apt[@]}" update -q </dev/null
fi
if ((${#missing[@]} > 0)); then
	log "installing: ${missing[*]}"
	"${apt[@]}" install -y -q --no-install-recommends \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		"${missing[@]}" </dev/null
else
	log "host packages: all installed"
fi

# Go: on PATH, or where the official tarball puts it.
go_bin=$(command -v go || true)
if [[ -z $go_bin && -x /usr/local/go/bin/go ]]; then
	go_bin=/usr/local/go/bin/go
	log "note: using $go_bin; add /usr/local/go/bin to PATH to run go yourself"
fi
[[ -n $go_bin ]] ||
	die "Go $min_go_major.$min_go_minor or newer is required but was found neither on PATH nor in /usr/local/go/bin; install it (https://go.dev/doc/install) and re-run"
go_version=$("$go_bin" env GOVERSION) # e.g. go1.26.8
if [[ ! $go_version =~ ^go([0-9]+)\.([0-9]+) ]]; then
	die "cannot parse the version of $go_bin ($go_version); Go $min_go_major.$min_go_minor or newer is required"
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
if ((major < min_go_major || (major == min_go_major && minor < min_go_minor))); then
	die "$go_bin is $go_version; Go $min_go_major.$min_go_minor or newer is required (https://go.dev/doc/install)"
fi
log "go: $go_version ($go_bin)"

# Node.js 18 or newer, then the npm packages of the JavaScript test suites.
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
((node_major >= 18)) || die "Node.js 18 or newer is required; node is $(node --version 2>/dev/null || echo missing)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for dir in sdk/typescript tests/e2b; do
	if [[ ! -f $here/$dir/node_modules/.package-lock.json || $here/$dir/package-lock.json -nt $here/$dir/node_modules/.package-lock.json ]]; then
		log "npm ci in $dir"
		(cd "$here/$dir" && npm ci --no-audit --no-fund --loglevel=error </dev/null)
	fi
done
log "node: $(node --version)"
