#pragma once
// Conversions the pickle VM and pickler share: Python int <-> two's-complement bytes and decimal
// text, UTF-8 checks, latin-1, and the escape decoders of the protocol-0 STRING/UNICODE opcodes.
// None of these throw; they report failure with a bool so that the caller can name the offset.

#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::internal::pickle_text {

// Largest LONG1/LONG4 payload converted to decimal text: the conversion is quadratic, and
// CPython itself refuses to print ints above 4300 digits (about 1786 bytes).
inline constexpr size_t kMaxBigIntBytes = 2048;

// Decodes a little-endian two's-complement integer (LONG1/LONG4 payload, n <= kMaxBigIntBytes).
// Sets `small` when it fits int64 (returns true), else `big` to its decimal text (returns false).
bool decode_long_bytes(std::string_view le, int64_t& small, std::string& big);

// Parses Python int text (optional sign, decimal digits, optional trailing 'L' when
// allow_l_suffix). Returns false on bad syntax. Fills `small` or `big` as decode_long_bytes does;
// `fits` says which.
bool parse_int_text(std::string_view text, bool allow_l_suffix, int64_t& small, std::string& big,
                    bool& fits);

// Two's-complement little-endian bytes of the integer, trimmed the way CPython's pickler trims
// LONG1 payloads. `decimal` is Value::s of a big int ("-123..."). Returns false on bad text.
std::string encode_long(int64_t v);
bool encode_long_decimal(std::string_view decimal, std::string& out);

// UTF-8 checks: util/text.h is_utf8(s, Surrogates::kAllow), CPython's 'surrogatepass'.
// Each byte as the code point of the same value.
std::string latin1_to_utf8(std::string_view s);
// UTF-8 -> latin-1 bytes; false when a code point is above U+00FF or the text is not UTF-8.
bool utf8_to_latin1(std::string_view s, std::string& out);
// Python 2 str payloads (STRING/BINSTRING/SHORT_BINSTRING): kept as is when valid UTF-8 (what
// torch.load's encoding='utf-8' gives), else read as latin-1 so that no file is refused.
std::string py2_str_to_utf8(std::string_view s);

// STRING's argument: a quoted Python 2 string literal body with backslash escapes
// (codecs.escape_decode). `quoted` includes the quotes. False on bad quoting or escapes.
bool decode_string_literal(std::string_view quoted, std::string& out);
// UNICODE's argument: raw-unicode-escape (latin-1 bytes, plus \uXXXX and \UXXXXXXXX) -> UTF-8.
bool decode_raw_unicode_escape(std::string_view s, std::string& out);

// Decimal text of a GET/PUT argument; false when it is no non-negative integer.
bool parse_index(std::string_view text, uint64_t& out);

}  // namespace ckpt::internal::pickle_text
