# dnsstandby — see README.md. Targets that need root say so.
GO       ?= go
FUZZTIME ?= 60s
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: build release release-check deb image install test test-deps fmt-check vet fuzz bench bench-peers bench-mirror lab docs docs-check

# What a build says it is (`dnsstandby version`), from git: VERSION
# DEBVERSION REVISION TIME MODIFIED, "-" for unknown (scripts/version).
# `make release VERSION=v1.2.3` overrides the version (a tree without git).
VCS        := $(shell VERSION='$(VERSION)' scripts/version)
VERSION    := $(word 1,$(VCS))
DEBVERSION := $(word 2,$(VCS))
known       = $(filter-out -,$(1))
BUILDINFO  := github.com/dnsstandby/dnsstandby/internal/buildinfo
# -s -w: no symbol table or DWARF (stack traces keep their names); -X: the
# version and commit, for builds where the go command cannot stamp them
# itself (a git worktree, -buildvcs=false); where it can, its stamp wins.
LDFLAGS    := -s -w -X $(BUILDINFO).linkedVersion=$(VERSION) \
	-X $(BUILDINFO).linkedRevision=$(call known,$(word 3,$(VCS))) \
	-X $(BUILDINFO).linkedTime=$(call known,$(word 4,$(VCS))) \
	-X $(BUILDINFO).linkedModified=$(call known,$(word 5,$(VCS)))
# Static (no cgo: nothing is linked from the C library), without the build
# machine's paths, and stamped.
GOBUILD    := CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags '$(LDFLAGS)'

# Where release, deb and image write, and for which architectures (AKS runs
# amd64 and arm64 node pools).
DIST   ?= dist
ARCHES ?= amd64 arm64

## build: bin/dnsstandby for this machine: static (CGO_ENABLED=0), stamped
## with its version and commit (`dnsstandby version`)
build:
	$(GOBUILD) -o bin/dnsstandby ./cmd/dnsstandby

## release: $(DIST)/dnsstandby-linux-ARCH for each of ARCHES (amd64 arm64),
## built as `build` does, and $(DIST)/SHA256SUMS over them
## (`cd dist && sha256sum -c SHA256SUMS`); then release-check
release:
	@mkdir -p $(DIST)
	@for a in $(ARCHES); do \
		echo "GOOS=linux GOARCH=$$a go build -> $(DIST)/dnsstandby-linux-$$a ($(VERSION))"; \
		GOOS=linux GOARCH=$$a $(GOBUILD) -o $(DIST)/dnsstandby-linux-$$a ./cmd/dnsstandby || exit 1; \
	done
	cd $(DIST) && sha256sum $(ARCHES:%=dnsstandby-linux-%) > SHA256SUMS
	@$(MAKE) --no-print-directory release-check

## release-check: run each of ARCHES's release binaries, the foreign ones
## under qemu-user-static (installed when missing, as root): --version,
## `run --validate` of a small Corefile, and for a foreign architecture
## the wire and cache tests compiled for it (scripts/release-check)
release-check:
	scripts/release-check $(DIST) $(ARCHES)

## deb: $(DIST)/dnsstandby_DEBVERSION_ARCH.deb for each of ARCHES, made by
## nfpm (packaging/nfpm.yaml) from the release binaries: /usr/bin/dnsstandby,
## the unit from deploy/systemd, /etc/default/dnsstandby as a conffile, the
## man page dnsstandby(8) and bash completion (written by bin/dnsstandby
## from its flags), the changelogs and the DEP-5 copyright. Installing it
## neither enables nor starts the service (docs/install.md).
deb: release bin/nfpm build
	@for a in $(ARCHES); do \
		scripts/build-deb $(DIST) $$a $(DEBVERSION) bin/dnsstandby $(call known,$(word 4,$(VCS))) || exit 1; \
	done

## bin/nfpm: the nfpm pinned as a tool in packaging/tools/go.mod, a module
## of its own so that its dependencies stay out of the main module's
bin/nfpm: packaging/tools/go.mod packaging/tools/go.sum
	cd packaging/tools && $(GO) build -o ../../bin/nfpm github.com/goreleaser/nfpm/v2/cmd/nfpm

## image (root): $(DIST)/dnsstandby-image.oci.tar, an OCI image index with
## one image per ARCHES: the static binary alone on an empty base
## (packaging/Containerfile), built with buildah (installed when missing)
image: release
	scripts/build-image $(DIST) $(VERSION) $(call known,$(word 3,$(VCS))) $(call known,$(word 4,$(VCS))) $(ARCHES)

