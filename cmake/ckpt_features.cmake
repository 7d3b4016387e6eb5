# Dependencies and optional features (docs/library.md "Dependencies", docs/design/decisions.md,
# "io: sources and sinks", **Optional features**). Required: a C++20 compiler, zlib,
# nlohmann-json (header-only, compile time).
# Optional, each a feature that is off when its library is not found:
#   libcurl     HTTP(S) sources and S3 (src/io/remote/{http_source,s3_sink,target}.cc)
#   libsodium   tensorizer encryption (src/formats/tensorizer/tensorizer_sodium.cc); SHA-256
#               when OpenSSL is missing
#   openssl     SHA-256 (and SHA-1) through libcrypto (src/util/sha256_openssl.cc)
#   libisal     fast inflate and CRC32 (zlib's inflate, libdeflate's or zlib's CRC32 without it)
#   libdeflate  the zip writer's deflate and CRC32 (zlib without it)
#   yaml-cpp    YAML transform recipes (src/convert/recipe_yaml.cc; JSON recipes need nothing)
# A feature that is off throws Error{kUnsupported} naming the library and its packages.
#
# Sets CKPT_LINK_DEPS (the private link dependencies: also named by ckptConfig.cmake.in and
# ckpt.pc.in, from CKPT_PKG_MODULES / CKPT_PC_REQUIRES / CKPT_PC_LIBS), CKPT_SOURCES_OFF (sources
# of src/ that this build leaves out) and writes ${PROJECT_BINARY_DIR}/generated/ckpt_features.h,
# which only the files that choose a code path include: no global -D flag, so an object that
# does not include it compiles the same in every configuration (and ccache shares it).
#
# -DCKPT_PRETEND_MISSING="libcurl;libsodium;libisal;libdeflate;openssl;yaml-cpp" treats those
# libraries as not installed (scripts/check-degraded.sh builds each way).

set(CKPT_PRETEND_MISSING "" CACHE STRING
    "Optional libraries to treat as not installed (libcurl;libsodium;libisal;libdeflate;openssl;\
yaml-cpp)")

find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(nlohmann_json REQUIRED)  # header-only: compile time only, consumers never need it

set(CKPT_LINK_DEPS)
set(CKPT_PKG_MODULES)   # pkg-config modules the CMake package looks up again (PREFIX:module)
set(CKPT_PC_REQUIRES)   # ckpt.pc Requires.private
set(CKPT_PC_LIBS)       # ckpt.pc Libs.private
set(CKPT_SOURCES_OFF)

# ckpt_optional_pkg(PREFIX module): pkg_check_modules unless `module` is pretended missing.
macro(ckpt_optional_pkg prefix module)
  if("${module}" IN_LIST CKPT_PRETEND_MISSING)
    set(${prefix}_FOUND FALSE)
  else()
    pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${module})
  endif()
endmacro()

# ckpt_feature(name library enabled packages): the summary line.
function(ckpt_feature name library enabled packages)
  if(enabled)
    message(STATUS "ckpt feature ${name} (${library}): ON")
  else()
    message(STATUS "ckpt feature ${name} (${library}): OFF (${library} not found: install ${packages})")
  endif()
endfunction()

set(_src ${PROJECT_SOURCE_DIR}/src)

# libcurl: URL sources and S3 uploads. Linked as the shared library (ckpt.pc.in says why).
ckpt_optional_pkg(CKPT_CURL libcurl)
set(CKPT_HAVE_CURL ${CKPT_CURL_FOUND})
if(CKPT_HAVE_CURL)
  list(APPEND CKPT_LINK_DEPS PkgConfig::CKPT_CURL)
  list(APPEND CKPT_PKG_MODULES CKPT_CURL:libcurl)
  list(APPEND CKPT_PC_LIBS -lcurl)
  list(APPEND CKPT_SOURCES_OFF ${_src}/io/remote/remote_without_curl.cc)
else()
  list(APPEND CKPT_SOURCES_OFF ${_src}/io/remote/http_source.cc ${_src}/io/remote/s3_sink.cc
       ${_src}/io/remote/target.cc)
endif()
ckpt_feature(HTTP/S3 libcurl "${CKPT_HAVE_CURL}"
             "libcurl4-openssl-dev / libcurl-devel / libcurl")

