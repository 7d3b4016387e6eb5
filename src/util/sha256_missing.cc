// A build with neither OpenSSL's libcrypto nor libsodium (util/sha256.h): every digest refuses
// with Error{kUnsupported} naming the packages.

#include "ckpt/error.h"
#include "util/features.h"
#include "util/sha256.h"

namespace ckpt::internal {

struct Sha256Stream::Impl {};
Sha256Stream::Sha256Stream() {
  throw missing_feature("OpenSSL (libcrypto) or libsodium", "SHA-256 digests need");
}
Sha256Stream::~Sha256Stream() = default;
void Sha256Stream::update(const void*, size_t) {}
Sha256Digest Sha256Stream::finish() { return {}; }

struct Sha1Stream::Impl {};
Sha1Stream::Sha1Stream() { throw missing_feature("OpenSSL (libcrypto)", "SHA-1 checksums need"); }
Sha1Stream::~Sha1Stream() = default;
void Sha1Stream::update(const void*, size_t) {}
std::array<unsigned char, 20> Sha1Stream::finish() { return {}; }

bool sha256_available() { return false; }

}  // namespace ckpt::internal
