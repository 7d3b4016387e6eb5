#include "util/crc32.h"

#include <libdeflate.h>

#include <algorithm>
#include <cstring>

namespace ckpt::internal {

uint32_t crc32(uint32_t crc, std::span<const std::byte> data) noexcept {
  // libdeflate returns its initial value for a null buffer, whatever `crc` is.
  if (data.empty()) return crc;
  return libdeflate_crc32(crc, data.data(), data.size());
}

uint32_t copy_crc32(uint32_t crc, std::byte* dst, std::span<const std::byte> src) noexcept {
  constexpr size_t kBlock = 256 << 10;  // fits in L2 with room to spare
  for (size_t off = 0; off < src.size(); off += kBlock) {
    size_t n = std::min(kBlock, src.size() - off);
    std::memcpy(dst + off, src.data() + off, n);
    crc = libdeflate_crc32(crc, dst + off, n);
  }
  return crc;
}

}  // namespace ckpt::internal
