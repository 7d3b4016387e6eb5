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
//                         where the 32-bit field is saturated (torch: see pytorch.md §1.2)
//   zip64 end record 56 B: sig 06064b50, record size u64 (=44), made by u16, needed u16,
//                         disk u32, cd disk u32, entries on disk u64, entries u64, cd size u64,
//                         cd offset u64
//   zip64 locator   20 B: sig 07064b50, disk u32, zip64 end record offset u64, disks u32
//   end record      22 B: sig 06054b50, disk u16, cd disk u16, entries on disk u16, entries u16,
//                         cd size u32, cd offset u32, comment len u16; then comment

#include <cstdint>
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
// byte, absolute ("/x", "\\x", "C:x"), or a ".." component (either slash separates).
inline const char* name_problem(std::string_view name) noexcept {
  if (name.empty()) return "empty name";
  if (name.find('\0') != std::string_view::npos) return "name contains a NUL byte";
  if (name[0] == '/' || name[0] == '\\') return "absolute name";
  if (name.size() >= 2 && name[1] == ':' &&
      ((name[0] >= 'A' && name[0] <= 'Z') || (name[0] >= 'a' && name[0] <= 'z')))
    return "absolute name (drive letter)";
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find_first_of("/\\", start);
    if (end == std::string_view::npos) end = name.size();
    if (name.substr(start, end - start) == "..") return "name has a '..' component";
    start = end + 1;
  }
  return nullptr;
}

}  // namespace ckpt::internal::zipfmt
