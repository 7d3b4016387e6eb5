#pragma once
// CRC32 (zip/IEEE polynomial) through libdeflate's carry-less-multiply implementation.

#include <cstddef>
#include <cstdint>
#include <span>

namespace ckpt::internal {

// Continues a CRC: crc32(crc32(0, a), b) == crc32(0, a ++ b).
uint32_t crc32(uint32_t crc, std::span<const std::byte> data) noexcept;
inline uint32_t crc32(std::span<const std::byte> data) noexcept { return crc32(0, data); }
// Copies src to dst (same size) and returns the continued CRC of the bytes, in cache-sized
// blocks so each block is checksummed while hot.
uint32_t copy_crc32(uint32_t crc, std::byte* dst, std::span<const std::byte> src) noexcept;

}  // namespace ckpt::internal