## install: the binary at $(DESTDIR)$(PREFIX)/bin (PREFIX /usr/local), the
## unit at $(DESTDIR)$(UNITDIR) (/etc/systemd/system), and
## /etc/default/dnsstandby unless there is one; enables and starts nothing:
## edit /etc/default/dnsstandby, then `systemctl daemon-reload` and
## `systemctl enable --now dnsstandby`
PREFIX  ?= /usr/local
UNITDIR ?= /etc/systemd/system
install: build
	install -D -m 0755 bin/dnsstandby $(DESTDIR)$(PREFIX)/bin/dnsstandby
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|^ExecStart=/usr/local/bin/dnsstandby |ExecStart=$(PREFIX)/bin/dnsstandby |' \
		deploy/systemd/dnsstandby.service > $(DESTDIR)$(UNITDIR)/dnsstandby.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/dnsstandby.service
	@if [ -e $(DESTDIR)/etc/default/dnsstandby ]; then \
		echo "kept $(DESTDIR)/etc/default/dnsstandby (deploy/systemd/dnsstandby.default is the new example)"; \
	else \
		install -D -m 0644 deploy/systemd/dnsstandby.default $(DESTDIR)/etc/default/dnsstandby; \
	fi

## test: gofmt check, go vet, the documents (docs-check), and every test
## with the race detector (integration tests run CoreDNS from bin/coredns,
## so it is built first); then the tests that measure CPU time (named
## Test...CPU, in files built without -race), without the detector, whose
## cost they would otherwise measure; the lab's packages one at a time, as
## each times real CoreDNS and clients on the machine's CPUs
test: test-deps fmt-check vet docs-check bin/coredns
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'CPU$$' ./...
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -p 1 ./...
	cd deploy/tests && $(GO) vet ./... && $(GO) test -count=1 ./...

## docs: rewrite the parts of the documents made from the code (flag and
## metric tables, sample output: internal/gendoc); `make test` fails while
## a document's copy differs
docs:
	DNSSTANDBY_UPDATE_DOCS=1 $(GO) test -count=1 -run 'Docs' ./...
	cd deploy/tests && DNSSTANDBY_UPDATE_DOCS=1 $(GO) test -count=1 -run 'Docs' ./...

## docs-check: the documents held to the tree and to each other
## (internal/doccheck): a measured figure (lab and test durations, the
## crash-storm table) stated in two documents, or stated differently,
## fails, and so does docs/architecture.md's package table when it differs
## from `go list ./...` or a package imports what the table forbids
docs-check:
	$(GO) test -count=1 ./internal/doccheck/

## bin/coredns: the CoreDNS pinned as a tool in bench/tools/go.mod (v1.13.1),
## built once (how long: bench/README.md). It has a
## module of its own so that the main module's newer miekg/dns, caddy or
## prometheus cannot leak into the CoreDNS under test: it builds with exactly
## the dependency versions CoreDNS 1.13.1 was released with. Its main
## (bench/tools/coredns) is CoreDNS's own with one plugin added ahead of
## cache: lossy, which drops a share of the queries a block would answer
## (the lab's lossy scenario); erratic answers every query itself, so it
## cannot stand in front of a real server. Blocks without lossy run as in
## CoreDNS 1.13.1.
bin/coredns: bench/tools/go.mod bench/tools/go.sum bench/tools/coredns/main.go
	cd bench/tools && $(GO) build -o ../../bin/coredns ./coredns

## test-deps: the Debian packages the tests run (dig, kdig, dnsperf, dnsdist,
## promtool), installed when missing (as root)
test-deps:
	@scripts/install-test-deps

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

## fuzz: run every fuzz target for FUZZTIME each (their seed corpora run in `make test`)
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzInsert$$' -fuzztime $(FUZZTIME) ./cache/
	$(GO) test -run '^$$' -fuzz '^FuzzServe$$' -fuzztime $(FUZZTIME) ./cache/
	$(GO) test -run '^$$' -fuzz '^FuzzInsertMirror$$' -fuzztime $(FUZZTIME) ./cache/
	$(GO) test -run '^$$' -fuzz '^FuzzParseQuery$$' -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run '^$$' -fuzz '^FuzzQueryPath$$' -fuzztime $(FUZZTIME) ./pipeline/
	$(GO) test -run '^$$' -fuzz '^FuzzAccept$$' -fuzztime $(FUZZTIME) ./upstream/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./corefile/
	$(GO) test -run '^$$' -fuzz '^FuzzParsePacket$$' -fuzztime $(FUZZTIME) ./mirror/tap/
	$(GO) test -run '^$$' -fuzz '^FuzzFrames$$' -fuzztime $(FUZZTIME) ./mirror/dnstap/
	$(GO) test -run '^$$' -fuzz '^FuzzDnstapMessage$$' -fuzztime $(FUZZTIME) ./mirror/dnstap/
	$(GO) test -run '^$$' -fuzz '^FuzzServeTruncated$$' -fuzztime $(FUZZTIME) ./cache/
	$(GO) test -run '^$$' -fuzz '^FuzzParseHosts$$' -fuzztime $(FUZZTIME) ./localanswer/
	$(GO) test -run '^$$' -fuzz '^FuzzTemplates$$' -fuzztime $(FUZZTIME) ./localanswer/

