#!/usr/bin/env bash
# Run the Python SDK's tests against a SPACE server of their own.
#
# scripts/with-test-server.sh builds bin/space and bin/space-agent, starts
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
PYTHON="${PYTHON:-/usr/bin/python3}"
cd "$HERE"
exec "$HERE/../../scripts/with-test-server.sh" "$PYTHON" -m pytest -p no:cacheprovider -rs "$@"
