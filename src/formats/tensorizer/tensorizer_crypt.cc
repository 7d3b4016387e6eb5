// tensorizer key parsing, nonces and chunk counts (see tensorizer_crypt.h): the parts that need
// no libsodium. The cipher itself is in tensorizer_sodium.cc (or tensorizer_sodium_missing.cc).

#include "formats/tensorizer/tensorizer_crypt.h"

#include <cstring>

#include "util/text.h"

namespace ckpt::internal::tzr {

std::optional<Key> parse_key(std::string_view text) {
  Key key;
  if (text.size() == kKeyBytes) {
    std::memcpy(key.data(), text.data(), kKeyBytes);
    return key;
  }
  auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  if (!parse_hex(text, key)) return std::nullopt;
  return key;
}

Nonce nonce_at(const Nonce& initial, uint64_t index) {
  // Little-endian addition modulo 2^(8 * kNonceBytes), as sodium_add.
  Nonce n = initial;
  unsigned carry = 0;
  for (size_t i = 0; i < kNonceBytes; ++i) {
    const unsigned add = i < 8 ? static_cast<unsigned>((index >> (8 * i)) & 0xff) : 0;
    const unsigned sum = n[i] + add + carry;
    n[i] = static_cast<unsigned char>(sum);
    carry = sum >> 8;
  }
  return n;
}

uint64_t chunk_count(const CipherParams& cipher, uint64_t nbytes) {
  if (cipher.chunk_size == 0) return 1;
  return nbytes / cipher.chunk_size + (nbytes % cipher.chunk_size != 0);
}

}  // namespace ckpt::internal::tzr
