# vibedom — build, test and demo targets. `make help` lists them.
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null)
# The commit's date, so that a build of one commit is the same build.
BUILD_DATE ?= $(shell git log -1 --format=%cI 2>/dev/null)
VZ_VERSION := $(shell $(GO) list -m -f '{{.Version}}' github.com/Code-Hex/vz/v3 2>/dev/null)
LDFLAGS  := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILD_DATE) -X main.vzVersion=$(VZ_VERSION)
HOST_OS  := $(shell $(GO) env GOOS)
BIN      := bin
# The guest agents a release binary carries (the vibedom_embedguest tag).
EMBED    := image/assets/guestbin
SHA256   := $(shell command -v sha256sum >/dev/null 2>&1 && echo sha256sum || echo 'shasum -a 256')

export PATH := $(PATH):/usr/local/go/bin

.PHONY: help build guest embed-guest release release-check release-lint test unit e2e e2e-arm64 check-darwin vet check setup assets kernel demo bench clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

build: guest ## build bin/vibedom (signed with entitlements.plist on macOS)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/vibedom ./cmd/vibedom
ifeq ($(HOST_OS),darwin)
	codesign --force --entitlements entitlements.plist -s - $(BIN)/vibedom
endif

guest: ## build the static in-VM agent for linux/amd64 and linux/arm64
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/vibedom-guest-linux-amd64 ./cmd/vibedom-guest
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/vibedom-guest-linux-arm64 ./cmd/vibedom-guest

embed-guest: guest ## copy the guest agents and their SHA256SUMS where a vibedom_embedguest build embeds them
	mkdir -p $(EMBED)
	cp $(BIN)/vibedom-guest-linux-amd64 $(BIN)/vibedom-guest-linux-arm64 $(EMBED)/
	cd $(EMBED) && $(SHA256) vibedom-guest-linux-amd64 vibedom-guest-linux-arm64 > SHA256SUMS

release: embed-guest ## dist/: Linux archives (+ darwin/arm64, signed, on a Mac), SBOMs, SHA256SUMS, verified
	rm -rf dist
	$(GO) run ./tools/release -out dist -version '$(VERSION)' -date '$(BUILD_DATE)' -ldflags '$(LDFLAGS)'
	cd dist && $(SHA256) -c SHA256SUMS

release-check: release ## the release acceptance test: dist/ against SHA256SUMS; the Linux archive alone runs init and a session
	scripts/release-check.sh dist

ACTIONLINT := github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
release-lint: ## actionlint the workflows; ruby -c the Homebrew formula (when ruby is installed)
	$(GO) run $(ACTIONLINT) .github/workflows/*.yml
	@if command -v ruby >/dev/null; then ruby -wc packaging/homebrew/vibedom.rb; else echo "release-lint: no ruby, formula not checked"; fi

setup: ## install QEMU, busybox and tools (Debian/Ubuntu), fetch test kernels, build the guest kernel
	scripts/setup.sh

assets: ## fetch the Debian test kernels and busybox into .cache/assets
	scripts/fetch-assets.sh

kernel: ## build vibedom's guest kernel (amd64) from pinned Debian source into .cache/assets (minutes, once)
	scripts/build-kernel.sh amd64

vet: ## go vet every package
	$(GO) vet ./...

check-darwin: ## type-check the darwin/arm64 build (the vz backend) on any host
	$(GO) run ./tools/check-darwin ./...

test: guest ## run every test, VM tests included (they skip with a reason without QEMU or assets)
	$(GO) test -count=1 -timeout 20m ./...

unit: guest ## run the unit tier: every package but e2e/*, without the tests that boot a VM (VM/Arm64 in the name)
	$(GO) test -count=1 -timeout 20m -skip 'VM|Arm64' $$($(GO) list ./... | grep -v /e2e/)

e2e: guest ## run only the end-to-end VM tests (amd64 guest)
	$(GO) test -count=1 -timeout 20m -run 'VM|E2E' ./session/... ./vm/... ./image/... ./netfilter/... ./e2e/...

e2e-arm64: guest ## boot the arm64 guest under qemu-system-aarch64 (TCG) and exec in it
	VIBEDOM_E2E_ARM64=1 $(GO) test -count=1 -timeout 20m -run 'Arm64' ./vm/qemu/ ./e2e/agents/

bench: guest ## run the benchmarks recorded in docs/performance.md
	$(GO) test -run '^$$' -bench . -benchtime 1x ./...

check: setup vet check-darwin release-lint test e2e-arm64 release-check ## everything CI runs (the README's test command)

demo: setup build ## a real session in a QEMU VM on examples/sample-app
	scripts/demo.sh

clean: ## remove build output (not the asset cache)
	rm -rf $(BIN) $(EMBED) dist
