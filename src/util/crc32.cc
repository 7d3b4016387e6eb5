#include "util/crc32.h"

#include "util/text.h"

// Which library computes the CRC (ISA-L, else libdeflate, else zlib): ckpt_features.h, written
// at configure time (cmake/ckpt_features.cmake). All three compute the same zip CRC32.
#include "ckpt_features.h"
#if CKPT_HAVE_ISAL
#include <isa-l/crc.h>
#elif CKPT_HAVE_LIBDEFLATE
#include <libdeflate.h>
#else
#include <zlib.h>
#endif

#include <algorithm>
#include <cstring>

namespace ckpt::internal {
namespace {

uint32_t crc_kernel(uint32_t crc, const unsigned char* p, size_t n) noexcept {
#if CKPT_HAVE_ISAL
  return crc32_gzip_refl(crc, p, n);
#elif CKPT_HAVE_LIBDEFLATE
  return libdeflate_crc32(crc, p, n);
#else
  return static_cast<uint32_t>(::crc32_z(crc, p, n));
#endif
}

}  // namespace

uint32_t crc32(uint32_t crc, std::span<const std::byte> data) noexcept {
  if (data.empty()) return crc;
  return crc_kernel(crc, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

uint32_t copy_crc32(uint32_t crc, std::byte* dst, std::span<const std::byte> src) noexcept {
  constexpr size_t kBlock = 256 << 10;  // fits in L2 with room to spare
  for (size_t off = 0; off < src.size(); off += kBlock) {
    size_t n = std::min(kBlock, src.size() - off);
    std::memcpy(dst + off, src.data() + off, n);
    crc = crc_kernel(crc, reinterpret_cast<const unsigned char*>(dst + off), n);
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
