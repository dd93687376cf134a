# weightcast — build, test, demo, bench.
GO ?= go
PKGS := ./...
# The Python tests and the wheel use Debian's interpreter (python3-numpy,
# python3-pytest, python3-setuptools, python3-wheel); override with PYTHON=.
PYTHON ?= /usr/bin/python3
PYLIB := python/weightcast/libweightcast.so

.PHONY: all build test vet fmt-check nocgo demo bench fuzz soak gpu-bins clean python wheel pytest

# Each fuzz target runs for FUZZTIME; `make test` runs their seed corpora.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./wire:FuzzDecodeMeta ./wire:FuzzDecodeCommit ./safetensors:FuzzParseHeader ./transport/zmqbus:FuzzDecode ./rendezvous:FuzzRecords ./auth:FuzzOpenRecord ./transport/internal/handshake:FuzzHandshake ./transport/zmqbus:FuzzReady

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -o bin/demo ./cmd/demo

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The Python tests run even when a Go package fails, and `test` still
# fails then: the exit status is the Go tests' if they failed, else pytest's.
# The PTX interpreter's long runs skip under the race detector (they start
# no goroutine and run 15 times slower there) and run once without it.
test: fmt-check vet nocgo
	@status=0; \
	echo "$(GO) test -race -timeout 10m $(PKGS)"; \
	$(GO) test -race -timeout 10m $(PKGS) || status=$$?; \
	echo "$(GO) test -run PTX ./gpu"; \
	$(GO) test -count=1 -run PTX ./gpu || status=$$?; \
	$(MAKE) pytest || { [ $$status -ne 0 ] || status=$$?; }; \
	if [ $$status -ne 0 ]; then echo "make test: failed (go test, then pytest: see above)"; fi; \
	exit $$status

# libweightcast.so (the C interface, ./capi) built into the Python package,
# so that `PYTHONPATH=python python3 -c "import weightcast"` works.
python:
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -ldflags=-s -o $(PYLIB) ./capi
	rm -f python/weightcast/libweightcast.h
	cp capi/weightcast.h python/weightcast/weightcast.h

pytest: python
	cd python && $(PYTHON) -m pytest -q -p no:cacheprovider tests

# A platform wheel (py3-none-linux_<arch>) in dist/, for `pip install` on a
# host without Go.
wheel: python
	rm -rf python/build python/weightcast.egg-info
	cd python && $(PYTHON) setup.py -q bdist_wheel -d ../dist
	rm -rf python/build python/weightcast.egg-info

# Without cgo (CGO_ENABLED=0: no C compiler needed) everything still builds
# and vets; GPU entry points then fail with gpu.ErrNoCgo. The packages with
# a cgo-free variant of their own (gpu, nccl) and the transports over them
# run their tests that way too, the GPU ones skipping with that error; every
# other package compiles the same code either way, so `test` covers it.
NOCGO_TEST_PKGS ?= ./gpu/... ./nccl/... ./mem/... ./transport/...
nocgo:
	CGO_ENABLED=0 $(GO) build $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) test -count=1 -timeout 5m $(NOCGO_TEST_PKGS)

# make demo ARGS="--ranks 8 --size 4GiB"
demo:
	@$(GO) build -o bin/demo ./cmd/demo
	@./bin/demo $(ARGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# 1,000 sync rounds on 4 ranks, a new random layout each round: every byte
# checked, every round committed, the heap in use flat (about 35 s with -race).
soak:
	WEIGHTCAST_SOAK=1 $(GO) test -race -run '^TestSoak$$' -v -timeout 10m ./stages

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

# Test binaries and the demo for a GPU machine that has no Go: copy .gpu/
# (or .gpu.tar.xz, the same packed) there and run, for example, `cd stages && ../.gpu/stages.test -test.run GPU`;
# the demo's process tests take the demo binary from WEIGHTCAST_DEMO_BIN:
# `cd cmd/demo && WEIGHTCAST_DEMO_BIN=../../.gpu/demo ../../.gpu/demo.test`.
# The Python package (with its library) and its GPU scripts go to
# .gpu/python: run them there with the GPU host's Python (torch), e.g.
# `cd .gpu/python && python3 benchmarks/e2e_transformers.py`.
gpu-bins: python
	mkdir -p .gpu
	CGO_ENABLED=1 $(GO) test -c -ldflags='-s -w' -o .gpu/ ./gpu ./nccl ./stages ./sink ./stages/stagestest ./transport/ipc ./transport/ncclx ./route ./cmd/demo .
	CGO_ENABLED=1 $(GO) build -ldflags='-s -w' -o .gpu/demo ./cmd/demo
	rm -rf .gpu/python && mkdir -p .gpu/python
	cp -r python/weightcast python/benchmarks python/tests .gpu/python/
	rm -rf .gpu/python/*/__pycache__
	tar cJf .gpu.tar.xz .gpu

clean:
	rm -rf bin .gpu .gpu.tar.xz dist $(PYLIB) python/weightcast/weightcast.h
