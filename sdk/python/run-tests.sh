#!/usr/bin/env bash
# Run the Python SDK's tests against a SPACE server of their own.
#
# Builds bin/space and bin/space-agent (as `make build` does), starts
# `bin/space server` on a free loopback port with a temporary data dir,
# waits for /v1/health, runs pytest with its admin key, then deletes every
# sandbox, stops the server and removes the data dir (its XFS loop mount
# and run dir too), whatever happened.
#
#   sdk/python/run-tests.sh                 # real VMs (the server's default VMM)
#   SPACE_TEST_VMM=fake sdk/python/run-tests.sh -k files   # jailed processes; args go to pytest
#
# Environment:
#   SPACE_TEST_VMM            --vmm of the server: auto (default), qemu, firecracker, fake
#   SPACE_TEST_SKIP_BUILD=1   use bin/space and bin/space-agent as they are
#   SPACE_TEST_START_TIMEOUT  seconds to wait for /v1/health (default 900: a
#                             first start prepares the default template)
#   SPACE_TEST_KEEP=1         keep the data dir and server log
#   PYTHON                    the interpreter (default /usr/bin/python3, which
#                             has Debian's pytest and pytest-asyncio)
# Needs root (the server's worker mounts storage and jails guests).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"
VMM="${SPACE_TEST_VMM:-auto}"
START_TIMEOUT="${SPACE_TEST_START_TIMEOUT:-900}"
export PATH="$PATH:/usr/local/go/bin"

log() { printf 'run-tests: %s\n' "$*" >&2; }

if [[ "${SPACE_TEST_SKIP_BUILD:-}" != 1 || ! -x "$ROOT/bin/space" || ! -x "$ROOT/bin/space-agent" ]]; then
	log "building bin/space and bin/space-agent"
	(cd "$ROOT" && go build -o bin/space ./cmd/space &&
		CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o bin/space-agent ./cmd/space-agent)
fi

DATA="$(mktemp -d /tmp/space-sdk-test.XXXXXX)"
LOG="$DATA.log"
PORT="$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"
SERVER_PID=""

cleanup() {
	local rc=$?
	set +e
	if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
		# VMs outlive their server (a restart re-adopts them): delete them first.
		if [[ -s "$DATA/admin.key" ]]; then
			SPACE_API_URL="$URL" SPACE_API_KEY="$(cat "$DATA/admin.key")" PYTHONPATH="$HERE" "$PYTHON" - <<'EOF'
from space_sdk import Space
with Space(timeout=120) as s:
    for sb in s.sandboxes.list():
        try:
            sb.delete(missing_ok=True)
        except Exception as e:  # noqa: BLE001
            print("run-tests: delete %s: %s" % (sb.id, e))
EOF
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
# --pool 0: the tests' sandboxes are 256 MiB, not the pool's default shape.
"$ROOT/bin/space" server --vmm "$VMM" --listen "127.0.0.1:$PORT" --data-dir "$DATA" --pool 0 >"$LOG" 2>&1 &
SERVER_PID=$!

deadline=$((SECONDS + START_TIMEOUT))
healthy() {
	"$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/v1/health", timeout=5)' "$URL" 2>/dev/null
}
until healthy && [[ -s "$DATA/admin.key" ]]; do
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
cd "$HERE"
start=$SECONDS
set +e
"$PYTHON" -m pytest -p no:cacheprovider -rs "$@"
rc=$?
set -e
log "pytest exit $rc after $((SECONDS - start))s"
exit $rc
