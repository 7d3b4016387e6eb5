// SHA-256 through libsodium's crypto_hash_sha256 (util/sha256.h): the build without OpenSSL.
// SHA-1 is not in libsodium.

#include <sodium.h>

#include "ckpt/error.h"
#include "util/features.h"
#include "util/sha256.h"

namespace ckpt::internal {

struct Sha256Stream::Impl {
  crypto_hash_sha256_state st;
};
Sha256Stream::Sha256Stream() : impl_(std::make_unique<Impl>()) {
  if (sodium_init() < 0) throw Error(ErrorCode::kIo, "libsodium failed to initialise");
  crypto_hash_sha256_init(&impl_->st);
}
Sha256Stream::~Sha256Stream() = default;
void Sha256Stream::update(const void* data, size_t n) {
  if (n) crypto_hash_sha256_update(&impl_->st, static_cast<const unsigned char*>(data), n);
}
Sha256Digest Sha256Stream::finish() {
  Sha256Digest out{};
  crypto_hash_sha256_final(&impl_->st, out.data());
  return out;
}

struct Sha1Stream::Impl {};
Sha1Stream::Sha1Stream() { throw missing_feature("OpenSSL (libcrypto)", "SHA-1 checksums need"); }
Sha1Stream::~Sha1Stream() = default;
void Sha1Stream::update(const void*, size_t) {}
std::array<unsigned char, 20> Sha1Stream::finish() { return {}; }

bool sha256_available() { return true; }

}  // namespace ckpt::internal
