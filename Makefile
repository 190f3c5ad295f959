# The two commands of the README, and a few helpers. Everything builds with
# CMake into $(BUILD_DIR); the Debian packages come from deploy/install-deps.sh.
#
#   make run     install missing packages, build (Release), start prefixd on
#                its embedded default (ARGS="--config=prefixd.textproto" to change)
#   make test    install missing packages, build, run every test (ctest)
#   make build   install missing packages and build
#   make clean   remove $(BUILD_DIR)

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
CMAKE_ARGS ?=
CTEST_ARGS ?=
ARGS ?=

.PHONY: all deps configure build run test clean

all: build

deps:
	bash deploy/install-deps.sh

# Release at -O2 rather than CMake's -O3: GCC 12 reports false
# -Wmaybe-uninitialized warnings inside std::string at -O3, and our targets
# build with -Werror. -O2 is also what the developers' builds (RelWithDebInfo)
# compile and test.
configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	./$(BUILD_DIR)/server/prefixd $(ARGS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) $(CTEST_ARGS)

clean:
	rm -rf $(BUILD_DIR)