# libsodium: tensorizer encryption.
ckpt_optional_pkg(CKPT_SODIUM libsodium)
set(CKPT_HAVE_SODIUM ${CKPT_SODIUM_FOUND})
if(CKPT_HAVE_SODIUM)
  list(APPEND CKPT_LINK_DEPS PkgConfig::CKPT_SODIUM)
  list(APPEND CKPT_PKG_MODULES CKPT_SODIUM:libsodium)
  list(APPEND CKPT_PC_REQUIRES libsodium)
  list(APPEND CKPT_SOURCES_OFF ${_src}/formats/tensorizer/tensorizer_sodium_missing.cc)
else()
  list(APPEND CKPT_SOURCES_OFF ${_src}/formats/tensorizer/tensorizer_sodium.cc)
endif()
ckpt_feature("tensorizer encryption" libsodium "${CKPT_HAVE_SODIUM}"
             "libsodium-dev / libsodium-devel / libsodium")

# OpenSSL libcrypto: SHA-256 and SHA-1; libsodium provides SHA-256 without it.
if("openssl" IN_LIST CKPT_PRETEND_MISSING)
  set(CKPT_HAVE_OPENSSL FALSE)
else()
  find_package(OpenSSL QUIET COMPONENTS Crypto)
  set(CKPT_HAVE_OPENSSL ${OpenSSL_FOUND})
endif()
list(APPEND CKPT_SOURCES_OFF ${_src}/util/sha256_openssl.cc ${_src}/util/sha256_sodium.cc
     ${_src}/util/sha256_missing.cc)
if(CKPT_HAVE_OPENSSL)
  list(APPEND CKPT_LINK_DEPS OpenSSL::Crypto)
  list(APPEND CKPT_PC_REQUIRES libcrypto)
  list(REMOVE_ITEM CKPT_SOURCES_OFF ${_src}/util/sha256_openssl.cc)
  set(CKPT_SHA256_PROVIDER openssl)
elseif(CKPT_HAVE_SODIUM)
  list(REMOVE_ITEM CKPT_SOURCES_OFF ${_src}/util/sha256_sodium.cc)
  set(CKPT_SHA256_PROVIDER libsodium)
else()
  list(REMOVE_ITEM CKPT_SOURCES_OFF ${_src}/util/sha256_missing.cc)
  set(CKPT_SHA256_PROVIDER none)
endif()
if(CKPT_HAVE_OPENSSL)
  message(STATUS "ckpt feature SHA-256 (openssl): ON")
elseif(CKPT_HAVE_SODIUM)
  message(STATUS "ckpt feature SHA-256 (openssl): ON through libsodium (openssl not found: "
                 "SHA-1 checksums of ONNX external data are off; install libssl-dev / "
                 "openssl-devel / openssl)")
else()
  ckpt_feature(SHA-256 openssl OFF "libssl-dev / openssl-devel / openssl")
endif()

# ISA-L: fast inflate and CRC32.
ckpt_optional_pkg(CKPT_ISAL libisal)
set(CKPT_HAVE_ISAL ${CKPT_ISAL_FOUND})
if(CKPT_HAVE_ISAL)
  list(APPEND CKPT_LINK_DEPS PkgConfig::CKPT_ISAL)
  list(APPEND CKPT_PKG_MODULES CKPT_ISAL:libisal)
  list(APPEND CKPT_PC_REQUIRES libisal)
endif()

# libdeflate: the zip writer's deflate, and CRC32 without ISA-L.
ckpt_optional_pkg(CKPT_DEFLATE libdeflate)
set(CKPT_HAVE_LIBDEFLATE ${CKPT_DEFLATE_FOUND})
if(CKPT_HAVE_LIBDEFLATE)
  list(APPEND CKPT_LINK_DEPS PkgConfig::CKPT_DEFLATE)
  list(APPEND CKPT_PKG_MODULES CKPT_DEFLATE:libdeflate)
  list(APPEND CKPT_PC_REQUIRES libdeflate)
endif()
if(CKPT_HAVE_ISAL)
  message(STATUS "ckpt feature fast inflate/CRC32 (libisal): ON")
