# Every dependency is checked here, at configure time, before anything compiles: a missing one
# stops the configuration at once with the packages that provide it on Debian/Ubuntu, Fedora and
# conda-forge (not eight minutes into the build with "fatal error: CLI/CLI.hpp").

# For the tests (tests/interop/test_configure.py, scripts/check-degraded.sh): the dependencies
# named in CKPT_PRETEND_MISSING ("cli11;dlpack;libcurl;...") are treated as not installed,
# whatever the machine has.
set(CKPT_PRETEND_MISSING "" CACHE STRING "Treat these dependencies as missing (for tests)")

function(ckpt_missing what debian fedora conda)
  message(FATAL_ERROR
    "ckpt needs ${what}, which was not found. Install it with:\n"
    "  Debian/Ubuntu: apt-get install ${debian}\n"
    "  Fedora:        dnf install ${fedora}\n"
    "  conda-forge:   conda install -c conda-forge ${conda}\n"
    "(make deps installs every Debian package ckpt uses.)")
endfunction()

find_package(PkgConfig QUIET)
if(NOT PKG_CONFIG_FOUND)
  ckpt_missing("pkg-config" "pkg-config" "pkgconf-pkg-config" "pkg-config")
endif()
# libdeflate, ISA-L, libsodium, libcurl and OpenSSL are optional: cmake/ckpt_features.cmake.
find_package(Threads REQUIRED)
find_package(ZLIB QUIET)
if(NOT ZLIB_FOUND OR "zlib" IN_LIST CKPT_PRETEND_MISSING)
  ckpt_missing("zlib" zlib1g-dev zlib-devel zlib)
endif()
find_package(nlohmann_json QUIET)  # header-only: compile time only, consumers never need it
if(NOT nlohmann_json_FOUND)
  ckpt_missing("nlohmann-json (JSON headers)" nlohmann-json3-dev json-devel nlohmann_json)
endif()

# The command-line tool's argument parser (header-only).
if(CKPT_BUILD_CLI AND NOT CKPT_FUZZ)
  find_path(CKPT_CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(NOT CKPT_CLI11_INCLUDE_DIR OR "cli11" IN_LIST CKPT_PRETEND_MISSING)
    ckpt_missing("CLI11 (the command-line tool's argument parser, CLI/CLI.hpp)" libcli11-dev
                 cli11-devel cli11)
  endif()
endif()

# The Python module's tensor hand-off (one header, dlpack/dlpack.h). Fedora packages no DLPack:
# there, install the wheel (it needs no header), take conda-forge's, or point
# CKPT_DLPACK_INCLUDE_DIR at the include/ folder of a checkout of github.com/dmlc/dlpack (v0.6 or
# later; the header is the whole library).
if(CKPT_BUILD_PYTHON)
  find_path(CKPT_DLPACK_INCLUDE_DIR dlpack/dlpack.h)
  if(NOT CKPT_DLPACK_INCLUDE_DIR OR "dlpack" IN_LIST CKPT_PRETEND_MISSING)
    ckpt_missing("DLPack (dlpack/dlpack.h, for the Python module; Fedora has no package: take "
                 "conda-forge's, or configure with -DCKPT_DLPACK_INCLUDE_DIR=<dlpack>/include)"
                 libdlpack-dev "(none: see above)" dlpack)
  endif()
endif()

# The unit tests.
if(CKPT_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND OR "gtest" IN_LIST CKPT_PRETEND_MISSING)
    ckpt_missing("GoogleTest (the unit tests; -DCKPT_BUILD_TESTS=OFF builds without them)"
                 "libgtest-dev libgmock-dev" "gtest-devel gmock-devel" gtest)
  endif()
endif()
