# dnsstandby — see README.md. Targets that need root say so.
GO       ?= go
FUZZTIME ?= 60s
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: test fmt-check vet fuzz bench

## test: gofmt check, go vet, and every test with the race detector
## (integration tests run CoreDNS from bin/coredns, so it is built first)
test: fmt-check vet bin/coredns
	$(GO) test -race -count=1 ./...

## bin/coredns: the CoreDNS pinned as a tool in bench/tools/go.mod (v1.13.1),
## built once; about 2 minutes on this project's 2-core machines. It has a
## module of its own so that the main module's newer miekg/dns, caddy or
## prometheus cannot leak into the CoreDNS under test: it builds with exactly
## the dependency versions CoreDNS 1.13.1 was released with.
bin/coredns: bench/tools/go.mod bench/tools/go.sum
	cd bench/tools && $(GO) build -o ../../bin/coredns github.com/coredns/coredns

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

## fuzz: run every fuzz target for FUZZTIME each (their seed corpora run in `make test`)
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzInsert$$' -fuzztime $(FUZZTIME) ./cache/
	$(GO) test -run '^$$' -fuzz '^FuzzServe$$' -fuzztime $(FUZZTIME) ./cache/
	$(GO) test -run '^$$' -fuzz '^FuzzParseQuery$$' -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run '^$$' -fuzz '^FuzzQueryPath$$' -fuzztime $(FUZZTIME) ./pipeline/
	$(GO) test -run '^$$' -fuzz '^FuzzAccept$$' -fuzztime $(FUZZTIME) ./upstream/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./corefile/

## bench: the cache's micro-benchmarks (ratios within one run are what count)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./cache/ ./wire/
