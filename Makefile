# The two commands of the README, and a few helpers. Everything builds with
# CMake into $(BUILD_DIR); the Debian packages come from deploy/install-deps.sh.
#
#   make run     install missing packages, build (Release), start prefixd on
#                its embedded default (ARGS="--config=prefixd.textproto" to change)
#   make test    install missing packages, build, run every test (ctest)
#   make build   install missing packages and build
#   make clean   remove $(BUILD_DIR)
#   make package build the Debian package (CPack) into $(BUILD_DIR)
#   make bench   build the benchmarks and run them all (docs/performance.md;
#                about 15 minutes; results in $(BUILD_DIR)/bench-results)
#   make image-test  build the container image with buildah and check it (minutes)

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
CMAKE_ARGS ?=
CTEST_ARGS ?=
ARGS ?=

.PHONY: all deps configure build run test clean package

all: build

deps:
	bash deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	./$(BUILD_DIR)/server/prefixd $(ARGS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) $(CTEST_ARGS)

package: build
	cmake --build $(BUILD_DIR) --target package

# Benchmarks of issue 8 (docs/performance.md), not part of `make test`: the
# hit-rate check, core_bench and its ratios, the core trace replay, then the
# gRPC load generator and the Redis peer (bench/grpc_bench.sh; pick some with
# BENCH_SCENARIOS). Run them on a quiet machine.
BENCH_TARGETS = core_bench trace_replay load prefixd_bench_server redis_peer prefixd
# and the cross-tenant timing probe (docs/security.md)
BENCH_TARGETS += timing_probe
BENCH_SCENARIOS ?= T6 T8a T8b T9
BENCH_OUT = $(BUILD_DIR)/bench-results

.PHONY: bench
bench: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target $(BENCH_TARGETS)
	mkdir -p $(BENCH_OUT)
	ctest --test-dir $(BUILD_DIR) --output-on-failure -L bench
	$(BUILD_DIR)/bench/core_bench --benchmark_min_time=0.1 --benchmark_repetitions=3 \
	  --benchmark_out=$(BENCH_OUT)/core.json --benchmark_out_format=json
	/usr/bin/python3 bench/ratios.py $(BENCH_OUT)/core.json
	$(BUILD_DIR)/bench/trace_replay
	bash bench/grpc_bench.sh $(BUILD_DIR) $(BENCH_SCENARIOS)
	$(BUILD_DIR)/bench/timing_probe

.PHONY: image-test
image-test:
	bash deploy/test-image.sh

clean:
	rm -rf $(BUILD_DIR)
