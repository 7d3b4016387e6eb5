#pragma once
// CRC32 (zip/IEEE polynomial) through ISA-L's carry-less-multiply kernels (crc32_gzip_refl picks
// the widest the CPU has: VPCLMULQDQ/AVX-512 here, ~8 GB/s per core on cache-hot slices against
// libdeflate 1.14's ~4.7 GB/s; see docs/benchmarks.md). A build without ISA-L uses libdeflate's
// crc32, else zlib's crc32_z: the same values, slower.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ckpt/error.h"

namespace ckpt::internal {

// Continues a CRC: crc32(crc32(0, a), b) == crc32(0, a ++ b).
uint32_t crc32(uint32_t crc, std::span<const std::byte> data) noexcept;
inline uint32_t crc32(std::span<const std::byte> data) noexcept { return crc32(0, data); }
// Copies src to dst (same size) and returns the continued CRC of the bytes, in cache-sized
// blocks so each block is checksummed while hot.
uint32_t copy_crc32(uint32_t crc, std::byte* dst, std::span<const std::byte> src) noexcept;

// The one CRC32 mismatch error: Error{kCorrupt} "CRC32 mismatch: stored xxxxxxxx, computed
// yyyyyyyy" + `detail`, naming the source, the record (or tensor) and its byte offset.
Error crc_mismatch(const std::string& source, const std::string& record, uint64_t offset,
                   uint32_t stored, uint32_t computed, const std::string& detail = {});

}  // namespace ckpt::internal
