// Optional features: the SHA-256/SHA-1 interface (util/sha256.h) against the FIPS 180 test
// vectors, the refusal of a feature left out (util/features.h), and build_features().

#include <gtest/gtest.h>

#include <string>

#include "ckpt/error.h"
#include "ckpt/features.h"
#include "util/features.h"
#include "util/sha256.h"
#include "util/text.h"

namespace ckpt::internal {
namespace {

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Two blocks, fed in uneven pieces.
  const std::string m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  Sha256Stream s;
  s.update(std::string_view(m).substr(0, 5));
  s.update(std::string_view(m).substr(5));
  EXPECT_EQ(to_hex(s.finish()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha1, KnownVector) {
  Sha1Stream s;
  s.update("abc", 3);
  EXPECT_EQ(to_hex(s.finish()), "a9993e364706816aba3e25717850c26c9cd0d89d");
}

TEST(Features, MissingNamesLibraryAndPackages) {
  Error e = missing_feature("libcurl", "HTTP(S) and S3 need", "http://h/x");
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  const std::string w = e.what();
  EXPECT_NE(w.find("this ckpt was built without libcurl, which HTTP(S) and S3 need: install "
                   "libcurl4-openssl-dev (Debian/Ubuntu), libcurl-devel (Fedora) or libcurl "
                   "(conda-forge), then rebuild"),
            std::string::npos)
      << w;
  const std::string s =
      missing_feature("OpenSSL (libcrypto) or libsodium", "SHA-256 digests need").what();
  EXPECT_NE(s.find("libssl-dev"), std::string::npos) << s;
  const std::string t = missing_feature("libsodium", "tensorizer encryption needs").what();
  EXPECT_NE(t.find("libsodium-dev (Debian/Ubuntu), libsodium-devel (Fedora)"), std::string::npos)
      << t;
  const std::string y = missing_feature("yaml-cpp", "YAML transform recipes need").what();
  EXPECT_NE(y.find("libyaml-cpp-dev (Debian/Ubuntu), yaml-cpp-devel (Fedora) or yaml-cpp "
                   "(conda-forge)"),
            std::string::npos)
      << y;
}

TEST(Features, BuildFeaturesListsTheProviders) {
  const std::string f = build_features();
  EXPECT_NE(f.find("sha256="), std::string::npos) << f;
  EXPECT_NE(f.find("inflate="), std::string::npos) << f;
  EXPECT_NE(f.find("crc32="), std::string::npos) << f;
  EXPECT_NE(f.find("yaml"), std::string::npos) << f;  // "yaml", or "-yaml" without yaml-cpp
}

}  // namespace
}  // namespace ckpt::internal
