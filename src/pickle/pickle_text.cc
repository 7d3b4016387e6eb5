#include "pickle/pickle_text.h"

#include <algorithm>
#include <vector>

#include "util/text.h"

namespace ckpt::internal::pickle_text {
namespace {

// Magnitude (little-endian bytes) -> decimal digits, by repeated division by 10^9 over 32-bit
// limbs. Quadratic, so callers cap the size.
std::string magnitude_to_decimal(const std::vector<uint8_t>& mag) {
  std::vector<uint32_t> limbs((mag.size() + 3) / 4, 0);
  for (size_t i = 0; i < mag.size(); ++i) limbs[i / 4] |= uint32_t{mag[i]} << (8 * (i % 4));
  while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  std::string digits;
  while (!limbs.empty()) {
    uint64_t rem = 0;
    for (size_t i = limbs.size(); i-- > 0;) {
      uint64_t cur = (rem << 32) | limbs[i];
      limbs[i] = static_cast<uint32_t>(cur / 1000000000u);
      rem = cur % 1000000000u;
    }
    while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
    for (int k = 0; k < 9; ++k) {
      digits.push_back(static_cast<char>('0' + rem % 10));
      rem /= 10;
      if (limbs.empty() && rem == 0) break;
    }
  }
  if (digits.empty()) digits = "0";
  std::reverse(digits.begin(), digits.end());
  return digits;
}

// Sign and digits of Python int text; false on bad syntax.
bool split_decimal(std::string_view text, bool& negative, std::string_view& digits) {
  negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  size_t nz = text.find_first_not_of('0');
  digits = nz == std::string_view::npos ? std::string_view("0") : text.substr(nz);
  return true;
}

// Two's complement of `mag` (little-endian magnitude) in CPython's LONG1 size and trimming.
std::string twos_complement(std::vector<uint8_t> mag, bool negative) {
  while (!mag.empty() && mag.back() == 0) mag.pop_back();
  if (mag.empty()) return std::string();
  size_t nbits = (mag.size() - 1) * 8 + (32 - __builtin_clz(uint32_t{mag.back()}));
  size_t nbytes = nbits / 8 + 1;
  mag.resize(nbytes, 0);
  if (negative) {
    unsigned carry = 1;
    for (auto& byte : mag) {
      unsigned v = static_cast<uint8_t>(~byte) + carry;
      byte = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
    // The magnitude's extra sign byte is redundant when the next byte already has its top bit.
    if (nbytes > 1 && mag[nbytes - 1] == 0xFF && (mag[nbytes - 2] & 0x80)) mag.pop_back();
  }
  return std::string(mag.begin(), mag.end());
}

}  // namespace

bool decode_long_bytes(std::string_view le, int64_t& small, std::string& big) {
  size_t n = le.size();
  if (n == 0) {
    small = 0;
    return true;
  }
  bool negative = static_cast<uint8_t>(le[n - 1]) & 0x80;
  uint8_t fill = negative ? 0xFF : 0x00;
  bool fits = true;
  for (size_t i = 8; i < n; ++i) fits = fits && static_cast<uint8_t>(le[i]) == fill;
  if (n > 8) fits = fits && ((static_cast<uint8_t>(le[7]) & 0x80) != 0) == negative;
  if (fits) {
    uint64_t u = negative ? ~uint64_t{0} : 0;
    for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) {
      u &= ~(uint64_t{0xFF} << (8 * i));
      u |= uint64_t{static_cast<uint8_t>(le[i])} << (8 * i);
    }
    small = static_cast<int64_t>(u);
    return true;
  }
  std::vector<uint8_t> mag(le.begin(), le.end());
  if (negative) {
    unsigned carry = 1;
    for (auto& byte : mag) {
      unsigned v = static_cast<uint8_t>(~byte) + carry;
      byte = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
  }
  big = (negative ? "-" : "") + magnitude_to_decimal(mag);
  return false;
}

bool parse_int_text(std::string_view text, bool allow_l_suffix, int64_t& small, std::string& big,
                    bool& fits) {
  if (allow_l_suffix && !text.empty() && text.back() == 'L') text.remove_suffix(1);
  bool negative;
  std::string_view digits;
  if (!split_decimal(text, negative, digits)) return false;
  uint64_t mag = 0;
  fits = true;
  for (char c : digits) {
    if (__builtin_mul_overflow(mag, 10u, &mag) || __builtin_add_overflow(mag, c - '0', &mag)) {
      fits = false;
      break;
    }
  }
  if (fits) {
    constexpr uint64_t kMinMag = uint64_t{1} << 63;
    if (negative ? mag > kMinMag : mag >= kMinMag) {
      fits = false;
    } else {
      small = negative ? static_cast<int64_t>(0 - mag) : static_cast<int64_t>(mag);
    }
  }
  if (!fits) big = (negative ? "-" : "") + std::string(digits);
  return true;
}

std::string encode_long(int64_t v) {
  uint64_t mag = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::vector<uint8_t> bytes;
  for (; mag; mag >>= 8) bytes.push_back(static_cast<uint8_t>(mag));
  return twos_complement(std::move(bytes), v < 0);
}

bool encode_long_decimal(std::string_view decimal, std::string& out) {
  bool negative;
  std::string_view digits;
  if (!split_decimal(decimal, negative, digits)) return false;
  std::vector<uint8_t> mag;  // little-endian magnitude, built digit by digit
  for (char c : digits) {
    unsigned carry = static_cast<unsigned>(c - '0');
    for (auto& byte : mag) {
      unsigned v = byte * 10u + carry;
      byte = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
    if (carry) mag.push_back(static_cast<uint8_t>(carry));
  }
  out = twos_complement(std::move(mag), negative);
  return true;
}

std::string latin1_to_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) append_utf8(out, static_cast<uint8_t>(c));
  return out;
}

bool utf8_to_latin1(std::string_view s, std::string& out) {
  out.clear();
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = utf8_decode(s, i, cp, Surrogates::kAllow);
    if (n == 0 || cp > 0xFF) return false;
    out.push_back(static_cast<char>(cp));
    i += n;
  }
  return true;
}

