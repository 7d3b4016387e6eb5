// numpy values in a torch pickle: dtypes and scalars (torch_numpy.h).

#include "formats/torch/torch_numpy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace ckpt::internal {
namespace {

using Kind = Value::Kind;

double half_to_double(uint16_t x) {
  const int sign = x >> 15, exp = (x >> 10) & 0x1f, frac = x & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(frac, -24);
  } else if (exp == 31) {
    v = frac ? std::nan("") : INFINITY;
  } else {
    v = std::ldexp(frac + 1024, exp - 25);
  }
  return sign ? -v : v;
}

}  // namespace

std::optional<NpType> numpy_type(const PickleHeap& h, Ref d) {
  if (h.kind(d) != Kind::kObject || h.name(d) != "dtype" || h.module(d) != "numpy")
    return std::nullopt;
  auto args = h.items(d);
  if (args.empty() || h.kind(args[0]) != Kind::kString) return std::nullopt;
  static const std::pair<std::string_view, DType> kTypes[] = {
      {"b1", DType::kBool},      {"i1", DType::kInt8},       {"i2", DType::kInt16},
      {"i4", DType::kInt32},     {"i8", DType::kInt64},      {"u1", DType::kUInt8},
      {"u2", DType::kUInt16},    {"u4", DType::kUInt32},     {"u8", DType::kUInt64},
      {"f2", DType::kFloat16},   {"f4", DType::kFloat32},    {"f8", DType::kFloat64},
      {"c8", DType::kComplex64}, {"c16", DType::kComplex128}};
  std::optional<NpType> t;
  for (auto& [code, dt] : kTypes)
    if (h.text(args[0]) == code) t = NpType{dt};
  if (!t) return std::nullopt;
  Ref st = h.state(d);
  if (st == kNoRef) return t;
  auto si = h.items(st);
  if (h.kind(st) != Kind::kTuple || si.size() < 2 || h.kind(si[1]) != Kind::kString)
    return std::nullopt;
  // Fields beyond the byte order (names, fields, a subarray) mean a structured type.
  for (size_t i = 2; i < si.size() && i < 5; ++i)
    if (h.kind(si[i]) != Kind::kNone) return std::nullopt;
  std::string_view order = h.text(si[1]);
  if (order == ">") {
    t->swap = dtype_info(t->dtype).bits > 8;
  } else if (order != "<" && order != "|" && order != "=") {
    return std::nullopt;
  }
  return t;
}

Ref numpy_scalar(PickleHeap& h, Ref fn, std::span<const Ref> a) {
  if (a.size() != 2 || h.kind(a[1]) != Kind::kBytes) return kNoRef;
  auto t = numpy_type(h, a[0]);
  if (!t) return kNoRef;
  std::string raw(h.text(a[1]));
  const size_t size = dtype_info(t->dtype).bits / 8;
  if (raw.size() != size) return kNoRef;
  if (t->swap) {
    const size_t half = (t->dtype == DType::kComplex64 || t->dtype == DType::kComplex128) ? 2 : 1;
    for (size_t p = 0; p < half; ++p)
      std::reverse(raw.begin() + p * size / half, raw.begin() + (p + 1) * size / half);
  }
  auto rd = [&](auto x, size_t off = 0) {
    std::memcpy(&x, raw.data() + off, sizeof x);
    return x;
  };
  Ref v;
  switch (t->dtype) {
    case DType::kBool:
      v = h.own_boolean(raw[0] != 0);
      break;  // not the shared one
    case DType::kInt8:
      v = h.integer(rd(int8_t{}));
      break;
    case DType::kInt16:
      v = h.integer(rd(int16_t{}));
      break;
    case DType::kInt32:
      v = h.integer(rd(int32_t{}));
      break;
    case DType::kInt64:
      v = h.integer(rd(int64_t{}));
      break;
    case DType::kUInt8:
      v = h.integer(rd(uint8_t{}));
      break;
    case DType::kUInt16:
      v = h.integer(rd(uint16_t{}));
      break;
    case DType::kUInt32:
      v = h.integer(rd(uint32_t{}));
      break;
    case DType::kUInt64: {
      uint64_t x = rd(uint64_t{});
      v = x <= INT64_MAX ? h.integer(static_cast<int64_t>(x)) : h.big_integer(std::to_string(x));
      break;
    }
    case DType::kFloat16:
      v = h.real(half_to_double(rd(uint16_t{})));
      break;
    case DType::kFloat32:
      v = h.real(rd(float{}));
      break;
    case DType::kFloat64:
      v = h.real(rd(double{}));
      break;
    case DType::kComplex64:
      v = h.complex({rd(float{}), rd(float{}, 4)});
      break;
    case DType::kComplex128:
      v = h.complex({rd(double{}), rd(double{}, 8)});
      break;
    default:
      return kNoRef;
  }
  const Ref args[2] = {a[0], a[1]};
  Ref call = h.object(fn, h.tuple(args));
  h.set_origin(v, call);
  return v;
}

}  // namespace ckpt::internal
