#pragma once
// Zip record layouts shared by the reader and the writer (APPNOTE 6.3.x, little-endian):
//   local header    30 B: sig 04034b50, version needed u16, flags u16, method u16, time u16,
//                         date u16, crc u32, compressed u32, uncompressed u32, name len u16,
//                         extra len u16; then name, extra, data, [data descriptor]
//   data descriptor 16 B: sig 08074b50, crc u32, compressed u32, uncompressed u32 (24 B: u64s)
//   central header  46 B: sig 02014b50, made by u16, needed u16, flags u16, method u16, time u16,
//                         date u16, crc u32, compressed u32, uncompressed u32, name len u16,
//                         extra len u16, comment len u16, disk u16, internal attr u16,
//                         external attr u32, header offset u32; then name, extra, comment
//   zip64 extra (id 0001): u64 uncompressed, u64 compressed, u64 header offset, each present only
//                         where the 32-bit field is saturated (torch: docs/formats/torch.md
//                         "torch.save zip", **Zip layout**)
//   zip64 end record 56 B: sig 06064b50, record size u64 (=44), made by u16, needed u16,
//                         disk u32, cd disk u32, entries on disk u64, entries u64, cd size u64,
//                         cd offset u64
//   zip64 locator   20 B: sig 07064b50, disk u32, zip64 end record offset u64, disks u32
//   end record      22 B: sig 06054b50, disk u16, cd disk u16, entries on disk u16, entries u16,
//                         cd size u32, cd offset u32, comment len u16; then comment

#include <cstdint>
#include <cstring>
#include <string_view>

namespace ckpt::internal::zipfmt {

inline constexpr uint32_t kLocalSig = 0x04034b50;
inline constexpr uint32_t kCentralSig = 0x02014b50;
inline constexpr uint32_t kDescriptorSig = 0x08074b50;
inline constexpr uint32_t kEndSig = 0x06054b50;
inline constexpr uint32_t kZip64EndSig = 0x06064b50;
inline constexpr uint32_t kZip64LocatorSig = 0x07064b50;

inline constexpr uint64_t kLocalSize = 30;
inline constexpr uint64_t kCentralSize = 46;
inline constexpr uint64_t kEndSize = 22;
inline constexpr uint64_t kZip64EndSize = 56;
inline constexpr uint64_t kZip64LocatorSize = 20;
inline constexpr uint64_t kDescriptorSize32 = 16;
inline constexpr uint64_t kDescriptorSize64 = 24;
inline constexpr uint64_t kMaxComment = 0xFFFF;

inline constexpr uint16_t kZip64ExtraId = 0x0001;
inline constexpr uint16_t kFbExtraId = 0x4246;  // 'F','B' read as a little-endian u16
inline constexpr uint64_t kFbHeaderSize = 4;

inline constexpr uint16_t kMethodStored = 0;
inline constexpr uint16_t kMethodDeflate = 8;

inline constexpr uint16_t kFlagEncrypted = 0x0001;
inline constexpr uint16_t kFlagDescriptor = 0x0008;
inline constexpr uint16_t kFlagUtf8 = 0x0800;

inline constexpr uint32_t kMax32 = 0xFFFFFFFF;
inline constexpr uint16_t kMax16 = 0xFFFF;

// Field offsets in the local header that the reader checks.
inline constexpr size_t kLocalNameLenOfs = 26;
inline constexpr size_t kLocalExtraLenOfs = 28;
inline constexpr size_t kLocalTimeOfs = 10;  // time u16, date u16
inline constexpr size_t kCentralTimeOfs = 12;

// torch (miniz in zip64 mode) adds zip64 extras, and 24-byte descriptors, exactly when the
// uncompressed size or the local header offset reaches 0xFFFFFFFF.
inline constexpr bool torch_needs_zip64(uint64_t header_offset, uint64_t size) noexcept {
  return size >= kMax32 || header_offset >= kMax32;
}

// Why a record name is unsafe to store or to extract (nullptr when it is fine): empty, a NUL
// byte, absolute ("/x", "\\x", "C:x"), or a ".." component (either slash separates). The reader
// checks every name of a directory (20,000 for a 20,000-tensor file), so names are first scanned
// 8 bytes at a time for NUL and '.' bytes, and walked byte by byte only when they have a '.'.
inline const char* name_problem(std::string_view name) noexcept {
  if (name.empty()) return "empty name";
  const char* p = name.data();
  const size_t n = name.size();
  bool nul = false, dot = false;
  if (n >= 8) {
    constexpr uint64_t kOnes = 0x0101010101010101ull, kHighs = 0x8080808080808080ull;
    constexpr uint64_t kDots = kOnes * '.';
    auto has_zero_byte = [](uint64_t w) { return ((w - kOnes) & ~w & kHighs) != 0; };
    for (size_t i = 0;; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + (i + 8 <= n ? i : n - 8), 8);  // the last word overlaps the one before
      nul |= has_zero_byte(w);
      dot |= has_zero_byte(w ^ kDots);
      if (i + 8 >= n) break;
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      nul |= p[i] == '\0';
      dot |= p[i] == '.';
    }
  }
  if (nul) return "name contains a NUL byte";
  if (p[0] == '/' || p[0] == '\\') return "absolute name";
  if (n >= 2 && p[1] == ':' && ((p[0] >= 'A' && p[0] <= 'Z') || (p[0] >= 'a' && p[0] <= 'z')))
    return "absolute name (drive letter)";
  if (dot) {
    auto slash = [&](size_t i) { return p[i] == '/' || p[i] == '\\'; };
    for (size_t i = 0; i + 1 < n; ++i)
      if (p[i] == '.' && p[i + 1] == '.' && (i == 0 || slash(i - 1)) &&
          (i + 2 == n || slash(i + 2)))
        return "name has a '..' component";
  }
  return nullptr;
}

}  // namespace ckpt::internal::zipfmt
