#pragma once
// Text helpers the parsers share: hexadecimal digits and UTF-8 checking/encoding. None of these
// throw except on allocation failure; failures are reported by return value so that the caller
// can name the record and offset.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ckpt::internal {

// ----- hexadecimal

inline constexpr char kHexDigits[] = "0123456789abcdef";

// The value of a hexadecimal digit (0-9, a-f, A-F), or -1 for any other character.
constexpr int hex_digit_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Two lowercase hex digits per byte, in order.
std::string to_hex(std::span<const std::byte> bytes);
std::string to_hex(std::span<const unsigned char> bytes);
// `v` as exactly 8 lowercase hex digits, as printf("%08x") (CRC32 values in messages and ids).
std::string hex32(uint32_t v);
// Decodes exactly 2 * out.size() hex digits (either case, no separators or prefix) into `out`.
// False on a wrong length or a non-hex character; `out` is then unspecified.
bool parse_hex(std::string_view text, std::span<unsigned char> out) noexcept;

// ----- UTF-8

// Whether encoded UTF-16 surrogates (U+D800..U+DFFF, e.g. ED A0 80) count as valid. Strict UTF-8
// (RFC 3629, what tensorizer and JSON need) rejects them; CPython's pickle reads and writes
// strings with 'surrogatepass', which accepts them.
enum class Surrogates : bool { kReject, kAllow };

// Decodes the sequence that starts at s[i] (i < s.size()): returns its length (1-4) and sets
// `cp`, or returns 0 when it is invalid — a stray continuation byte, a lead byte above F7, a
// truncated or badly continued sequence, an overlong form, a code point above U+10FFFF, or a
// surrogate unless allowed.
size_t utf8_decode(std::string_view s, size_t i, uint32_t& cp,
                   Surrogates surrogates = Surrogates::kReject) noexcept;
// Whether all of `s` is valid UTF-8 (see utf8_decode). ASCII runs are skipped 8 bytes at a time.
bool is_utf8(std::string_view s, Surrogates surrogates = Surrogates::kReject) noexcept;
// Appends the UTF-8 form of `cp` (<= U+10FFFF; surrogates are encoded as they are).
void append_utf8(std::string& out, uint32_t cp);

}  // namespace ckpt::internal
