# linattn: the two quick-start commands and their helpers.
#   make run    install missing Debian packages, build, run the built-in default
#   make test   install, build, run every test (ctest)
# Builds use -j2 (JOBS=…); nothing is compiled with -march=native.

BUILD_DIR ?= build
ASAN_DIR ?= build-asan
JOBS ?= 2
BUILD_TYPE ?= Release

.PHONY: all deps configure build run test test-asan test-tsan test-container fuzz soak bench bench-attention bench-model bench-server bench-tokenizer format clean

all: build

# `make run` needs no Python: the PyTorch reference stack is for the tests.
DEPS_FLAGS ?=
run: DEPS_FLAGS := --no-python

deps:
	@bash scripts/install-deps.sh $(DEPS_FLAGS)

# Every build compiles through ccache (installed by deps; looked up when the
# recipe runs, after deps): a rebuild reuses what it compiled before.
LAUNCHER = -DCMAKE_CXX_COMPILER_LAUNCHER=$$(command -v ccache)

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(LAUNCHER)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The server on its built-in defaults (127.0.0.1:50051, HTTP on
# 127.0.0.1:8080), its sessions durable in $XDG_STATE_HOME/linattn
# (~/.local/state/linattn; scripts/run-server.sh). LINATTN_* variables and
# ARGS="--flag value ..." change them (LINATTN_STATE_DIR=none: memory only;
# see linattn-server --help). Ctrl-C drains it.
ARGS ?=
run: build
	bash scripts/run-server.sh $(BUILD_DIR)/bin/linattn-server $(ARGS)

# ctest runs JOBS test processes at once on as many cores: OpenMP workers
# that spin after each parallel region would take the cores from the other
# process's workers (docs/benchmarks.md, "Measured figures behind constants
# in the code"), so
# the tests' threads sleep at once (OMP_WAIT_POLICY; the servers they start
# keep it too).
TEST_ENV ?= OMP_WAIT_POLICY=passive

test: build
	$(TEST_ENV) ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

# Sanitizer and fuzz builds keep line tables only (-g1): reports still name
# file and line, and the builds take less time and disk than with full -g.
# -O1: instrumented code compiles in about 60% of -O2's time, and the
# sanitizers' own checks dominate the tests' run time either way.
SANITIZER_FLAGS ?= -O1 -g1 -DNDEBUG

# The core tests under AddressSanitizer + UndefinedBehaviorSanitizer, built
# with clang in the tree the fuzz targets use too (`make fuzz` reuses it):
# one instrumented compile of core/ and server/ serves both.
ASAN_CONFIGURE = CC=clang CXX=clang++ cmake -S . -B $(ASAN_DIR) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo $(LAUNCHER) \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SANITIZER_FLAGS)" \
	  -DLINATTN_SANITIZE=ON -DLINATTN_FUZZ=ON -DLINATTN_BUILD_BENCH=OFF
test-asan: deps
	$(ASAN_CONFIGURE)
	cmake --build $(ASAN_DIR) -j$(JOBS) --target attention_test onednn_test session_test model_test \
	  model_reference_test generation_test engine_test tokenizer_test jinja_test \
	  linattn_sentencepiece
	$(TEST_ENV) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_DIR) --output-on-failure -j$(JOBS) -L core

# The concurrency tests of core/ (session table, scheduler) under
# ThreadSanitizer. Debian's libgomp is not built for TSan, so its barriers
# would read as races: the kernels run with one OpenMP thread here, and the
# threads under test are the scheduler's and the submitters'.
TSAN_DIR ?= build-tsan
test-tsan: deps
	cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(LAUNCHER) \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SANITIZER_FLAGS)" \
	  -DLINATTN_TSAN=ON -DLINATTN_BUILD_BENCH=OFF
	cmake --build $(TSAN_DIR) -j$(JOBS) --target session_test generation_test engine_test
	$(TEST_ENV) OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
	  ctest --test-dir $(TSAN_DIR) --output-on-failure -j$(JOBS) -R '^(Scheduler|SessionManager|Snapshot|GenerationTest|SharedTable|ComputeExecutor|DurableStore|DurableGeneration|SharedStore|Engine)\.'

# libFuzzer targets (tests/fuzz, built with clang under ASan + UBSan in
# test-asan's tree): the snapshot parsers, safetensors, config.json, .npy,
# the tokenizers and the requests of both services, each for FUZZ_SECONDS on
# its committed corpus.
FUZZ_SECONDS ?= 30
fuzz: deps
	$(ASAN_CONFIGURE)
	cmake --build $(ASAN_DIR) -j$(JOBS) --target fuzzers
	bash scripts/fuzz.sh $(ASAN_DIR) $(FUZZ_SECONDS)

# Mixed, verified load on both services for SOAK_SECONDS (not in CI's
# default path): fails on any error or mismatch, or on the server's memory
# or file descriptors growing after the warm-up.
SOAK_SECONDS ?= 600
soak: build
	/usr/bin/python3 tools/soak.py --build $(BUILD_DIR) --seconds $(SOAK_SECONDS)

# The Dockerfile built with podman and checked for real (health, non-root,
# one attend --server call from the host).
test-container: build
	bash scripts/container-check.sh $(BUILD_DIR)/bin/linattn

# The comparison in docs/benchmarks.md: linattn beside its PyTorch peers and this
# machine's limits, one run (~30 min on 2 cores); Markdown on stdout and in
# $(BUILD_DIR)/compare/, JSON beside it.
bench: build
	/usr/bin/python3 bench/compare --build $(BUILD_DIR)

# The engine's own benchmarks in full (every batch size, T and chunk size).
bench-attention: build
	$(BUILD_DIR)/bin/attention_benchmark --benchmark_out=$(BUILD_DIR)/attention_benchmark.json \
	  --benchmark_out_format=json
	/usr/bin/python3 bench/report.py $(BUILD_DIR)/attention_benchmark.json

# Model serving: time to first token, decode speed, flatness, against the
# PyTorch reference (bench/model_bench.py).
bench-model: build
	/usr/bin/python3 bench/model_bench.py --build $(BUILD_DIR)

# Server throughput and latency with linattn-load vs the in-process engine.
bench-server: build
	/usr/bin/python3 bench/server_bench.py --build $(BUILD_DIR)

# tokenizer.json: load time of a 200k-entry vocabulary and one-core encode
# speed against their targets (bench/tokenizer_bench.sh).
bench-tokenizer: build
	bash bench/tokenizer_bench.sh $(BUILD_DIR)

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.inc')

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR)
