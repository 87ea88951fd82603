#!/usr/bin/env bash
# Run the unmodified e2b SDK (npm, the version package-lock.json pins)
# against SPACE's E2B-compatible API, on a SPACE server of its own.
#
# Makes a throwaway CA and a certificate for e2b.test and *.e2b.test,
# starts `bin/space server` (scripts/with-test-server.sh) with the E2B API
# on 127.0.0.1:443 under that domain, and runs the tests with node's test
# runner, E2B_DOMAIN=e2b.test, E2B_API_KEY the server's admin key,
# NODE_EXTRA_CA_CERTS the CA, and hosts.cjs resolving *.e2b.test to
# 127.0.0.1 (wildcard DNS in a real deployment).
#
#   tests/e2b/run.sh                                # all tests
#   tests/e2b/run.sh --test-name-pattern=files      # args go to node --test
#
# Environment: those of scripts/with-test-server.sh. Needs root (port
# 443, and the server's worker).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DOMAIN=e2b.test
cd "$HERE"

if [[ ! -f node_modules/.package-lock.json || package-lock.json -nt node_modules/.package-lock.json ]]; then
	echo "e2b tests: npm ci" >&2
	npm ci --no-audit --no-fund --loglevel=error
fi

TLS="$(mktemp -d /tmp/space-e2b-tls.XXXXXX)"
trap 'rm -rf "$TLS"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=SPACE e2b test CA" \
	-keyout "$TLS/ca.key" -out "$TLS/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$DOMAIN" \
	-keyout "$TLS/e2b.key" -out "$TLS/e2b.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:*.%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$DOMAIN" "$DOMAIN" >"$TLS/ext"
openssl x509 -req -in "$TLS/e2b.csr" -CA "$TLS/ca.crt" -CAkey "$TLS/ca.key" -CAcreateserial -days 2 \
	-extfile "$TLS/ext" -out "$TLS/e2b.crt" 2>/dev/null

export SPACE_TEST_SERVER_ARGS="--e2b-listen 127.0.0.1:443 --e2b-domain $DOMAIN --e2b-tls-cert $TLS/e2b.crt --e2b-tls-key $TLS/e2b.key"
export E2B_DOMAIN="$DOMAIN" E2B_TEST_DOMAIN="$DOMAIN" NODE_EXTRA_CA_CERTS="$TLS/ca.crt"
# The tests read E2B_API_KEY; with-test-server.sh exports the admin key
# as SPACE_API_KEY once the server is up.
"$HERE/../../scripts/with-test-server.sh" bash -c 'E2B_API_KEY="$SPACE_API_KEY" exec node --require ./hosts.cjs --test --test-concurrency=1 "$@"' e2b-tests "$@" e2b.test.mjs
