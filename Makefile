# The two commands of the README, and a few helpers. Everything builds with
# CMake into $(BUILD_DIR); the Debian packages come from deploy/install-deps.sh.
#
#   make run     install missing packages, build prefixd and prefixctl only
#                (Release), start prefixd on its embedded default
#                (ARGS="--config=docs/examples/prefixd.textproto" to change)
#   make test    install missing packages, build, run every test (ctest)
#   make build   install missing packages and build
#   make clean   remove $(BUILD_DIR)
#   make package build the Debian package (CPack) into $(BUILD_DIR)
#   make bench   build the benchmarks and run them all (docs/performance.md;
#                about 45 minutes with the fleet index and the simulated fleet;
#                results in $(BUILD_DIR)/bench-results)
#   make image-test  build the container image with buildah and check it (minutes)
#   make sanitize  clang: unit and integration tests under ASan+UBSan
#                (build-asan), core tests under TSan (build-tsan)
#   make fuzz    clang libFuzzer targets, each for FUZZ_SECONDS (build-fuzz)
#   make soak    the RSS soak against $(BUILD_DIR)'s prefixd for SOAK_SECONDS

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
CMAKE_ARGS ?=
CTEST_ARGS ?=
ARGS ?=

FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 1800

.PHONY: all deps configure build run test clean package sanitize fuzz soak

all: build

deps:
	bash deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# The daemon and the command line the README uses beside it, nothing else:
# the tests, benchmarks and fuzz targets are most of the build's time
# (tests/firstrun/make_run_test.py checks this list).
RUN_TARGETS = prefixd prefixctl

run: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target $(RUN_TARGETS)
	./$(BUILD_DIR)/server/prefixd $(ARGS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) $(CTEST_ARGS)

package: build
	cmake --build $(BUILD_DIR) --target package

# The benchmarks (docs/performance.md), not part of `make test`: the
# hit-rate check, core_bench and its ratios, the core trace replay, the fleet
# index's ingest and memory (index_bench), then the gRPC load generator and
# the Redis peer (bench/grpc_bench.sh, Route included; pick some with
# BENCH_SCENARIOS). Run them on a quiet machine.
BENCH_TARGETS = core_bench trace_replay load prefixd_bench_server redis_peer prefixd
# and the cross-tenant timing probe (docs/security.md)
BENCH_TARGETS += timing_probe
BENCH_TARGETS += index_bench
# and the fleet index at NVIDIA Dynamo's mooncake_bench definition: an
# overloaded window (write capacity) and a keep-up one (read cost)
BENCH_TARGETS += index_replay
INDEX_REPLAY_KEEPUP_MS ?= 300000
# and the offline optimum the eviction policies are put against
BENCH_TARGETS += belady
# and the Mooncake Conductor API against Route (docs/performance.md)
BENCH_TARGETS += conductor_bench
BENCH_SCENARIOS ?= T6 T8a T8b T9 T10 T10b
BENCH_OUT = $(BUILD_DIR)/bench-results

.PHONY: bench
bench: configure
	cmake --build $(BUILD_DIR) -j$(JOBS) --target $(BENCH_TARGETS)
	mkdir -p $(BENCH_OUT)
	ctest --test-dir $(BUILD_DIR) --output-on-failure -L bench
	$(BUILD_DIR)/bench/core_bench --benchmark_min_time=0.1 --benchmark_repetitions=3 \
	  --benchmark_out=$(BENCH_OUT)/core.json --benchmark_out_format=json
	/usr/bin/python3 bench/ratios.py $(BENCH_OUT)/core.json
	# target 2b again with malloc on transparent huge pages (docs/operations.md)
	GLIBC_TUNABLES=glibc.malloc.hugetlb=1 $(BUILD_DIR)/bench/core_bench \
	  --benchmark_min_time=0.1 --benchmark_repetitions=3 \
	  --benchmark_filter='^MatchRandomPrefix/|DramLoad' \
	  --benchmark_out=$(BENCH_OUT)/core-thp.json --benchmark_out_format=json
	/usr/bin/python3 bench/ratios.py $(BENCH_OUT)/core-thp.json
	$(BUILD_DIR)/bench/trace_replay
	$(BUILD_DIR)/bench/trace_replay --paths=core,tcp,unix --runs=1 --memory_blocks=0
	$(BUILD_DIR)/bench/belady
	/usr/bin/python3 bench/eviction_table.py --build=$(BUILD_DIR) | tee $(BENCH_OUT)/eviction.md
	bash -o pipefail -c '$(BUILD_DIR)/bench/index_bench | tee $(BENCH_OUT)/index.log'
	bash -o pipefail -c '$(BUILD_DIR)/bench/index_replay --window_ms=750 \
	  --json=$(BENCH_OUT)/index-replay-overloaded.json | tee $(BENCH_OUT)/index-replay-overloaded.log'
	bash -o pipefail -c '$(BUILD_DIR)/bench/index_replay --window_ms=$(INDEX_REPLAY_KEEPUP_MS) \
	  --sequential_check=false --json=$(BENCH_OUT)/index-replay-keepup.json | tee $(BENCH_OUT)/index-replay-keepup.log'
	bash bench/grpc_bench.sh $(BUILD_DIR) $(BENCH_SCENARIOS)
	bash -o pipefail -c '$(BUILD_DIR)/bench/conductor_bench --seconds=5 | tee $(BENCH_OUT)/conductor.log'
	bash -o pipefail -c '$(BUILD_DIR)/bench/conductor_bench --seconds=5 --clients=4 | tee -a $(BENCH_OUT)/conductor.log'
	$(BUILD_DIR)/bench/timing_probe
	bash -o pipefail -c '/usr/bin/python3 tests/index/fleet_sim.py --full --prefixd $(BUILD_DIR)/server/prefixd | tee $(BENCH_OUT)/fleet.log'

