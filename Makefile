# weightcast — build, test, demo, bench.
GO ?= go
PKGS := ./...

.PHONY: all build test vet fmt-check demo bench fuzz gpu-bins clean

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -o bin/demo ./cmd/demo

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test: fmt-check vet
	$(GO) test -race -timeout 10m $(PKGS)

# make demo ARGS="--ranks 8 --size 4GiB"
demo:
	@$(GO) build -o bin/demo ./cmd/demo
	@./bin/demo $(ARGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf bin .gpu
