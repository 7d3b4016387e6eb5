// Element conversions of the transforms (numerics.h). Every function works on bits, so that the
// result does not depend on the compiler's floating-point flags; each rounds to nearest even.

#include "convert/numerics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "ckpt/error.h"

namespace ckpt::internal {

namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Any castable element as float32 bits.
uint32_t to_f32_bits(DType d, const std::byte* p) {
  switch (d) {
    case DType::kFloat32:
      return load<uint32_t>(p);
    case DType::kFloat64:
      return f32_bits(static_cast<float>(load<double>(p)));
    case DType::kFloat16:
      return f16_to_f32_bits(load<uint16_t>(p));
    case DType::kBFloat16:
      return static_cast<uint32_t>(load<uint16_t>(p)) << 16;
    case DType::kFloat8_e4m3fn:
      return e4m3fn_to_f32_bits(load<uint8_t>(p));
    case DType::kFloat8_e5m2:
      return e5m2_to_f32_bits(load<uint8_t>(p));
    default:
      return 0;
  }
}

// float32 -> bfloat16 over a run (NaN -> 0xFFFF, as torch's vectorized loop), in blocks of a
// fixed count that the compiler vectorizes at -O2 (branch-free, no remainder loop): through
// cast_elements' per-element switch the cast of a DCP folder to bf16 shards ran at ~1 ns per
// element, a quarter of the conversion.
void f32_to_bf16_run(const std::byte* in, std::byte* out, uint64_t n) {
  constexpr uint64_t kBlock = 1024;
  uint32_t f[kBlock];
  uint16_t h[kBlock];
  for (uint64_t i = 0; i < n; i += kBlock) {
    const uint64_t m = std::min(kBlock, n - i);
    if (m < kBlock) std::memset(f, 0, sizeof f);
    std::memcpy(f, in + i * 4, m * 4);  // unaligned input allowed
    for (uint64_t j = 0; j < kBlock; ++j) {
      const uint32_t x = f[j];
      const uint32_t r = (x + 0x7FFF + ((x >> 16) & 1)) >> 16;
      h[j] = static_cast<uint16_t>((x & 0x7FFFFFFF) > 0x7F800000 ? 0xFFFF : r);
    }
    std::memcpy(out + i * 2, h, m * 2);
  }
}

}  // namespace

uint32_t f16_to_f32_bits(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0x1F) return sign | (m ? 0x7FC00000u | (m << 13) : 0x7F800000u);
  if (e != 0) return sign | ((e + 112) << 23) | (m << 13);
  if (m == 0) return sign;
  // Subnormal: m * 2^-24, normalized.
  int shift = 0;
  uint32_t mm = m;
  while (!(mm & 0x400)) {
    mm <<= 1;
    ++shift;
  }
  return sign | (static_cast<uint32_t>(113 - shift) << 23) | ((mm & 0x3FF) << 13);
}

uint32_t e4m3fn_to_f32_bits(uint8_t b) noexcept {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80) << 24;
  const uint32_t e = (b >> 3) & 0xF, m = b & 7;
  if ((b & 0x7F) == 0x7F) return sign | 0x7FF00000u;  // NaN, as torch makes it
  if (e != 0) return sign | ((e + 120) << 23) | (m << 20);
  if (m == 0) return sign;
  return sign | f32_bits(static_cast<float>(m) * 0x1p-9f);  // exact
}

uint32_t e5m2_to_f32_bits(uint8_t b) noexcept {
  return f16_to_f32_bits(static_cast<uint16_t>(b) << 8);
}

uint16_t f32_to_f16_bits(uint32_t f) noexcept {
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000);
  const uint32_t a = f & 0x7FFFFFFF;
  if (a > 0x7F800000) return sign | 0x7E00 | ((a >> 13) & 0x3FF);  // NaN: quiet, high payload
  if (a >= 0x477FF000) return sign | 0x7C00;  // 65520 and above round to infinity
  if (a >= 0x38800000) {                      // a normal float16
    const uint32_t r = a - 0x38000000;
    return sign | static_cast<uint16_t>((r + 0xFFF + ((r >> 13) & 1)) >> 13);
  }
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: zero
  const uint32_t mant = (a & 0x7FFFFF) | 0x800000;
  const uint32_t s = 126 - e;  // 14..24
  uint32_t q = mant >> s;
  const uint32_t rem = mant & ((1u << s) - 1), half = 1u << (s - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  return sign | static_cast<uint16_t>(q);
}

