// tensorizer nonces: nonce_at (its own little-endian addition, so that it needs no libsodium)
// against libsodium's sodium_increment, carries across every byte included.

#include <gtest/gtest.h>
#include <sodium.h>

#include "formats/tensorizer/tensorizer_crypt.h"

namespace ckpt::internal::tzr {
namespace {

TEST(TensorizerNonce, MatchesSodiumIncrement) {
  ASSERT_GE(sodium_init(), 0);
  for (unsigned char fill : {0x00, 0x7f, 0xfe, 0xff}) {
    Nonce initial;
    initial.fill(fill);
    initial[0] = static_cast<unsigned char>(fill - 3);
    Nonce want = initial;
    for (uint64_t i = 0; i < 600; ++i) {
      ASSERT_EQ(nonce_at(initial, i), want) << "fill " << int(fill) << " index " << i;
      sodium_increment(want.data(), want.size());
    }
  }
  // A large index: compare with sodium_add.
  Nonce initial;
  initial.fill(0xff);
  Nonce want = initial;
  unsigned char add[kNonceBytes] = {};
  const uint64_t index = 0x0123456789abcdefull;
  for (int i = 0; i < 8; ++i) add[i] = static_cast<unsigned char>(index >> (8 * i));
  sodium_add(want.data(), add, kNonceBytes);
  EXPECT_EQ(nonce_at(initial, index), want);
}

}  // namespace
}  // namespace ckpt::internal::tzr
