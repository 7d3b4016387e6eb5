#pragma once
// Element types: every torch dtype (plus the sub-byte kinds safetensors knows), with the name each
// format uses. One table (src/util/dtype.cc) is the single source of these facts. Every
// function here is pure and thread-safe; returned strings are static.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ckpt {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kFloat8_e5m2,
  kFloat8_e4m3fn,
  kFloat8_e5m2fnuz,
  kFloat8_e4m3fnuz,
  kFloat8_e8m0fnu,
  kFloat4_e2m1fn_x2,  // torch: two 4-bit floats packed per byte
  kComplex32,
  kComplex64,
  kComplex128,
  kBool,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kQInt8,
  kQUInt8,
  kQInt32,
  kQUInt4x2,
  kQUInt2x4,
  kBits8,
  kBits16,
  kBits1x8,
  kBits2x4,
  kBits4x2,
  // Sub-byte kinds of safetensors without a torch dtype (bits per element 4 or 6).
  kFloat4_e2m1,
  kFloat6_e2m3,
  kFloat6_e3m2,
  kBComplex32,  // torch 2.15: a complex of two bfloat16
};
inline constexpr int kNumDTypes = static_cast<int>(DType::kBComplex32) + 1;

struct DTypeInfo {
  DType dtype;
  const char* name;           // torch name: "float32", "bfloat16"; for sub-byte kinds a ckpt name
  uint32_t bits;              // bits per element (8 * itemsize for byte-sized types)
  const char* storage_class;  // torch legacy storage class ("FloatStorage"), nullptr if none
  const char* scalar_type;    // c10 ScalarType name ("Float", "BFloat16"), nullptr if none
  const char* safetensors;    // safetensors code ("F32"), nullptr if none
  const char* numpy;          // numpy dtype.str ("<f4"), nullptr if numpy lacks it
  bool is_floating;
  bool is_complex;
  bool is_quantized;
  bool is_signed;  // for integers
};

// Facts about a dtype. Never throws.
const DTypeInfo& dtype_info(DType dtype) noexcept;
inline std::string_view dtype_name(DType dtype) noexcept { return dtype_info(dtype).name; }
// Bytes per element; 0 for sub-byte kinds (use dtype_nbytes).
inline size_t dtype_size(DType dtype) noexcept {
  auto b = dtype_info(dtype).bits;
  return b % 8 == 0 ? b / 8 : 0;
}
// Bytes per element of a storage of this dtype: torch counts packed sub-byte storages
// (quint4x2, quint2x4) in bytes, so this is 1 for them.
inline size_t storage_element_size(DType dtype) noexcept {
  auto b = dtype_info(dtype).bits;
  return b < 8 ? 1 : b / 8;
}
// Bytes needed for `numel` elements; nullopt on overflow or when sub-byte elements do not end on a
// byte boundary.
std::optional<uint64_t> dtype_nbytes(DType dtype, uint64_t numel) noexcept;

// Lookups by each format's name; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view torch_name) noexcept;  // also "torch.float32"
std::optional<DType> dtype_from_storage_class(std::string_view cls) noexcept;  // "FloatStorage"
std::optional<DType> dtype_from_safetensors(std::string_view code) noexcept;   // "F32"
std::optional<DType> dtype_from_numpy(std::string_view str) noexcept;          // "<f4", "|b1"

}  // namespace ckpt
