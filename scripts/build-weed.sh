#!/usr/bin/env bash
# build-weed.sh builds SeaweedFS's weed binary, the real S3-compatible
# server the s3 test tier runs (internal/testenv/weedtest), from the Go
# module proxy, once per version, into the shared tool cache:
#
#   ${SPACE_CACHE_DIR:-$HOME/.cache/space}/v1/tools/weed-<version>/weed
#
# and prints its path. It builds in a throwaway module (GOFLAGS=-mod=mod),
# so SPACE's go.mod never sees SeaweedFS's dependencies; a file lock makes
# parallel callers (this script, test processes) wait for one build, and
# the binary appears only by an atomic rename once complete. On 2 cores a
# build takes about 10 minutes with the modules already downloaded and 25
# from nothing (about 300 modules); the binary is 157 MiB. Later calls
# return at once.
#
# Usage: scripts/build-weed.sh [-version v0.0.0-...]
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./internal/testenv/weedtest/buildweed "$@"