uint16_t f32_to_bf16_bits(uint32_t f, uint16_t nan) noexcept {
  if ((f & 0x7FFFFFFF) > 0x7F800000) return nan;
  return static_cast<uint16_t>((f + 0x7FFF + ((f >> 16) & 1)) >> 16);
}

bool castable_from(DType d) noexcept {
  switch (d) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8_e4m3fn:
    case DType::kFloat8_e5m2:
      return true;
    default:
      return false;
  }
}

bool castable_to(DType d) noexcept {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

void cast_elements(DType from, const std::byte* in, DType to, std::byte* out, uint64_t n) {
  if (!castable_from(from) || !castable_to(to))
    throw Error(ErrorCode::kInvalidArgument, "no cast from " + std::string(dtype_name(from)) +
                                                 " to " + std::string(dtype_name(to)));
  const size_t is = dtype_size(from), os = dtype_size(to);
  if (from == to) {
    std::memcpy(out, in, n * is);
    return;
  }
  if (from == DType::kFloat32 && to == DType::kBFloat16) return f32_to_bf16_run(in, out, n);
  // torch's vectorized float32/float64 -> bfloat16 gives all-ones for NaN; through float from
  // the narrower types, its scalar rounding gives 0x7FC0.
  const uint16_t nan = (from == DType::kFloat32 || from == DType::kFloat64) ? 0xFFFF : 0x7FC0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t f = to_f32_bits(from, in + i * is);
    if (to == DType::kFloat32)
      store<uint32_t>(out + i * os, f);
    else if (to == DType::kFloat16)
      store<uint16_t>(out + i * os, f32_to_f16_bits(f));
    else
      store<uint16_t>(out + i * os, f32_to_bf16_bits(f, nan));
  }
}

void dequant_fp8_block(const std::byte* w, const std::byte* scale, int64_t rows, int64_t cols,
                       std::byte* out) {
  static const auto kE4m3 = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = f32_of(e4m3fn_to_f32_bits(static_cast<uint8_t>(b)));
    return t;
  }();
  const int64_t scols = (cols + 127) / 128;
  std::vector<float> srow(scols);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(srow.data(), scale + (i / 128) * scols * 4, scols * 4);
    const auto* in = reinterpret_cast<const uint8_t*>(w + i * cols);
    std::byte* o = out + i * cols * 2;
    for (int64_t j0 = 0; j0 < cols; j0 += 128) {
      const float s = srow[j0 / 128];
      const int64_t j1 = std::min<int64_t>(cols, j0 + 128);
      for (int64_t j = j0; j < j1; ++j)
        store<uint16_t>(o + j * 2, f32_to_bf16_bits(f32_bits(kE4m3[in[j]] * s), 0xFFFF));
    }
  }
}

void dequant_mxfp4(const std::byte* blocks, const std::byte* scales, int64_t rows, int64_t bytes,
                   std::byte* out, const int64_t* swap) {
  static const float kLut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int64_t width = 2 * bytes;
  for (int64_t r = 0; r < rows; ++r) {
    const int e = static_cast<int>(static_cast<uint8_t>(scales[r])) - 127;
    uint16_t v[16];
    for (int k = 0; k < 16; ++k) v[k] = f32_to_bf16_bits(f32_bits(std::ldexp(kLut[k], e)), 0xFFFF);
    // Output element (r, c) of the [rows, width] matrix, or transposed per expert.
    int64_t base = r * width, step = 1;
    if (swap) {  // row r is (ex, n, g) of [e, n, g]; element (ex, n, c) goes to (ex, c, n)
      const int64_t n = swap[1], g = swap[2];
      const int64_t gi = r % g, ni = (r / g) % n, ex = r / g / n;
      base = ex * g * width * n + gi * width * n + ni;
      step = n;
    }
    for (int64_t b = 0; b < bytes; ++b) {
      const uint8_t byte = static_cast<uint8_t>(blocks[r * bytes + b]);
      store<uint16_t>(out + (base + (2 * b) * step) * 2, v[byte & 0xF]);
      store<uint16_t>(out + (base + (2 * b + 1) * step) * 2, v[byte >> 4]);
    }
  }
}

}  // namespace ckpt::internal
