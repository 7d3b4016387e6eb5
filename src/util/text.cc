#include "util/text.h"

#include <cstring>

namespace ckpt::internal {

namespace {
template <typename Byte>
std::string hex_of(std::span<const Byte> bytes) {
  std::string s;
  s.reserve(bytes.size() * 2);
  for (Byte b : bytes) {
    const auto v = static_cast<unsigned>(b);
    s += kHexDigits[v >> 4];
    s += kHexDigits[v & 15];
  }
  return s;
}
}  // namespace

std::string to_hex(std::span<const std::byte> bytes) { return hex_of(bytes); }
std::string to_hex(std::span<const unsigned char> bytes) { return hex_of(bytes); }

std::string hex32(uint32_t v) {
  std::string s(8, '0');
  for (int k = 7; k >= 0; --k, v >>= 4) s[k] = kHexDigits[v & 15];
  return s;
}

bool parse_hex(std::string_view text, std::span<unsigned char> out) noexcept {
  if (text.size() != 2 * out.size()) return false;
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = hex_digit_value(text[2 * i]), lo = hex_digit_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

size_t utf8_decode(std::string_view s, size_t i, uint32_t& cp, Surrogates surrogates) noexcept {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  size_t n;
  uint32_t min;
  if (c < 0x80) {
    cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF) return 0;
  if (surrogates == Surrogates::kReject && cp >= 0xD800 && cp <= 0xDFFF) return 0;
  return n;
}

bool is_utf8(std::string_view s, Surrogates surrogates) noexcept {
  for (size_t i = 0; i < s.size();) {
    // ASCII runs dominate (tensor names, state-dict keys); skip them eight at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    uint32_t cp;
    size_t n = utf8_decode(s, i, cp, surrogates);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace ckpt::internal
