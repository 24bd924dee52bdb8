# meshbuild — see README.md. Every target installs what it needs first.
GO      ?= go
BIN     := $(CURDIR)/bin
PKGS    := ./...
export MESHBUILD_BUILDKIT := 1
export PATH := $(BIN):$(PATH)

.PHONY: all deps build demo test test-short bench lint clean

all: build

# runc, busybox-static, git and prometheus from Debian; buildkitd and buildctl
# built from the github.com/moby/buildkit module pinned as tools in go.mod.
deps:
	@bash scripts/install-deps.sh

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# The main job on the embedded default: NATS, a registry and buildkitd started
# locally, a controller and three agents, examples/fleet built as a cascade.
demo: deps build
	$(BIN)/builds up --catalogue examples/fleet/catalogue --agents 3 --demo examples/fleet

# Every test, against the real NATS server, buildkitd + runc and registry,
# and every benchmark once at a tiny size (MESHBUILD_BENCH=tiny), so that the
# checks inside them keep running; their figures mean nothing there.
#
# Two runs: go test runs the packages' test binaries one after the other
# whenever -bench is given (cmd/go forces benchmarks to run in serial), so
# the tests go first on their own, packages side by side (-p, the cores),
# then the benchmarks, one package at a time, from the same test binaries,
# of the packages that have any (BENCH_PKGS: starting the others' binaries
# for nothing took 25 s).
BENCH_PKGS = $(sort $(dir $(shell git ls-files '*_test.go' | xargs grep -l '^func Benchmark')))
test: deps lint
	MESHBUILD_BENCH=tiny $(GO) test -race -count=1 -timeout 60m $(PKGS)
	MESHBUILD_BENCH=tiny $(GO) test -race -count=1 -run '^$$' -bench . -benchtime 1x -timeout 60m $(addprefix ./,$(BENCH_PKGS))

# The pure and in-process tests only (no buildkitd).
test-short:
	MESHBUILD_BUILDKIT= $(GO) test -count=1 $(PKGS)

# The table, and BENCHMARKS.md and BENCHMARKS.json written from the one run.
bench: deps build
	$(GO) run ./cmd/benchtable -o BENCHMARKS.md -json BENCHMARKS.json

# gofmt, go vet, and go.mod as `go mod tidy` leaves it (the diff it would
# make is printed; run `go mod tidy` to apply it).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

clean:
	rm -rf $(BIN)