else()
  message(STATUS "ckpt feature fast inflate/CRC32 (libisal): OFF (libisal not found: zlib "
                 "inflates; install libisal-dev / isa-l-devel / isa-l)")
endif()
if(CKPT_HAVE_LIBDEFLATE)
  message(STATUS "ckpt feature fast deflate (libdeflate): ON")
else()
  message(STATUS "ckpt feature fast deflate (libdeflate): OFF (libdeflate not found: zlib "
                 "deflates; install libdeflate-dev / libdeflate-devel / libdeflate)")
endif()

# yaml-cpp: YAML transform recipes.
ckpt_optional_pkg(CKPT_YAML yaml-cpp)
set(CKPT_HAVE_YAML ${CKPT_YAML_FOUND})
if(CKPT_HAVE_YAML)
  list(APPEND CKPT_LINK_DEPS PkgConfig::CKPT_YAML)
  list(APPEND CKPT_PKG_MODULES CKPT_YAML:yaml-cpp)
  list(APPEND CKPT_PC_REQUIRES yaml-cpp)
  list(APPEND CKPT_SOURCES_OFF ${_src}/convert/recipe_yaml_missing.cc)
else()
  list(APPEND CKPT_SOURCES_OFF ${_src}/convert/recipe_yaml.cc)
endif()
ckpt_feature("YAML recipes" yaml-cpp "${CKPT_HAVE_YAML}"
             "libyaml-cpp-dev / yaml-cpp-devel / yaml-cpp")

list(APPEND CKPT_LINK_DEPS ZLIB::ZLIB Threads::Threads ${CMAKE_DL_LIBS})
list(APPEND CKPT_PC_REQUIRES zlib)
list(APPEND CKPT_PC_LIBS -pthread -ldl)

# The words of build_features() (src/util/features.cc).
foreach(f HTTP S3)
  string(TOLOWER ${f} w)
  if(CKPT_HAVE_CURL)
    set(CKPT_FEATURE_${f} ${w})
  else()
    set(CKPT_FEATURE_${f} -${w})
  endif()
endforeach()
if(CKPT_HAVE_SODIUM)
  set(CKPT_FEATURE_ENCRYPTION tensorizer-encryption)
else()
  set(CKPT_FEATURE_ENCRYPTION -tensorizer-encryption)
endif()
if(CKPT_HAVE_ISAL)
  set(CKPT_INFLATE_PROVIDER isa-l)
  set(CKPT_CRC32_PROVIDER isa-l)
elseif(CKPT_HAVE_LIBDEFLATE)
  set(CKPT_INFLATE_PROVIDER zlib)
  set(CKPT_CRC32_PROVIDER libdeflate)
else()
  set(CKPT_INFLATE_PROVIDER zlib)
  set(CKPT_CRC32_PROVIDER zlib)
endif()
if(CKPT_HAVE_LIBDEFLATE)
  set(CKPT_DEFLATE_PROVIDER libdeflate)
else()
  set(CKPT_DEFLATE_PROVIDER zlib)
endif()
if(CKPT_HAVE_YAML)
  set(CKPT_FEATURE_YAML yaml)
else()
  set(CKPT_FEATURE_YAML -yaml)
endif()
foreach(v CURL SODIUM OPENSSL ISAL LIBDEFLATE YAML)
  if(CKPT_HAVE_${v})
    set(CKPT_HAVE_${v} 1)
  else()
    set(CKPT_HAVE_${v} 0)
  endif()
endforeach()
string(REPLACE ";" " " CKPT_PC_REQUIRES "${CKPT_PC_REQUIRES}")
string(REPLACE ";" " " CKPT_PC_LIBS "${CKPT_PC_LIBS}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/ckpt_features.h.in
               ${PROJECT_BINARY_DIR}/generated/ckpt_features.h @ONLY)
# Only the files that include ckpt_features.h get its folder on their include path: every other
# object's command line is the same in every configuration. A new includer is added here.
set_source_files_properties(
  ${_src}/util/crc32.cc ${_src}/util/features.cc ${_src}/zip/inflate_stream.cc
  ${_src}/zip/zip_writer.cc
  PROPERTIES INCLUDE_DIRECTORIES ${PROJECT_BINARY_DIR}/generated)
unset(_src)
