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

.PHONY: deps build images test run clean kind-up kind-down

deps:
	scripts/install-deps.sh

build:
	$(GO) build -o bin/space ./cmd/space
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/space-agent ./cmd/space-agent

# images writes the OCI image archives of the control plane and the worker
# to dist/images (docs/images.md). They ship a static, path-independent
# build of space; the base layers are cached in SPACE_CACHE_DIR (the first
# worker base is a debootstrap: minutes, as root).
# The labels and time stamps come from git: the commit, its time
# (SOURCE_DATE_EPOCH) and the origin remote.
IMAGE_REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
IMAGE_VERSION ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo +dirty)
IMAGE_SOURCE ?= $(shell git remote get-url origin 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
images: build
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/images/space ./cmd/space
	$(GO) build -o bin/space-images ./cmd/space-images
	SOURCE_DATE_EPOCH='$(SOURCE_DATE_EPOCH)' bin/space-images --space bin/images/space --agent bin/space-agent \
		--out dist/images --version '$(IMAGE_VERSION)' --revision '$(IMAGE_REVISION)' --source '$(IMAGE_SOURCE)'

# kind-up runs SPACE on a local Kind cluster: make images, the cluster of
# deploy/kind/cluster.yaml (made once, then reused), the archives loaded
# into its nodes and the chart installed (docs/kubernetes.md). It needs
# docker, kind, kubectl and helm. kind-down uninstalls (the workers' purge
# Jobs clean the nodes) and deletes the cluster; the worker's artifact
# cache stays in /var/cache/space-kind on the Docker host.
KIND_CLUSTER ?= space
kind-up:
	KIND_CLUSTER='$(KIND_CLUSTER)' deploy/kind/up.sh

kind-down:
	KIND_CLUSTER='$(KIND_CLUSTER)' deploy/kind/down.sh

# testsummary prints failures, skips and a summary, and fails the run when a
# test fails or a required tier (SPACE_TEST_TIERS) skips.
test: deps
	$(GO) vet ./...
	GOBIN=$(CURDIR)/bin $(GO) install $(CHECKLOCKS)
	$(GO) vet -vettool=$(CURDIR)/bin/checklocks ./...
	$(GO) test -json -count=1 -timeout 60m -p 2 ./... 2>&1 | $(GO) run ./internal/testenv/testsummary
	$(GO) test -run '^$$' -fuzz FuzzReader -fuzztime 20s ./internal/agent/proto
	sdk/python/run-tests.sh -q
	sdk/typescript/run-tests.sh
	tests/e2b/run.sh

run: deps build
	bin/space server

clean:
	rm -rf bin dist
