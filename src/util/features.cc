// build_features() and the errors of features left out of this build.

#include "util/features.h"

#include "ckpt/features.h"
#include "ckpt_features.h"

namespace ckpt {

const char* build_features() {
  return "" CKPT_FEATURE_HTTP " " CKPT_FEATURE_S3 " " CKPT_FEATURE_ENCRYPTION
         " sha256=" CKPT_SHA256_PROVIDER " inflate=" CKPT_INFLATE_PROVIDER
         " crc32=" CKPT_CRC32_PROVIDER " deflate=" CKPT_DEFLATE_PROVIDER " " CKPT_FEATURE_YAML;
}

}  // namespace ckpt

namespace ckpt::internal {
namespace {

struct Packages {
  const char* library;
  const char* debian;
  const char* fedora;
  const char* conda;
};

constexpr Packages kPackages[] = {
    {"libcurl", "libcurl4-openssl-dev", "libcurl-devel", "libcurl"},
    {"libsodium", "libsodium-dev", "libsodium-devel", "libsodium"},
    {"OpenSSL", "libssl-dev", "openssl-devel", "openssl"},
    {"yaml-cpp", "libyaml-cpp-dev", "yaml-cpp-devel", "yaml-cpp"},
};

}  // namespace

Error missing_feature(const std::string& library, const std::string& what_needs,
                      const std::string& source) {
  std::string msg = "this ckpt was built without " + library + ", which " + what_needs;
  for (const Packages& p : kPackages)
    if (library.rfind(p.library, 0) == 0) {
      msg += std::string(": install ") + p.debian + " (Debian/Ubuntu), " + p.fedora +
             " (Fedora) or " + p.conda + " (conda-forge), then rebuild";
      return Error(ErrorCode::kUnsupported, msg, source);
    }
  return Error(ErrorCode::kUnsupported, msg + ": install it, then rebuild", source);
}

}  // namespace ckpt::internal
