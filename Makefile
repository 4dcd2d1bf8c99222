# linattn: the two quick-start commands and their helpers.
#   make run    install missing Debian packages, build, run the built-in default
#   make test   install, build, run every test (ctest)
# Builds use -j2 (JOBS=…); nothing is compiled with -march=native.

BUILD_DIR ?= build
ASAN_DIR ?= build-asan
JOBS ?= 2
BUILD_TYPE ?= Release

.PHONY: all deps configure build run test test-asan bench format clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# Until the server lands, the default program is the seed's worked example.
run: build
	$(BUILD_DIR)/bin/linattn explain --preset general --feature-map elu1 --prefix 1

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

# The core tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DLINATTN_SANITIZE=ON -DLINATTN_BUILD_BENCH=OFF
	cmake --build $(ASAN_DIR) -j$(JOBS) --target attention_test onednn_test session_test
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_DIR) --output-on-failure -j$(JOBS) -L core

# The README's benchmark table: JSON in $(BUILD_DIR), Markdown on stdout.
bench: build
	$(BUILD_DIR)/bin/attention_benchmark --benchmark_out=$(BUILD_DIR)/attention_benchmark.json \
	  --benchmark_out_format=json
	/usr/bin/python3 bench/report.py $(BUILD_DIR)/attention_benchmark.json

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.inc')

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR)
