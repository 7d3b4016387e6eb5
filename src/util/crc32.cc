#include "util/crc32.h"

#include "util/text.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

namespace ckpt::internal {

uint32_t crc32(uint32_t crc, std::span<const std::byte> data) noexcept {
  if (data.empty()) return crc;
  return crc32_gzip_refl(crc, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

uint32_t copy_crc32(uint32_t crc, std::byte* dst, std::span<const std::byte> src) noexcept {
  constexpr size_t kBlock = 256 << 10;  // fits in L2 with room to spare
  for (size_t off = 0; off < src.size(); off += kBlock) {
    size_t n = std::min(kBlock, src.size() - off);
    std::memcpy(dst + off, src.data() + off, n);
    crc = crc32_gzip_refl(crc, reinterpret_cast<const unsigned char*>(dst + off), n);
  }
  return crc;
}

Error crc_mismatch(const std::string& source, const std::string& record, uint64_t offset,
                   uint32_t stored, uint32_t computed, const std::string& detail) {
  return Error(ErrorCode::kCorrupt,
               "CRC32 mismatch: stored " + hex32(stored) + ", computed " + hex32(computed) + detail,
               source, record, offset);
}

}  // namespace ckpt::internal
