#include "ckpt/dtype.h"

#include <array>
#include <string>

namespace ckpt {
namespace {

// clang-format off
constexpr std::array<DTypeInfo, kNumDTypes> kTable = {{
  // dtype                  name                bits storage_class          scalar_type        st            numpy   float  cplx   quant  signed
  {DType::kFloat32,         "float32",          32, "FloatStorage",         "Float",           "F32",        "<f4",  true,  false, false, true},
  {DType::kFloat64,         "float64",          64, "DoubleStorage",        "Double",          "F64",        "<f8",  true,  false, false, true},
  {DType::kFloat16,         "float16",          16, "HalfStorage",          "Half",            "F16",        "<f2",  true,  false, false, true},
  {DType::kBFloat16,        "bfloat16",         16, "BFloat16Storage",      "BFloat16",        "BF16",       nullptr, true, false, false, true},
  {DType::kFloat8_e5m2,     "float8_e5m2",       8, nullptr,                "Float8_e5m2",     "F8_E5M2",    nullptr, true, false, false, true},
  {DType::kFloat8_e4m3fn,   "float8_e4m3fn",     8, nullptr,                "Float8_e4m3fn",   "F8_E4M3",    nullptr, true, false, false, true},
  {DType::kFloat8_e5m2fnuz, "float8_e5m2fnuz",   8, nullptr,                "Float8_e5m2fnuz", "F8_E5M2FNUZ", nullptr, true, false, false, true},
  {DType::kFloat8_e4m3fnuz, "float8_e4m3fnuz",   8, nullptr,                "Float8_e4m3fnuz", "F8_E4M3FNUZ", nullptr, true, false, false, true},
  {DType::kFloat8_e8m0fnu,  "float8_e8m0fnu",    8, nullptr,                "Float8_e8m0fnu",  "F8_E8M0",    nullptr, true, false, false, false},
  {DType::kFloat4_e2m1fn_x2,"float4_e2m1fn_x2",  8, nullptr,                "Float4_e2m1fn_x2", nullptr,     nullptr, true, false, false, true},
  {DType::kComplex32,       "complex32",        32, nullptr,                "ComplexHalf",     nullptr,      nullptr, false, true, false, true},
  {DType::kComplex64,       "complex64",        64, "ComplexFloatStorage",  "ComplexFloat",    "C64",        "<c8",  false, true,  false, true},
  {DType::kComplex128,      "complex128",      128, "ComplexDoubleStorage", "ComplexDouble",   nullptr,      "<c16", false, true,  false, true},
  {DType::kBool,            "bool",              8, "BoolStorage",          "Bool",            "BOOL",       "|b1",  false, false, false, false},
  {DType::kInt8,            "int8",              8, "CharStorage",          "Char",            "I8",         "|i1",  false, false, false, true},
  {DType::kInt16,           "int16",            16, "ShortStorage",         "Short",           "I16",        "<i2",  false, false, false, true},
  {DType::kInt32,           "int32",            32, "IntStorage",           "Int",             "I32",        "<i4",  false, false, false, true},
  {DType::kInt64,           "int64",            64, "LongStorage",          "Long",            "I64",        "<i8",  false, false, false, true},
  {DType::kUInt8,           "uint8",             8, "ByteStorage",          "Byte",            "U8",         "|u1",  false, false, false, false},
  {DType::kUInt16,          "uint16",           16, nullptr,                "UInt16",          "U16",        "<u2",  false, false, false, false},
  {DType::kUInt32,          "uint32",           32, nullptr,                "UInt32",          "U32",        "<u4",  false, false, false, false},
  {DType::kUInt64,          "uint64",           64, nullptr,                "UInt64",          "U64",        "<u8",  false, false, false, false},
  {DType::kQInt8,           "qint8",             8, "QInt8Storage",         "QInt8",           nullptr,      nullptr, false, false, true, true},
  {DType::kQUInt8,          "quint8",            8, "QUInt8Storage",        "QUInt8",          nullptr,      nullptr, false, false, true, false},
  {DType::kQInt32,          "qint32",           32, "QInt32Storage",        "QInt32",          nullptr,      nullptr, false, false, true, true},
  {DType::kQUInt4x2,        "quint4x2",          4, "QUInt4x2Storage",      "QUInt4x2",        nullptr,      nullptr, false, false, true, false},
  {DType::kQUInt2x4,        "quint2x4",          2, "QUInt2x4Storage",      "QUInt2x4",        nullptr,      nullptr, false, false, true, false},
  {DType::kBits8,           "bits8",             8, nullptr,                "Bits8",           nullptr,      nullptr, false, false, false, false},
  {DType::kBits16,          "bits16",           16, nullptr,                "Bits16",          nullptr,      nullptr, false, false, false, false},
  {DType::kBits1x8,         "bits1x8",           8, nullptr,                "Bits1x8",         nullptr,      nullptr, false, false, false, false},
  {DType::kBits2x4,         "bits2x4",           8, nullptr,                "Bits2x4",         nullptr,      nullptr, false, false, false, false},
  {DType::kBits4x2,         "bits4x2",           8, nullptr,                "Bits4x2",         nullptr,      nullptr, false, false, false, false},
  {DType::kFloat4_e2m1,     "float4_e2m1",       4, nullptr,                nullptr,           "F4",         nullptr, true, false, false, true},
  {DType::kFloat6_e2m3,     "float6_e2m3",       6, nullptr,                nullptr,           "F6_E2M3",    nullptr, true, false, false, true},
  {DType::kFloat6_e3m2,     "float6_e3m2",       6, nullptr,                nullptr,           "F6_E3M2",    nullptr, true, false, false, true},
  {DType::kBComplex32,      "bcomplex32",       32, nullptr,                "BComplex32",      nullptr,      nullptr, false, true, false, true},
}};
// clang-format on

constexpr bool table_in_order() {
  for (int i = 0; i < kNumDTypes; ++i)
    if (static_cast<int>(kTable[i].dtype) != i) return false;
  return true;
}
static_assert(table_in_order(), "dtype table must follow the enum order");

template <typename Field>
std::optional<DType> find(std::string_view key, Field field) {
  for (const auto& info : kTable) {
    const char* v = info.*field;
    if (v != nullptr && key == v) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace

const DTypeInfo& dtype_info(DType dtype) noexcept { return kTable[static_cast<int>(dtype)]; }

std::optional<uint64_t> dtype_nbytes(DType dtype, uint64_t numel) noexcept {
  uint64_t total;  // no division: called once per tensor when a checkpoint opens
  if (__builtin_mul_overflow(uint64_t{dtype_info(dtype).bits}, numel, &total)) return std::nullopt;
  if (total % 8 != 0) return std::nullopt;
  return total / 8;
}

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  if (auto d = find(name, &DTypeInfo::name)) return d;
  // Aliases torch accepts as dtype attributes.
  static constexpr std::pair<const char*, DType> kAliases[] = {
      {"float", DType::kFloat32},    {"double", DType::kFloat64},     {"half", DType::kFloat16},
      {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128}, {"chalf", DType::kComplex32},
      {"long", DType::kInt64},       {"int", DType::kInt32},          {"short", DType::kInt16},
  };
  for (auto& [alias, d] : kAliases)
    if (name == alias) return d;
  return std::nullopt;
}

std::optional<DType> dtype_from_storage_class(std::string_view cls) noexcept {
  if (cls.substr(0, 6) == "torch.") cls.remove_prefix(6);
  if (auto d = find(cls, &DTypeInfo::storage_class)) return d;
  // TorchScript names every storage "<ScalarType>Storage".
  constexpr std::string_view kSuffix = "Storage";
  if (cls.size() > kSuffix.size() && cls.substr(cls.size() - kSuffix.size()) == kSuffix)
    return find(cls.substr(0, cls.size() - kSuffix.size()), &DTypeInfo::scalar_type);
  return std::nullopt;
}

std::optional<DType> dtype_from_safetensors(std::string_view code) noexcept {
  return find(code, &DTypeInfo::safetensors);
}

std::optional<DType> dtype_from_numpy(std::string_view str) noexcept {
  if (auto d = find(str, &DTypeInfo::numpy)) return d;
  // numpy writes single-byte types with '|' but accepts '<' or '=' too.
  if (str.size() >= 2 && (str[0] == '<' || str[0] == '=' || str[0] == '|')) {
    std::string s(str);
    for (char c : {'|', '<'}) {
      s[0] = c;
      if (auto d = find(s, &DTypeInfo::numpy)) return d;
    }
  }
  return std::nullopt;
}

}  // namespace ckpt
