# The two commands of the README, and a few helpers. Everything builds with
# CMake into $(BUILD_DIR); the Debian packages come from deploy/install-deps.sh.
#
#   make run     install missing packages, build (Release), start prefixd on
#                its embedded default (ARGS="--config=prefixd.textproto" to change)
#   make test    install missing packages, build, run every test (ctest)
#   make build   install missing packages and build
#   make clean   remove $(BUILD_DIR)
#   make package build the Debian package (CPack) into $(BUILD_DIR)
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

.PHONY: image-test
image-test:
	bash deploy/test-image.sh

clean:
	rm -rf $(BUILD_DIR)
