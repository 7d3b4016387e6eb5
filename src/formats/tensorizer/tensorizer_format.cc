// Shared tensorizer pieces: per-tensor header coding, crypt_info, dtype strings, names, CRC
// shift. Layout summary in tensorizer_format.h.

#include "formats/tensorizer/tensorizer_format.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "util/bytes.h"
#include "util/text.h"

namespace ckpt::internal::tzr {
namespace {

CryptInfo parse_crypt_info(std::span<const std::byte> block, const std::string& source,
                           const std::string& tensor, uint64_t base) {
  Cursor c(block, source, tensor, base);
  CryptInfo info;
  const uint16_t count = c.get<uint16_t>();
  for (uint16_t i = 0; i < count; ++i) {
    const uint64_t len = c.get<uint64_t>();
    if (len > c.remaining()) c.fail(ErrorCode::kCorrupt, "crypt_info chunk passes its block");
    const uint64_t chunk_base = c.abs_pos();
    Cursor k(c.take(len), source, tensor, chunk_base);
    const uint16_t type = k.get<uint16_t>();
    if (type == kChunkKeyDerivation) {
      const uint16_t method = k.get<uint16_t>();
      if (method != kKdfPwhash)
        k.fail(ErrorCode::kUnsupported, "unknown key derivation method " + std::to_string(method));
      if (info.kdf) k.fail(ErrorCode::kCorrupt, "two key derivation chunks");
      KdfParams p;
      p.opslimit = k.get<uint64_t>();
      p.memlimit = k.get<uint64_t>();
      p.alg = k.get<int32_t>();
      const uint16_t salt_len = k.get<uint16_t>();
      p.salt = std::string(k.take_str(salt_len));
      info.kdf = std::move(p);
    } else if (type == kChunkXSalsa20Parallel || type == kChunkXSalsa20Sequential) {
      if (info.cipher) k.fail(ErrorCode::kUnsupported, "more than one encryption chunk");
      CipherParams p;
      if (type == kChunkXSalsa20Parallel) {
        p.chunk_size = k.get<uint64_t>();
        if (p.chunk_size < 1024 || p.chunk_size % 64 != 0)
          k.fail(ErrorCode::kCorrupt, "encryption chunk size " + std::to_string(p.chunk_size) +
                                          " is not a multiple of 64 of at least 1024");
        std::memcpy(p.nonce.data(), k.take(kNonceBytes).data(), kNonceBytes);
        const uint64_t n = k.get<uint64_t>();
        if (n > k.remaining() / kMacBytes)
          k.fail(ErrorCode::kCorrupt, "MAC count " + std::to_string(n) + " passes the chunk");
        p.macs.resize(n);
        for (auto& m : p.macs) std::memcpy(m.data(), k.take(kMacBytes).data(), kMacBytes);
      } else {
        std::memcpy(p.nonce.data(), k.take(kNonceBytes).data(), kNonceBytes);
        p.macs.resize(1);
        std::memcpy(p.macs[0].data(), k.take(kMacBytes).data(), kMacBytes);
      }
      info.cipher = std::move(p);
    } else {
      k.fail(ErrorCode::kUnsupported, "unknown crypt_info chunk type " + std::to_string(type));
    }
    if (k.remaining()) k.fail(ErrorCode::kCorrupt, "trailing bytes in a crypt_info chunk");
  }
  if (c.remaining()) c.fail(ErrorCode::kCorrupt, "trailing bytes in crypt_info");
  return info;
}

void append_crypt_chunk(std::string& out, const std::string& body) {
  append_le<uint64_t>(out, body.size());
  out += body;
}

// Python's json.dumps(ensure_ascii=True) string form, so structured names match byte for byte.
void append_json_string(std::string& out, std::string_view s) {
  auto u16 = [&](uint32_t v) {
    out += "\\u";
    for (int sh = 12; sh >= 0; sh -= 4) out += kHexDigits[(v >> sh) & 15];
  };
  out += '"';
  for (size_t i = 0; i < s.size();) {
    unsigned char ch = s[i];
    if (ch < 0x80) {
      ++i;
      switch (ch) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (ch < 0x20)
            u16(ch);
          else
            out += static_cast<char>(ch);
      }
      continue;
    }
    int extra = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : 1;
    uint32_t cp = ch & (0x3F >> extra);
    for (int k = 1; k <= extra && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    i += extra + 1;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      u16(0xD800 + (cp >> 10));
      u16(0xDC00 + (cp & 0x3FF));
    } else {
      u16(cp);
    }
  }
  out += '"';
}

// Reflected CRC-32 polynomial arithmetic: bit 31 is x^0.
constexpr uint32_t kPoly = 0xEDB88320u;
uint32_t mul_mod_p(uint32_t a, uint32_t b) noexcept {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b *= x
  }
  return product;
}

}  // namespace

