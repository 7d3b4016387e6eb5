#pragma once
// Element conversions of the transforms (transform.h): casts among float32, float16, bfloat16,
// float64 and float8 (e4m3fn, e5m2), and the dequantization of block-scaled FP8 and MXFP4. Each
// equals torch's CPU result bit for bit (docs/design/writers.md, "Writers", **Transforms**); NaN
// bits follow torch's vectorized loop. Pure functions, thread-safe.

#include <cstddef>
#include <cstdint>

#include "ckpt/dtype.h"

namespace ckpt::internal {

// Element bits.
uint32_t f16_to_f32_bits(uint16_t h) noexcept;
uint32_t e4m3fn_to_f32_bits(uint8_t b) noexcept;
uint32_t e5m2_to_f32_bits(uint8_t b) noexcept;
uint16_t f32_to_f16_bits(uint32_t f) noexcept;
// `nan`: the bits a NaN becomes (0xFFFF from float32 and float64, 0x7FC0 from the narrower types).
uint16_t f32_to_bf16_bits(uint32_t f, uint16_t nan) noexcept;

// Whether cast_elements converts from/to this dtype.
bool castable_from(DType d) noexcept;  // float32, float64, float16, bfloat16, e4m3fn, e5m2
bool castable_to(DType d) noexcept;    // float32, float16, bfloat16

// n elements of `from` at `in` to `to` at `out` (little-endian, unaligned allowed).
void cast_elements(DType from, const std::byte* in, DType to, std::byte* out, uint64_t n);

// W (float8_e4m3fn, rows x cols) times its block's scale (float32, ceil(rows/128) x
// ceil(cols/128)), to bfloat16: (w.float() * scale[i/128][j/128]).to(bfloat16).
void dequant_fp8_block(const std::byte* w, const std::byte* scale, int64_t rows, int64_t cols,
                       std::byte* out);

// MXFP4: `rows` rows of `bytes` bytes (two e2m1 values each, low nibble first) with one E8M0
// exponent per row, to bfloat16 values (lut[nibble] * 2^(scale - 127), exact, infinity past
// bfloat16's range). Row r's values go to out + r * 2 * bytes elements, or, with `swap` =
// {e, n, g} (rows = e * n * g): the tensor [e, n, g * 2 * bytes] is written as its
// transpose(1, 2), [e, g * 2 * bytes, n].
void dequant_mxfp4(const std::byte* blocks, const std::byte* scales, int64_t rows, int64_t bytes,
                   std::byte* out, const int64_t* swap);

}  // namespace ckpt::internal
