# modelqual build and test entry points. `make test` is what CI runs (.ci/run):
# it builds everything it needs on a fresh machine and needs no GPU.
SHELL := /bin/bash
GO ?= go
GINKGO := $(GO) run github.com/onsi/ginkgo/v2/ginkgo
ARTIFACTS ?= artifacts
# Content-keyed cache of generated fixtures and built bundles, shared by suites and runs.
export MODELQUAL_CACHE ?= $(CURDIR)/.cache/modelqual
export MODELQUAL_BIN ?= $(CURDIR)/bin

.PHONY: all build test unit premerge container-specs cuda-host bench qualify qualify-foreign image cuda fuzz vet fmt-check clean mutants

all: build

build:
	$(GO) build -o bin/ ./qual/cmd/qual ./server/cmd/qual-server

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Unit and integration tests of every package (fuzz seed corpora included), then the
# premerge specs of every family and the container specs, with JUnit under artifacts/.
test: build fmt-check vet unit premerge container-specs cuda-host

unit:
	$(GO) test -count=1 -timeout 30m $$($(GO) list ./... | grep -v /families/)

premerge: build
	mkdir -p $(ARTIFACTS)/junit
	$(GINKGO) -r --keep-going --label-filter='premerge && !container' --fail-on-pending --fail-on-empty \
		--output-dir=$(ARTIFACTS)/junit --junit-report=premerge.xml --timeout=20m ./families/...

# The CUDA backend's C++ without a GPU or nvcc: a g++ syntax check against stub headers, then the
# CPU emulation of its kernels (host_test) for qwen3 bf16 against a double-precision reference
# (prefill, decode at several batches, graphs, fused and split attention, device sampling).
cuda-host:
	sh native/cuda/check_syntax.sh
	EMU_ONLY=qwen3:bf16 sh native/cuda/host_test/run.sh
	EMU_ONLY=swa:bf16 sh native/cuda/host_test/run.sh

container-specs: build image
	mkdir -p $(ARTIFACTS)/junit
	$(GINKGO) -r --keep-going --label-filter='container' --fail-on-empty \
		--output-dir=$(ARTIFACTS)/junit --junit-report=container.xml --timeout=20m ./families/...

image: build
	./server/container/build.sh

bench: build
	set -o pipefail; $(GO) test -run '^$$' -bench . -benchtime 2s -count 1 ./native/... ./server/... ./qual/... | awk -f qual/load/benchgoals.awk

qualify: build
	./bin/qual qualify --out $(ARTIFACTS)/qualify

# An engine this project did not write: Ollama, built from its Go module into .cache/foreign,
# serving the qwen fixture; the qwen suite's portable gates and premerge profiles run against
# it and $(ARTIFACTS)/qualify-foreign/summary.md holds the per-gate verdicts (docs/external-engines.md).
qualify-foreign: build
	OUT=$(CURDIR)/$(ARTIFACTS)/qualify-foreign ./qual/launch/foreign/ollama/qualify.sh

# Fuzz every parser (each Fuzz* function) for FUZZTIME; a failing input is written to its
# package's testdata/fuzz and stays there as a seed that `make unit` replays.
FUZZTIME ?= 20s
fuzz:
	@set -e; grep -rH --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*' . | sort | while IFS=: read -r f fn; do \
	  fn=$${fn#func }; pkg=./$$(dirname $${f#./}); echo "== $$pkg $$fn"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; done

cuda:
	cmake -S native/cuda -B native/cuda/build -DCMAKE_BUILD_TYPE=Release && cmake --build native/cuda/build -j

clean:
	rm -rf bin $(ARTIFACTS)

# The planted-defect campaign: each defect of qual/mutants/catalog.go planted alone in a scratch
# copy, the premerge gate run there; prints defect, caught or missed, and by which spec. Slow
# (one premerge gate per defect), so not part of `make test`; MUTANTS=REGEXP runs a subset.
MUTANTS ?=
mutants: build
	mkdir -p $(ARTIFACTS)
	nice ./bin/qual mutants --match '$(MUTANTS)' --out $(ARTIFACTS)/mutants.md

