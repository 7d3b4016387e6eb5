// A build without libsodium (see tensorizer_crypt.h): unencrypted tensorizer files are read and
// written as usual; encrypting, decrypting and deriving keys refuse with Error{kUnsupported}.

#include <cstring>

#include "ckpt/error.h"
#include "formats/tensorizer/tensorizer_crypt.h"
#include "util/features.h"

namespace ckpt::internal::tzr {

void ensure_sodium() {
  throw missing_feature("libsodium", "tensorizer encryption and decryption need");
}

Key derive_key(std::string_view, const KdfParams&) {
  ensure_sodium();
  return {};
}

bool decrypt_in_place(const Key&, const CipherParams&, std::span<std::byte>) {
  ensure_sodium();
  return false;
}

Mac encrypt_chunk(const Key&, const Nonce&, const std::byte*, std::byte*, size_t) {
  ensure_sodium();
  return {};
}

void random_bytes(std::span<unsigned char>) { ensure_sodium(); }

void wipe(void* p, size_t n) {
  volatile unsigned char* v = static_cast<volatile unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) v[i] = 0;
}

}  // namespace ckpt::internal::tzr