.PHONY: image-test
image-test:
	bash deploy/test-image.sh

clean:
	rm -rf $(BUILD_DIR)

# Sanitizer and fuzz builds (docs/operations.md, "Reliability tests"). Every
# report aborts the process, so it fails its test. Debian's gRPC and abseil
# are not TSan-instrumented: under TSan only core's tests run (base/mutex.h).
CLANG_CMAKE = -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPREFIXD_BUILD_BENCH=OFF
SAN_ENV = ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan_suppressions.txt:print_suppressions=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
# Python-driven tests run the daemon binary and need no second run here;
# the RSS bounds of memory_bounds_test are the real build's (ASan keeps freed
# memory resident in its quarantine).
SANITIZE_SKIP = ^(e2e_test|python_.*|deploy_.*|metrics_.*_test|reliability_(stress|faults|soak|memory_bounds)_test|index_publisher_test)$$
TSAN_TESTS = core_concurrency_test core_cache_test core_differential_test core_snapshot_test
FUZZ_TARGETS = core_ops_fuzzer rpc_fuzzer snapshot_fuzzer index_events_fuzzer \
  http_fuzzer conductor_api_fuzzer kv_indexer_fuzzer pick_fuzzer \
  engine_metrics_fuzzer fleet_index_fuzzer load_stat_fuzzer sglang_server_info_fuzzer

sanitize: deps
	cmake -S . -B build-asan $(CLANG_CMAKE) -DPREFIXD_SANITIZE=address,undefined
	cmake --build build-asan -j$(JOBS)
	$(SAN_ENV) ctest --test-dir build-asan --output-on-failure -j$(JOBS) -E '$(SANITIZE_SKIP)'
	cmake -S . -B build-tsan $(CLANG_CMAKE) -DPREFIXD_SANITIZE=thread -DPREFIXD_BUILD_SERVER=OFF
	cmake --build build-tsan -j$(JOBS) --target $(TSAN_TESTS)
	for t in $(TSAN_TESTS); do $(SAN_ENV) build-tsan/core/$$t || exit 1; done

# Entropic scheduling costs these targets 2-3x their speed (tens of
# thousands of features); the RPC and HTTP targets keep one server for the
# process, so a per-input leak check would only see gRPC's and civetweb's
# caches.
FUZZ_FLAGS ?= -entropic=0 -timeout=60 -max_len=4096 -print_final_stats=1
FUZZ_FLAGS_rpc_fuzzer = -detect_leaks=0
FUZZ_FLAGS_http_fuzzer = -detect_leaks=0

fuzz: deps
	cmake -S . -B build-fuzz $(CLANG_CMAKE) -DPREFIXD_FUZZ=ON -DPREFIXD_SANITIZE=address,undefined
	cmake --build build-fuzz -j$(JOBS) --target $(FUZZ_TARGETS)
	$(foreach t,$(FUZZ_TARGETS),mkdir -p build-fuzz/corpus/$(t) && \
	  $(SAN_ENV) build-fuzz/tests/fuzz/$(t) -max_total_time=$(FUZZ_SECONDS) \
	    $(FUZZ_FLAGS) $(FUZZ_FLAGS_$(t)) -artifact_prefix=build-fuzz/$(t)- \
	    build-fuzz/corpus/$(t) tests/fuzz/corpus/$(t) && ) true

soak: build
	/usr/bin/python3 tests/reliability/soak_test.py \
	  --prefixd $(BUILD_DIR)/server/prefixd --seconds $(SOAK_SECONDS)
