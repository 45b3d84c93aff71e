# dnsstandby — see README.md. Targets that need root say so.
GO       ?= go
FUZZTIME ?= 60s
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: test fmt-check vet fuzz bench

## test: gofmt check, go vet, and every test with the race detector
test: fmt-check vet
	$(GO) test -race -count=1 ./...

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

## bench: the cache's micro-benchmarks (ratios within one run are what count)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./cache/ ./wire/
