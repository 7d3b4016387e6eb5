#pragma once
// Little-endian coding and overflow-checked arithmetic for parsers.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/error.h"

namespace ckpt::internal {

template <typename T>
inline T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));  // host is little-endian (checked in CMake)
  return v;
}
template <typename T>
inline void store_le(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
inline void append_le(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) noexcept {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) noexcept {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
// `v` rounded up to a multiple of `align` (any alignment; 0 and 1 leave `v` as is). The caller
// makes sure the result fits: v + align - 1 must not overflow.
constexpr uint64_t round_up(uint64_t v, uint64_t align) noexcept {
  return align <= 1 ? v : (v + align - 1) / align * align;
}
constexpr bool is_pow2(uint64_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }
// round_up() for a power-of-two `align` (64 for slots and storages, 4096 for pages), without a
// division: align_up(v, 64) == (v + 63) & ~63. Same overflow contract as round_up().
constexpr uint64_t align_up(uint64_t v, uint64_t align) noexcept {
  return (v + align - 1) & ~(align - 1);
}
// The alignment ckpt gives every storage it places in memory (cache lines; AVX-512 loads).
inline constexpr uint64_t kStorageAlign = 64;

inline std::span<const std::byte> as_bytes(std::string_view s) noexcept {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline std::string_view as_chars(std::span<const std::byte> b) noexcept {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// A bounds-checked little-endian reader over a span. Every read checks the bytes that remain and
// throws Error{kTruncated} naming `source`, `record` and the absolute offset (base + position).
class Cursor {
 public:
  Cursor(std::span<const std::byte> data, std::string source, std::string record = {},
         uint64_t base = 0)
      : data_(data), source_(std::move(source)), record_(std::move(record)), base_(base) {}

  size_t pos() const noexcept { return pos_; }
  size_t remaining() const noexcept { return data_.size() - pos_; }
  uint64_t abs_pos() const noexcept { return base_ + pos_; }
  void seek(size_t pos);
  void need(size_t n) const;
  template <typename T>
  T get() {
    need(sizeof(T));
    T v = load_le<T>(data_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  std::span<const std::byte> take(size_t n) {
    need(n);
    auto s = data_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view take_str(size_t n) { return as_chars(take(n)); }
  // Throws Error{code} naming this cursor's source/record at the current position.
  [[noreturn]] void fail(ErrorCode code, const std::string& message) const;
  const std::string& source() const noexcept { return source_; }
  const std::string& record() const noexcept { return record_; }

 private:
  std::span<const std::byte> data_;
  std::string source_, record_;
  uint64_t base_;
  size_t pos_ = 0;
};

}  // namespace ckpt::internal
