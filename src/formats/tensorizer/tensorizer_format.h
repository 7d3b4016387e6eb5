#pragma once
// tensorizer data versions 1-4 (docs/formats/tensorizer.md "tensorizer": **Layout**, **Versions**,
// **Encryption**): the pieces the reader and the writer share. All integers little-endian.
//
// File:    "|TZR|" u32 version, 32-byte feature flags (v4+; bit 0 = encrypted), u64 tensor_size
//          (sum of data lengths), 8 unused bytes, u64 tensor count, u64 index length, index,
//          then per tensor: header + data, then a u64 0 where the next header length would be.
// Index entry: u16 name length + name, u8 tensor type, u8 dtype length + dtype, u8 ndim +
//          u32[ndim], u64 header offset, u64 data offset, u64 data length (absolute offsets).
// Header:  u64 header size (through the data length field), u16 module index, u8 tensor type,
//          u16 name length + name, u8 dtype length + dtype, u8 ndim + u32[ndim],
//          u16 hash section length (after itself), u8 hash count, {u8 type, u8 len, value}...,
//          [encrypted files: u64 crypt_info length + crypt_info], i64 data length.
// Hashes:  CRC32 (type 0, u32) and SHA-256 (type 1) over the header with the hash values
//          zeroed and the crypt_info block (with its length) cut out, then the data (plaintext).
// crypt_info: u16 chunk count, then {u64 length, u16 type, body}: type 1 key derivation (u16
//          method 1 = pwhash: u64 opslimit, u64 memlimit, i32 alg, u16 salt length + salt);
//          type 2 XSalsa20 parallel (u64 chunk size, 24-byte nonce, u64 MAC count, 16-byte MACs);
//          type 3 XSalsa20 sequential (24-byte nonce, 16-byte MAC).

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ckpt/dtype.h"
#include "util/crc32.h"

namespace ckpt::internal::tzr {

inline constexpr std::string_view kMagic = "|TZR|";
inline constexpr size_t kPrologueBytes = 73;
inline constexpr uint32_t kVersionNumpy = 1;
inline constexpr uint32_t kVersionOpaque = 2;
inline constexpr uint32_t kVersionEncryption = 3;
inline constexpr uint32_t kVersionMeta = 4;
inline constexpr uint64_t kIndexReserve = 256 * 1024;
inline constexpr uint8_t kHashCrc32 = 0;
inline constexpr uint8_t kHashSha256 = 1;
inline constexpr uint8_t kFlagEncrypted = 1;
inline constexpr uint16_t kChunkKeyDerivation = 1;
inline constexpr uint16_t kChunkXSalsa20Parallel = 2;
inline constexpr uint16_t kChunkXSalsa20Sequential = 3;
inline constexpr uint16_t kKdfPwhash = 1;
inline constexpr uint64_t kDefaultCryptChunk = 2 << 20;
inline constexpr size_t kNonceBytes = 24;
inline constexpr size_t kMacBytes = 16;
inline constexpr size_t kKeyBytes = 32;

using Nonce = std::array<unsigned char, kNonceBytes>;
using Mac = std::array<unsigned char, kMacBytes>;
using Key = std::array<unsigned char, kKeyBytes>;
using Sha256 = std::array<unsigned char, 32>;

struct KdfParams {
  uint64_t opslimit = 0;
  uint64_t memlimit = 0;
  int32_t alg = 0;
  std::string salt;
  bool operator==(const KdfParams&) const = default;
};

// XSalsa20-Poly1305 over chunks of `chunk_size` bytes (the last may be shorter); chunk i uses
// `nonce` incremented i times (sodium_increment) and has MAC i. Sequential: chunk_size 0 means
// one chunk covering the whole tensor.
struct CipherParams {
  uint64_t chunk_size = 0;
  Nonce nonce{};
  std::vector<Mac> macs;
};

struct CryptInfo {
  std::optional<KdfParams> kdf;
  std::optional<CipherParams> cipher;
};

struct TensorHeader {
  uint16_t module_index = 0;
  uint8_t type = 0;
  std::string name;   // as stored (may be a structured "\x1e[...]" path)
  std::string dtype;  // as stored
  std::vector<uint32_t> shape;
  std::optional<uint32_t> crc32;
  std::optional<Sha256> sha256;
  std::optional<CryptInfo> crypt;  // present when the file is encrypted
  int64_t data_length = 0;
  std::string hashable;  // header bytes with hash values zeroed and crypt_info cut out
};

// Parses one header from exactly its bytes ([header offset, data offset)). Throws Error
// (kTruncated, kCorrupt, kUnsupported) naming `source` and `tensor`, offsets from `base`.
TensorHeader parse_tensor_header(std::span<const std::byte> bytes, bool with_crypt_info,
                                 const std::string& source, const std::string& tensor,
                                 uint64_t base);

// The u64-length-prefixed crypt_info block.
std::string serialize_crypt_info(const CryptInfo& info);

// A header for writing. Hash values are zero; `crc_at`/`sha_at` say where to put them
// (std::string::npos when absent); `hashable` is what the hashes cover before the data.
struct BuiltHeader {
  std::string bytes;
  std::string hashable;
  size_t crc_at = std::string::npos;
  size_t sha_at = std::string::npos;
};
BuiltHeader build_tensor_header(uint16_t module_index, uint8_t type, std::string_view name,
                                std::string_view dtype, std::span<const uint32_t> shape,
                                bool with_crc, bool with_sha, const CryptInfo* crypt,
                                int64_t data_length);

// dtype strings: numpy `dtype.str` ("<f4", "|b1") or, for torch dtypes numpy lacks, a void type
// of the same width, a NUL and the torch name ("<V2\0torch.bfloat16").
struct ParsedDType {
  DType dtype;
  bool byteswap = false;  // big-endian numpy type
  bool opaque = false;
};
std::optional<ParsedDType> parse_dtype_string(std::string_view s);
// The string tensorizer writes for `dtype`; nullopt when tensorizer cannot store it.
std::optional<std::string> dtype_string(DType dtype, bool* opaque);

// crc * x^(8 * nbytes) mod P: the CRC-32 "shift" that crc32_combine applies to the first part.
// crc(B) = crc(A ++ B) ^ crc32_shift(crc(A), |B|).
uint32_t crc32_shift(uint32_t crc, uint64_t nbytes) noexcept;

// Continues a CRC over `data`. libdeflate treats a null buffer as "give the initial value" and
// returns 0, which an empty span (data() == nullptr) would trigger; so empty data is skipped.
inline uint32_t crc32_update(uint32_t crc, std::span<const std::byte> data) noexcept {
  return data.empty() ? crc : internal::crc32(crc, data);
}

// Tensor names: a plain UTF-8 string or "\x1e" + a JSON array of strings and non-negative ints.
using PathComponent = std::variant<std::string, int64_t>;
// Throws Error{kCorrupt} on a malformed structured name (message only; caller adds context).
std::vector<PathComponent> parse_tensor_name(std::string_view raw);
// The stored form: plain when the path is one string, else "\x1e" + compact ASCII JSON.
std::string serialize_tensor_name(const std::vector<PathComponent>& path);
// Components joined with '.'.
std::string dotted_name(const std::vector<PathComponent>& path);

const char* tensor_type_name(uint8_t type) noexcept;  // "param", "buffer", "state_dict"

}  // namespace ckpt::internal::tzr
