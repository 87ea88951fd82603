#!/usr/bin/env bash
# Run the TypeScript SDK's tests against a SPACE server of their own.
#
# Installs the dev dependencies (npm ci) when node_modules is missing or
# older than package-lock.json, builds the package (dist/) and the tests
# (.test-build/), then runs them with node --test through
# scripts/with-test-server.sh, which starts `bin/space server` with a
# temporary data dir and removes every sandbox, the server and its data
# dir afterwards, whatever happened.
#
#   sdk/typescript/run-tests.sh                               # real VMs (the server's default VMM)
#   SPACE_TEST_VMM=fake sdk/typescript/run-tests.sh           # jailed processes
#   TESTS="files ports" sdk/typescript/run-tests.sh --test-name-pattern=tar   # args go to node --test
#
# Environment: TESTS (test files by name, default all of test/*.test.ts),
# NODE (default node), and those of scripts/with-test-server.sh
# (SPACE_TEST_VMM, SPACE_TEST_SKIP_BUILD, SPACE_TEST_START_TIMEOUT, SPACE_TEST_KEEP).
# Needs root (the server's worker mounts storage and jails guests).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODE="${NODE:-node}"
cd "$HERE"

if [[ ! -f node_modules/.package-lock.json || package-lock.json -nt node_modules/.package-lock.json ]]; then
	echo "run-tests: npm ci" >&2
	npm ci --no-audit --no-fund --loglevel=error
fi
rm -rf dist .test-build
npx tsc -p tsconfig.json
npx tsc -p test/tsconfig.json

files=()
for t in ${TESTS:-$(cd test && ls -- *.test.ts | sed 's/\.test\.ts$//')}; do
	files+=(".test-build/$t.test.js")
done
flags=(--test --test-concurrency=1)
# Node 22+ has a WebSocket of its own; 20 and 21 have it behind a flag.
major="$("$NODE" -p 'process.versions.node.split(".")[0]')"
if ((major == 20 || major == 21)); then
	flags=(--experimental-websocket "${flags[@]}")
fi
exec "$HERE/../../scripts/with-test-server.sh" "$NODE" "${flags[@]}" "$@" "${files[@]}"
