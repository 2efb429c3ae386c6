# The README's quick-start commands. Each installs what it needs first (scripts/install-deps is
# idempotent and fast when everything is there), then configures, builds and runs.
#
# LIBTORCH=pip (default): LibTorch 2.x from PyPI's torch, in the project's Python environment
#   (scripts/python-env); a CUDA build that also runs on CPU. Builds in build/.
# LIBTORCH=system: Debian's libtorch-dev 1.13 (CPU only). Builds in build-system/.
LIBTORCH ?= pip
ifeq ($(LIBTORCH),pip)
BUILD_DIR ?= build
DEPS_FLAGS :=
else ifeq ($(LIBTORCH),system)
BUILD_DIR ?= build-system
DEPS_FLAGS := --system
else
$(error LIBTORCH=$(LIBTORCH): use LIBTORCH=pip (PyPI's torch 2.x, the default) or LIBTORCH=system (Debian's 1.13))
endif
JOBS ?= $(shell nproc)
# A unity build (eight sources a compile, as CI's and pip's builds): each file that includes torch costs
# 7-12 s of the same headers, so a newcomer's first build takes about half as long. Working on the code,
# configure your own build without it (cmake -S . -B build -G Ninja), where each file compiles alone.
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps configure build demo test bench install clean format check-format

all: build

deps:
	@scripts/install-deps $(DEPS_FLAGS)

# Configures once per LibTorch: a build directory made for another LibTorch is configured afresh.
configure: deps
	@root="$$( [ "$(LIBTORCH)" = pip ] && scripts/python-env --torch-root )"; \
	if [ ! -f $(BUILD_DIR)/CMakeCache.txt ] || ! grep -qxF "LOCKSTEP_TORCH_ROOT:PATH=$$root" $(BUILD_DIR)/CMakeCache.txt; then \
	  cmake --fresh -S . -B $(BUILD_DIR) $(GENERATOR) $(CMAKE_FLAGS) -DLOCKSTEP_TORCH_ROOT="$$root"; \
	fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Trains the default FSQ tokenizer on Fashion-MNIST and prints its test figures. Builds the CLI
# alone: the test suite, benchmarks and Python package (about 40% of the compiling) wait for `make test`.
demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target lockstep_cli
	$(BUILD_DIR)/bin/lockstep train

# The test suite's Python packages (pytest, vector-quantize-pytorch, Lightning, ...) download while the
# build compiles: `make demo` never waits for them.
test: configure
	@pid=; if [ "$(LIBTORCH)" = pip ]; then scripts/python-env --tests & pid=$$!; fi; \
	cmake --build $(BUILD_DIR) -j $(JOBS); built=$$?; \
	if [ -n "$$pid" ] && ! wait $$pid; then echo "make test: the test packages did not install (above)" >&2; exit 1; fi; \
	[ $$built = 0 ] || exit $$built; \
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

bench: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target lockstep_bench
	$(BUILD_DIR)/bench/lockstep_bench

# C++ formatting as .clang-format says: check (CI runs it) or apply.
check-format: deps
	@scripts/check-format

format: deps
	@scripts/check-format --fix

install: build
	cmake --install $(BUILD_DIR) --prefix $(or $(PREFIX),/usr/local)

clean:
	rm -rf $(BUILD_DIR)
