#!/usr/bin/env bash
# Run a command against a SPACE server of its own.
#
#   scripts/with-test-server.sh CMD ARGS...
#
# Builds bin/space and bin/space-agent (as `make build` does), starts
# `bin/space server` on a free loopback port with a temporary data dir,
# waits for /v1/health and the admin key, runs CMD with SPACE_API_URL and
# SPACE_API_KEY (the admin key) exported, then deletes every sandbox (with
# the bin/space CLI), stops the server and removes the data dir (its XFS
# loop mount and run dir too), whatever happened. Exits with CMD's status.
#
# Environment:
#   SPACE_TEST_VMM            --vmm of the server: auto (default), qemu, firecracker, fake
#   SPACE_TEST_SKIP_BUILD=1   use bin/space and bin/space-agent as they are
#   SPACE_TEST_START_TIMEOUT  seconds to wait for /v1/health (default 900: a
#                             first start prepares the default template)
#   SPACE_TEST_KEEP=1         keep the data dir and server log
#   SPACE_TEST_SERVER_ARGS    more arguments of `space server` (split on spaces)
# Needs root (the server's worker mounts storage and jails guests).
set -euo pipefail

if [[ $# -eq 0 ]]; then
	echo "usage: $0 CMD ARGS..." >&2
	exit 2
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VMM="${SPACE_TEST_VMM:-auto}"
START_TIMEOUT="${SPACE_TEST_START_TIMEOUT:-900}"
export PATH="$PATH:/usr/local/go/bin"

log() { printf 'with-test-server: %s\n' "$*" >&2; }

if [[ "${SPACE_TEST_SKIP_BUILD:-}" != 1 || ! -x "$ROOT/bin/space" || ! -x "$ROOT/bin/space-agent" ]]; then
	log "building bin/space and bin/space-agent"
	(cd "$ROOT" && go build -o bin/space ./cmd/space &&
		CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o bin/space-agent ./cmd/space-agent)
fi

DATA="$(mktemp -d /tmp/space-test.XXXXXX)"
LOG="$DATA.log"
# A free port: bind port 0 and read what the kernel chose.
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"
SERVER_PID=""

# space runs the CLI against the test server.
space() {
	SPACE_API_URL="$URL" SPACE_API_KEY="$(cat "$DATA/admin.key")" "$ROOT/bin/space" --data-dir "$DATA" "$@"
}

cleanup() {
	local rc=$?
	set +e
	if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
		# VMs outlive their server (a restart re-adopts them): delete them first.
		if [[ -s "$DATA/admin.key" ]]; then
			local ids
			ids="$(space sandbox ls -o json | grep -o '"id": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/')"
			if [[ -n "$ids" ]]; then
				log "deleting $(echo "$ids" | wc -l) sandbox(es) left behind"
				# shellcheck disable=SC2086 # one ID a word
				space sandbox rm $ids >/dev/null || log "sandbox rm failed"
			fi
		fi
		kill -TERM "$SERVER_PID" 2>/dev/null
		for _ in $(seq 1 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
		kill -KILL "$SERVER_PID" 2>/dev/null
		wait "$SERVER_PID" 2>/dev/null
	fi
	# The worker's storage is an XFS image loop-mounted in the data dir, and
	# its VMs' run files are in /dev/shm/space-WORKER_ID.
	if [[ -d "$DATA" ]]; then
		findmnt -rn -o TARGET | grep -F "$DATA/" | sort -r | while read -r m; do umount -l "$m"; done
		losetup -j "$DATA/reflink.xfs" -O NAME -n 2>/dev/null | while read -r dev; do losetup -d "$dev"; done
		if [[ -s "$DATA/worker.id" ]]; then
			rm -rf "/dev/shm/space-$(cat "$DATA/worker.id")"
		fi
	fi
	if [[ "${SPACE_TEST_KEEP:-}" == 1 ]]; then
		log "kept $DATA and $LOG"
	else
		rm -rf "$DATA"
		[[ $rc -eq 0 ]] && rm -f "$LOG" || log "server log: $LOG"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting bin/space server --vmm $VMM on $URL (data dir $DATA)"
# --pool 0: test sandboxes are 256 MiB, not the pool's default shape.
# shellcheck disable=SC2086 # SPACE_TEST_SERVER_ARGS: one argument a word
"$ROOT/bin/space" server --vmm "$VMM" --listen "127.0.0.1:$PORT" --data-dir "$DATA" --pool 0 ${SPACE_TEST_SERVER_ARGS:-} >"$LOG" 2>&1 &
SERVER_PID=$!

deadline=$((SECONDS + START_TIMEOUT))
until curl -fsS -m 5 -o /dev/null "$URL/v1/health" 2>/dev/null && [[ -s "$DATA/admin.key" ]]; do
	if ! kill -0 "$SERVER_PID" 2>/dev/null; then
		log "the server exited:"; tail -n 30 "$LOG" >&2; exit 1
	fi
	if ((SECONDS > deadline)); then
		log "no /v1/health after ${START_TIMEOUT}s:"; tail -n 30 "$LOG" >&2; exit 1
	fi
	sleep 1
done
log "server up: $(grep -m1 -iE 'vmm|accel' "$LOG" | cut -c1-240 || true)"

export SPACE_API_URL="$URL"
SPACE_API_KEY="$(cat "$DATA/admin.key")"
export SPACE_API_KEY
start=$SECONDS
set +e
"$@"
rc=$?
set -e
log "$1 exit $rc after $((SECONDS - start))s"
exit $rc