## bench: the cache's micro-benchmarks (ratios within one run are what count)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./cache/ ./wire/

## bench-peers (root): dnsstandby, CoreDNS (cache), dnsdist (packet cache) and a
## bare Go UDP reflector answering the same cached queries, one at a time on
## CPU 0, dnsperf on CPU 1, at 100,000 qps and at full rate, in a network
## namespace of its own; needs dnsperf and dnsdist (Debian packages).
## Writes bench/out/peers.json; see bench/README.md.
PEERS_BIN := bench/out/bin
bench-peers: bin/coredns
	@[ "$$(id -u)" = 0 ] || { echo "bench-peers needs root (network namespace, CPU pinning)"; exit 1; }
	$(GO) build -o $(PEERS_BIN)/dnsstandby ./cmd/dnsstandby
	cd bench && $(GO) build -o out/bin/peers ./cmd/peers && $(GO) build -o out/bin/reflector ./cmd/reflector
	$(PEERS_BIN)/peers -out bench/out/peers.json -coredns bin/coredns \
		-dnsstandby $(PEERS_BIN)/dnsstandby -reflector $(PEERS_BIN)/reflector $(PEERS_FLAGS)

## bench-mirror (root): what dnsstandby's mirror feed costs beside LocalDNS:
## LocalDNS (CoreDNS 1.13.1, AKS pod block) and dnsstandby (--steering adopt)
## on 169.254.10.11:53, both on CPU 0, dnsperf on CPU 1 at 20,000 qps for
## 20 s, once per feed (tap, dnstap, none), in a network namespace of its own.
## Writes bench/out/mirror.json; see bench/README.md.
bench-mirror: bin/coredns
	@[ "$$(id -u)" = 0 ] || { echo "bench-mirror needs root (network namespace, CPU pinning, eBPF steering)"; exit 1; }
	$(GO) build -o $(PEERS_BIN)/dnsstandby ./cmd/dnsstandby
	cd bench && $(GO) build -o out/bin/mirrorcost ./cmd/mirrorcost
	$(PEERS_BIN)/mirrorcost -out bench/out/mirror.json -coredns bin/coredns \
		-dnsstandby $(PEERS_BIN)/dnsstandby $(MIRROR_FLAGS)

## lab (root): the crash-storm lab — for each scenario, one node per setup
## (LocalDNS under a real systemd in namespaces, a pod, kube-dns), the same
## load and fault side by side; writes bench/out/lab.json, lab.md and
## timeline-<scenario>.svg. `make lab SCENARIO=crash-storm` runs one.
## standby-upgrade replaces dnsstandby with $(PEERS_BIN)/dnsstandby-next,
## the same source stamped $(LAB_NEXT_VERSION).
SCENARIO ?= all
LAB_NEXT_VERSION ?= v0.0.0-lab-upgrade
# The next build gets -buildvcs=false: in a git clone the go command's own
# stamp would win over the linked version, and both builds would say the
# same.
lab: bin/coredns
	@[ "$$(id -u)" = 0 ] || { echo "the lab needs root (network namespaces, a systemd guest)"; exit 1; }
	$(GO) build -o $(PEERS_BIN)/dnsstandby ./cmd/dnsstandby
	$(GO) build -buildvcs=false -ldflags '-X $(BUILDINFO).linkedVersion=$(LAB_NEXT_VERSION)' \
		-o $(PEERS_BIN)/dnsstandby-next ./cmd/dnsstandby
	cd bench && $(GO) build -o out/bin/lab ./cmd/lab
	$(PEERS_BIN)/lab -scenario $(SCENARIO) -out bench/out -coredns bin/coredns \
		-dnsstandby $(PEERS_BIN)/dnsstandby -dnsstandby-next $(PEERS_BIN)/dnsstandby-next $(LAB_FLAGS)