std::string py2_str_to_utf8(std::string_view s) {
  return is_utf8(s, Surrogates::kAllow) ? std::string(s) : latin1_to_utf8(s);
}

bool decode_string_literal(std::string_view quoted, std::string& out) {
  if (quoted.size() < 2 || quoted.front() != quoted.back() ||
      (quoted.front() != '\'' && quoted.front() != '"'))
    return false;
  std::string_view s = quoted.substr(1, quoted.size() - 2);
  out.clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out.push_back(s[i]);
      continue;
    }
    if (++i == s.size()) return false;  // a trailing backslash
    char c = s[i];
    switch (c) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x': {
        if (s.size() - i < 3) return false;
        int hi = hex_digit_value(s[i + 1]), lo = hex_digit_value(s[i + 2]);
        if (hi < 0 || lo < 0) return false;
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          unsigned v = c - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
            v = v * 8 + (s[++i] - '0');
          out.push_back(static_cast<char>(v & 0xFF));
        } else {
          out.push_back('\\');  // unknown escapes stay as written
          out.push_back(c);
        }
    }
  }
  return true;
}

bool decode_raw_unicode_escape(std::string_view s, std::string& out) {
  out.clear();
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '\\') {
      append_utf8(out, static_cast<uint8_t>(s[i++]));
      continue;
    }
    // Only a backslash run of odd length escapes the 'u'/'U' after it.
    size_t run = 0;
    while (i < s.size() && s[i] == '\\') {
      out.push_back('\\');
      ++i, ++run;
    }
    if (run % 2 == 0 || i >= s.size() || (s[i] != 'u' && s[i] != 'U')) continue;
    out.pop_back();
    size_t count = s[i] == 'u' ? 4 : 8;
    ++i;
    if (s.size() - i < count) return false;
    uint32_t cp = 0;
    for (size_t k = 0; k < count; ++k) {
      int h = hex_digit_value(s[i + k]);
      if (h < 0) return false;
      cp = cp * 16 + static_cast<uint32_t>(h);
    }
    if (cp > 0x10FFFF) return false;
    i += count;
    append_utf8(out, cp);
  }
  return true;
}

bool parse_index(std::string_view text, uint64_t& out) {
  if (text.empty()) return false;
  out = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    if (__builtin_mul_overflow(out, 10u, &out) || __builtin_add_overflow(out, c - '0', &out))
      return false;
  }
  return true;
}

}  // namespace ckpt::internal::pickle_text
