# SPACE: make run (build and start space server), make test (what CI runs).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

# Go from the official tarball works without being on PATH.
export PATH := $(PATH):/usr/local/go/bin
# The artifact cache (kernel, initramfs, rootfs; about 0.5 GiB), shared by
# the tests and bin/space.
export SPACE_CACHE_DIR ?= $(HOME)/.cache/space

GO ?= go
# The lock-annotation checker (// +checklocks:mu), run through go vet.
CHECKLOCKS := gvisor.dev/gvisor/tools/checklocks/cmd/checklocks@v0.0.0-20260905035102-160fafc42237

.PHONY: deps build test run clean

deps:
	scripts/install-deps.sh

build:
	$(GO) build -o bin/space ./cmd/space
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/space-agent ./cmd/space-agent

# testsummary prints failures, skips and a summary, and fails the run when a
# test fails or a required tier (SPACE_TEST_TIERS) skips.
test: deps
	$(GO) vet ./...
	GOBIN=$(CURDIR)/bin $(GO) install $(CHECKLOCKS)
	$(GO) vet -vettool=$(CURDIR)/bin/checklocks ./...
	$(GO) test -json -count=1 -timeout 45m -p 2 ./... 2>&1 | $(GO) run ./internal/testenv/testsummary
	$(GO) test -run '^$$' -fuzz FuzzReader -fuzztime 20s ./internal/agent/proto

run: deps build
	bin/space server

clean:
	rm -rf bin