# Go bindings of the OpenEngine API v1 (server/openengine/v1; contract and revision in
# server/openengine/PROVENANCE.md). protoc is Debian's protobuf-compiler
# (apt-get install protobuf-compiler); the two plugins are the go.mod tool pins.
.PHONY: proto
proto:
	mkdir -p bin/protoc-plugins
	$(GO) build -o bin/protoc-plugins/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc
	cd server && PATH=$(CURDIR)/bin/protoc-plugins:$$PATH protoc -I . \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		openengine/v1/*.proto

# The gRPC-beside-SSE cost study (issue 39): frontend, worker and client CPU and wire bytes
# per streamed token, mock engine, concurrency 32, 256 tokens per stream.
.PHONY: bench-grpc
bench-grpc: build
	$(GO) test -run '^$$' -bench 'BenchmarkStreamCostC32' -benchtime 256x -count 1 ./server/

# qual-server's reliability suite: slow clients, a disconnect storm, worker SIGKILL, a short
# soak, a drain, bundle tampering and unwritable records; prints one table (requests and
# records lost per scenario, goal 0) and writes it to $(ARTIFACTS)/reliability.txt.
.PHONY: reliability
reliability: build
	mkdir -p $(ARTIFACTS)/junit
	ARTIFACTS=$(abspath $(ARTIFACTS)) $(GINKGO) --label-filter=reliability --fail-on-empty -v \
		--output-dir=$(ARTIFACTS)/junit --junit-report=reliability.xml --timeout=20m ./qual/reliability

# The load generator's figures beside their goals (goal-* metrics): client µs per streamed
# token at concurrency 32, non-streaming req/s, open-loop lateness p99 at 1,000 and 10,000
# req/s and the client's CPU share of a core, and a trace's replay at 1,000 req/s; three times
# each, as the machine is shared;
# then the 10 req/s open loop against a closed loop, client and server latency apart.
# qual/load/benchgoals.awk ends the output with a "figure vs goal" table.
.PHONY: bench-load
bench-load: build
	set -o pipefail; $(GO) test -run '^$$' -bench 'ClientStreamingC32|NonStreamingRate|OpenLoopLateness|FixedScheduleLateness|LowRateDistortion' -benchtime 1x -count 3 ./qual/load | awk -f qual/load/benchgoals.awk

	$(GO) test -run '^$$' -bench 'BenchmarkStreamCostC32' -benchtime 1024x -count 1 ./server/

# A release archive for machines with no checkout: qual, qual-server (and the CUDA library
# when make cuda built it) in one bin/ folder, where qual finds the qual-server beside it and
# qual-server the CUDA library; with the README, the fixtures' provenance notes and the Go
# modules the binaries are built from (go version -m), as
# $(ARTIFACTS)/dist/modelqual-<git describe>-<os>-<arch>.tar.gz.
DIST ?= $(ARTIFACTS)/dist
DIST_NAME = modelqual-$(shell git describe --always --dirty 2>/dev/null || echo dev)-$(shell $(GO) env GOOS)-$(shell $(GO) env GOARCH)
.PHONY: dist
dist: build
	rm -rf $(DIST)/$(DIST_NAME) && mkdir -p $(DIST)/$(DIST_NAME)/bin
	cp bin/qual bin/qual-server $(DIST)/$(DIST_NAME)/bin/
	if [ -f native/cuda/build/libmodelqual_cuda.so ]; then cp native/cuda/build/libmodelqual_cuda.so $(DIST)/$(DIST_NAME)/bin/; fi
	cp README.md $(DIST)/$(DIST_NAME)/
	cp fixtures/PROVENANCE.md $(DIST)/$(DIST_NAME)/FIXTURES-PROVENANCE.md
	$(GO) version -m bin/qual bin/qual-server > $(DIST)/$(DIST_NAME)/MODULES.txt
	tar -C $(DIST) -czf $(DIST)/$(DIST_NAME).tar.gz $(DIST_NAME)
	@echo $(DIST)/$(DIST_NAME).tar.gz
