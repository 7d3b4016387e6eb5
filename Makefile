# ckpt: two commands for a new user.
#   make demo  - build, then generate a sample checkpoint and list, verify and load it
#   make test  - build, then run every test (unit, interop with torch, sanitizers)
# Both install missing Debian packages first (apt-get, non-interactive).

BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
PY := /usr/bin/python3
DEMO_DIR ?= demo-out

DEB_PACKAGES := cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libbenchmark-dev \
  libdeflate-dev libisal-dev zlib1g-dev libsodium-dev libssl-dev nlohmann-json3-dev libcli11-dev \
  python3 python3-torch python3-numpy python3-pytest

.PHONY: all deps build demo test unit interop asan clean

all: build

deps:
	@./scripts/install-deps.sh $(DEB_PACKAGES)

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@./scripts/demo.sh $(BUILD)/ckpt $(DEMO_DIR)

unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

interop: build
	CKPT_BIN=$(abspath $(BUILD))/ckpt $(PY) -m pytest -q tests/interop

asan: deps
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

test: build
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory interop
	$(MAKE) --no-print-directory asan

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(DEMO_DIR)
