#pragma once
// ONNX tensor element types and their typed fields (docs/formats/onnx.md "ONNX"): the
// TensorProto.DataType table, which typed field (float_data, int32_data, int64_data,
// double_data, uint64_data) holds a dtype's values, and a walk over those values, packed or not.
// Used by the ONNX reader (onnx_reader.cc).

#include <cstdint>
#include <optional>
#include <span>

#include "ckpt/dtype.h"
#include "formats/onnx/onnx_wire.h"

namespace ckpt::internal {

// ONNX TensorProto.DataType → ckpt dtype; nullopt for those ckpt has no type for.
inline std::optional<DType> dtype_from_onnx(int64_t t) {
  switch (t) {
    case 1:
      return DType::kFloat32;
    case 2:
      return DType::kUInt8;
    case 3:
      return DType::kInt8;
    case 4:
      return DType::kUInt16;
    case 5:
      return DType::kInt16;
    case 6:
      return DType::kInt32;
    case 7:
      return DType::kInt64;
    case 9:
      return DType::kBool;
    case 10:
      return DType::kFloat16;
    case 11:
      return DType::kFloat64;
    case 12:
      return DType::kUInt32;
    case 13:
      return DType::kUInt64;
    case 14:
      return DType::kComplex64;
    case 15:
      return DType::kComplex128;
    case 16:
      return DType::kBFloat16;
    case 17:
      return DType::kFloat8_e4m3fn;
    case 18:
      return DType::kFloat8_e4m3fnuz;
    case 19:
      return DType::kFloat8_e5m2;
    case 20:
      return DType::kFloat8_e5m2fnuz;
    case 23:
      return DType::kFloat4_e2m1;
    case 24:
      return DType::kFloat8_e8m0fnu;
    default:
      return std::nullopt;
  }
}

inline const char* onnx_type_name(int64_t t) {
  static const char* names[] = {
      "UNDEFINED",      "FLOAT",    "UINT8",        "INT8",           "UINT16",
      "INT16",          "INT32",    "INT64",        "STRING",         "BOOL",
      "FLOAT16",        "DOUBLE",   "UINT32",       "UINT64",         "COMPLEX64",
      "COMPLEX128",     "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
      "FLOAT8E5M2FNUZ", "UINT4",    "INT4",         "FLOAT4E2M1",     "FLOAT8E8M0",
      "UINT2",          "INT2"};
  return t >= 0 && t < static_cast<int64_t>(std::size(names)) ? names[t] : "unknown";
}

// Which typed field holds a dtype's values, and the bytes each value gives.
struct TypedField {
  uint32_t number;  // 4 float_data, 5 int32_data, 7 int64_data, 10 double_data, 11 uint64_data
  uint8_t wire;     // kFixed32, kVarint or kFixed64
  uint32_t width;   // bytes written per value
  const char* name;
};
inline TypedField typed_field(DType d) {
  switch (d) {
    case DType::kFloat32:
    case DType::kComplex64:
      return {4, onnx::kFixed32, 4, "float_data"};
    case DType::kFloat64:
    case DType::kComplex128:
      return {10, onnx::kFixed64, 8, "double_data"};
    case DType::kInt64:
      return {7, onnx::kVarint, 8, "int64_data"};
    case DType::kUInt32:
      return {11, onnx::kVarint, 4, "uint64_data"};
    case DType::kUInt64:
      return {11, onnx::kVarint, 8, "uint64_data"};
    case DType::kInt32:
      return {5, onnx::kVarint, 4, "int32_data"};
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return {5, onnx::kVarint, 2, "int32_data"};
    default:
      return {5, onnx::kVarint, 1, "int32_data"};  // 8-bit kinds, bool, float4 pairs
  }
}

// Calls fn(value) for each value of field `tf` in a TensorProto's bytes (packed or not).
// Returns false on a malformed packed run or a wrong wire type.
template <class Fn>
bool for_each_typed(std::span<const uint8_t> msg, uint64_t base, uint64_t file_end,
                    const TypedField& tf, Fn&& fn) {
  onnx::Reader r(msg, base, file_end, "a TensorProto");
  onnx::Field f;
  while (r.next(f)) {
    if (f.number != tf.number) continue;
    if (f.wire == onnx::kLen) {
      if (tf.wire == onnx::kVarint) {
        if (!onnx::for_each_packed_varint(f.bytes, fn)) return false;
      } else {
        size_t w = tf.wire == onnx::kFixed32 ? 4 : 8;
        if (f.bytes.size() % w) return false;
        for (size_t i = 0; i < f.bytes.size(); i += w) {
          uint64_t v = 0;
          for (size_t k = 0; k < w; ++k) v |= uint64_t{f.bytes[i + k]} << (8 * k);
          fn(v);
        }
      }
    } else if (f.wire == tf.wire) {
      fn(f.value);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace ckpt::internal