uint32_t crc32_shift(uint32_t crc, uint64_t nbytes) noexcept {
  uint32_t power = 1u << 31;   // x^0
  uint32_t square = 1u << 23;  // x^8: one byte
  for (uint64_t n = nbytes; n; n >>= 1) {
    if (n & 1) power = mul_mod_p(power, square);
    square = mul_mod_p(square, square);
  }
  return mul_mod_p(power, crc);
}

TensorHeader parse_tensor_header(std::span<const std::byte> bytes, bool with_crypt_info,
                                 const std::string& source, const std::string& tensor,
                                 uint64_t base) {
  Cursor c(bytes, source, tensor, base);
  TensorHeader h;
  const uint64_t size = c.get<uint64_t>();
  if (size != bytes.size())
    c.fail(ErrorCode::kCorrupt, "header size " + std::to_string(size) +
                                    " disagrees with the index (" + std::to_string(bytes.size()) +
                                    " bytes between header and data)");
  h.module_index = c.get<uint16_t>();
  h.type = c.get<uint8_t>();
  h.name = std::string(c.take_str(c.get<uint16_t>()));
  h.dtype = std::string(c.take_str(c.get<uint8_t>()));
  const uint8_t ndim = c.get<uint8_t>();
  h.shape.resize(ndim);
  for (auto& d : h.shape) d = c.get<uint32_t>();

  const uint16_t hash_len = c.get<uint16_t>();
  const size_t hash_at = c.pos();
  Cursor hc(c.take(hash_len), source, tensor, base + hash_at);
  std::string hashable(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const uint8_t count = hc.get<uint8_t>();
  for (uint8_t i = 0; i < count; ++i) {
    const uint8_t type = hc.get<uint8_t>();
    const uint8_t len = hc.get<uint8_t>();
    const size_t value_at = hash_at + hc.pos();
    auto value = hc.take(len);
    if (type == kHashCrc32) {
      if (len != 4) hc.fail(ErrorCode::kCorrupt, "CRC32 hash of length " + std::to_string(len));
      h.crc32 = load_le<uint32_t>(value.data());
    } else if (type == kHashSha256) {
      if (len != 32) hc.fail(ErrorCode::kCorrupt, "SHA-256 hash of length " + std::to_string(len));
      Sha256 s;
      std::memcpy(s.data(), value.data(), 32);
      h.sha256 = s;
    }
    // Unknown hash types are skipped, but like every hash value they are zeroed for hashing.
    std::memset(hashable.data() + value_at, 0, len);
  }
  if (hc.remaining()) hc.fail(ErrorCode::kCorrupt, "trailing bytes in the hash section");

  if (with_crypt_info) {
    const size_t crypt_at = c.pos();
    const uint64_t len = c.get<uint64_t>();
    if (len > c.remaining()) c.fail(ErrorCode::kTruncated, "crypt_info passes the header");
    const uint64_t block_base = c.abs_pos();
    h.crypt = parse_crypt_info(c.take(len), source, tensor, block_base);
    hashable.erase(crypt_at, c.pos() - crypt_at);
  }
  if (c.remaining() != 8)
    c.fail(ErrorCode::kCorrupt, std::to_string(c.remaining()) +
                                    " bytes remain before the data where the 8-byte data length "
                                    "should end the header");
  h.data_length = c.get<int64_t>();
  h.hashable = std::move(hashable);
  return h;
}

std::string serialize_crypt_info(const CryptInfo& info) {
  std::string body;
  uint16_t count = (info.kdf ? 1 : 0) + (info.cipher ? 1 : 0);
  append_le<uint16_t>(body, count);
  if (info.kdf) {
    std::string k;
    append_le<uint16_t>(k, kChunkKeyDerivation);
    append_le<uint16_t>(k, kKdfPwhash);
    append_le<uint64_t>(k, info.kdf->opslimit);
    append_le<uint64_t>(k, info.kdf->memlimit);
    append_le<int32_t>(k, info.kdf->alg);
    append_le<uint16_t>(k, static_cast<uint16_t>(info.kdf->salt.size()));
    k += info.kdf->salt;
    append_crypt_chunk(body, k);
  }
  if (info.cipher) {
    std::string k;
    append_le<uint16_t>(k, kChunkXSalsa20Parallel);
    append_le<uint64_t>(k, info.cipher->chunk_size);
    k.append(reinterpret_cast<const char*>(info.cipher->nonce.data()), kNonceBytes);
    append_le<uint64_t>(k, info.cipher->macs.size());
    for (const Mac& m : info.cipher->macs)
      k.append(reinterpret_cast<const char*>(m.data()), kMacBytes);
    append_crypt_chunk(body, k);
  }
  std::string out;
  append_le<uint64_t>(out, body.size());
  return out + body;
}

BuiltHeader build_tensor_header(uint16_t module_index, uint8_t type, std::string_view name,
                                std::string_view dtype, std::span<const uint32_t> shape,
                                bool with_crc, bool with_sha, const CryptInfo* crypt,
                                int64_t data_length) {
  BuiltHeader h;
  std::string& b = h.bytes;
  append_le<uint64_t>(b, 0);  // size, patched below
  append_le<uint16_t>(b, module_index);
  append_le<uint8_t>(b, type);
  append_le<uint16_t>(b, static_cast<uint16_t>(name.size()));
  b += name;
  append_le<uint8_t>(b, static_cast<uint8_t>(dtype.size()));
  b += dtype;
  append_le<uint8_t>(b, static_cast<uint8_t>(shape.size()));
  for (uint32_t d : shape) append_le<uint32_t>(b, d);
  const uint16_t hash_len = 1 + (with_crc ? 6 : 0) + (with_sha ? 34 : 0);
  append_le<uint16_t>(b, hash_len);
  append_le<uint8_t>(b, static_cast<uint8_t>((with_crc ? 1 : 0) + (with_sha ? 1 : 0)));
  if (with_crc) {
    append_le<uint8_t>(b, kHashCrc32);
    append_le<uint8_t>(b, 4);
    h.crc_at = b.size();
    append_le<uint32_t>(b, 0);
  }
  if (with_sha) {
    append_le<uint8_t>(b, kHashSha256);
    append_le<uint8_t>(b, 32);
    h.sha_at = b.size();
    b.append(32, '\0');
  }
  h.hashable = b;
  if (crypt) b += serialize_crypt_info(*crypt);
  std::string tail;
  append_le<int64_t>(tail, data_length);
  b += tail;
  h.hashable += tail;
  const uint64_t size = b.size();
  store_le<uint64_t>(reinterpret_cast<std::byte*>(b.data()), size);
  store_le<uint64_t>(reinterpret_cast<std::byte*>(h.hashable.data()), size);
  return h;
}

std::optional<ParsedDType> parse_dtype_string(std::string_view s) {
  ParsedDType out;
  std::string_view numpy = s, torch;
  if (auto nul = s.find('\0'); nul != std::string_view::npos) {
    numpy = s.substr(0, nul);
    torch = s.substr(nul + 1);
  }
  if (numpy.size() < 3) return std::nullopt;
  const char order = numpy[0], kind = numpy[1];
  if (order != '<' && order != '>' && order != '|' && order != '=') return std::nullopt;
  uint64_t width = 0;
  for (char ch : numpy.substr(2)) {
    if (ch < '0' || ch > '9' || width > 1000) return std::nullopt;
    width = width * 10 + (ch - '0');
  }
  if (kind == 'V' || !torch.empty()) {
    // Opaque: the numpy part only gives the width; the torch name gives the type.
    if (torch.empty()) return std::nullopt;
    auto d = dtype_from_name(torch);
    if (!d || dtype_size(*d) != width) return std::nullopt;
    out.dtype = *d;
    out.opaque = kind == 'V';
    return out;
  }
  std::string norm(numpy);
  if (order == '>' || order == '=') norm[0] = '<';
  auto d = dtype_from_numpy(norm);
  if (!d) return std::nullopt;
  out.dtype = *d;
  out.byteswap = order == '>' && dtype_size(*d) > 1;
  return out;
}

std::optional<std::string> dtype_string(DType dtype, bool* opaque) {
  const DTypeInfo& info = dtype_info(dtype);
  *opaque = false;
  if (info.is_quantized || info.bits % 8 != 0) return std::nullopt;
  if (info.numpy) return std::string(info.numpy);
  // numpy lacks it: a void type as wide as the int type of the same size.
  const uint32_t width = info.bits / 8;
  if (width != 1 && width != 2 && width != 4 && width != 8) return std::nullopt;
  *opaque = true;
  std::string s = width == 1 ? "|V1" : "<V" + std::to_string(width);
  s += '\0';
  s += "torch.";
  s += info.name;
  return s;
}

std::vector<PathComponent> parse_tensor_name(std::string_view raw) {
  std::vector<PathComponent> path;
  if (raw.empty() || raw[0] != '\x1e') {
    if (!is_utf8(raw)) throw Error(ErrorCode::kCorrupt, "tensor name is not valid UTF-8");
    path.emplace_back(std::string(raw));
    return path;
  }
  if (raw.size() < 3 || raw[1] != '[' || raw.back() != ']' ||
      raw.find_first_of("\r\n") != std::string_view::npos)
    throw Error(ErrorCode::kCorrupt, "structured tensor name is not \\x1e[...] on one line");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(raw.substr(1));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorrupt, std::string("structured tensor name: ") + e.what());
  }
  if (!j.is_array() || j.empty())
    throw Error(ErrorCode::kCorrupt, "structured tensor name is not a non-empty array");
  for (const auto& v : j) {
    if (v.is_string()) {
      path.emplace_back(v.get<std::string>());
    } else if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
      path.emplace_back(static_cast<int64_t>(v.get<uint64_t>()));
    } else {
      throw Error(ErrorCode::kCorrupt,
                  "structured tensor name component is neither a string nor an index");
    }
  }
  return path;
}

std::string serialize_tensor_name(const std::vector<PathComponent>& path) {
  if (path.size() == 1 && std::holds_alternative<std::string>(path[0]))
    return std::get<std::string>(path[0]);
  std::string out = "\x1e[";
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out += ',';
    if (auto* s = std::get_if<std::string>(&path[i]))
      append_json_string(out, *s);
    else
      out += std::to_string(std::get<int64_t>(path[i]));
  }
  return out + "]";
}

std::string dotted_name(const std::vector<PathComponent>& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i) out += '.';
    if (auto* s = std::get_if<std::string>(&path[i]))
      out += *s;
    else
      out += std::to_string(std::get<int64_t>(path[i]));
  }
  return out;
}

const char* tensor_type_name(uint8_t type) noexcept {
  switch (type) {
    case 0:
      return "param";
    case 1:
      return "buffer";
    case 2:
      return "state_dict";
  }
  return "unknown";
}

}  // namespace ckpt::internal::tzr
