#include "util/name_index.h"

#include <chrono>

namespace ckpt::internal {
namespace {

inline uint64_t mix(uint64_t h) noexcept {  // murmur3's finalizer
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

// Differs between processes (address-space randomization, clock), fixed within one.
uint64_t process_seed() noexcept {
  static const uint64_t seed = [] {
    static const char anchor = 0;
    return mix(reinterpret_cast<uintptr_t>(&anchor) ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  }();
  return seed;
}

}  // namespace

uint64_t name_hash(std::string_view s) noexcept {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = process_seed() ^ (n * 0x9e3779b97f4a7c15ull);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  if (n > 0) {
    // The last 1..7 bytes, read as up to three overlapping loads (no byte loop).
    uint64_t w;
    if (n >= 4) {
      uint32_t a, b;
      std::memcpy(&a, p, 4);
      std::memcpy(&b, p + n - 4, 4);
      w = (uint64_t{a} << 32) | b;
    } else {
      w = (uint64_t{static_cast<uint8_t>(p[0])} << 16) |
          (uint64_t{static_cast<uint8_t>(p[n / 2])} << 8) | static_cast<uint8_t>(p[n - 1]);
    }
    h = (h ^ w ^ (uint64_t{n} << 56)) * 0x9e3779b97f4a7c15ull;
  }
  return mix(h);
}

}  // namespace ckpt::internal
