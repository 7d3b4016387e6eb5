// ckpt show FILE [NAME]: the object tree, or one tensor's values printed the way torch prints them
// (4 decimals, summarised with "..." past 1000 elements).

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "common.h"

namespace ckpt::cli {
namespace {

double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(man, -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(man + 1024, exp - 25);
  return sign ? -v : v;
}
double fp8_to_double(uint8_t b, int ebits, int mbits, bool fn) {
  int sign = b >> 7, exp = (b >> mbits) & ((1 << ebits) - 1), man = b & ((1 << mbits) - 1);
  int bias = (1 << (ebits - 1)) - 1;
  double v;
  if (fn && exp == (1 << ebits) - 1 && man == (1 << mbits) - 1) return NAN;
  if (!fn && exp == (1 << ebits) - 1) return man ? NAN : (sign ? -INFINITY : INFINITY);
  if (exp == 0) v = std::ldexp(man, 1 - bias - mbits);
  else v = std::ldexp(man + (1 << mbits), exp - bias - mbits);
  return sign ? -v : v;
}

// One element as double (real part for complex); nullopt for types printed as raw bits.
std::optional<double> element(DType d, const std::byte* p, bool imag = false) {
  auto u8 = [&] { return std::to_integer<uint8_t>(p[0]); };
  switch (d) {
    case DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::kFloat64: { double f; std::memcpy(&f, p, 8); return f; }
    case DType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return half_to_double(h); }
    case DType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); uint32_t w = uint32_t(h) << 16; float f; std::memcpy(&f, &w, 4); return f; }
    case DType::kFloat8_e4m3fn: return fp8_to_double(u8(), 4, 3, true);
    case DType::kFloat8_e5m2: return fp8_to_double(u8(), 5, 2, false);
    case DType::kComplex64: { float f[2]; std::memcpy(f, p, 8); return f[imag]; }
    case DType::kComplex128: { double f[2]; std::memcpy(f, p, 16); return f[imag]; }
    case DType::kComplex32: { uint16_t h[2]; std::memcpy(h, p, 4); return half_to_double(h[imag]); }
    case DType::kBool: return u8() ? 1 : 0;
    case DType::kInt8: case DType::kQInt8: return static_cast<int8_t>(u8());
    case DType::kUInt8: case DType::kQUInt8: return u8();
    case DType::kInt16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::kUInt16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::kInt32: case DType::kQInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kUInt32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::kUInt64: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    default: return std::nullopt;
  }
}

std::string fmt_elem(DType d, const std::byte* p) {
  const auto& info = dtype_info(d);
  char buf[96];
  auto v = element(d, p);
  if (!v) {
    std::snprintf(buf, sizeof buf, "0x%02x", std::to_integer<unsigned>(p[0]));
    return buf;
  }
  if (d == DType::kBool) return *v ? "True" : "False";
  if (info.is_complex) {
    double im = *element(d, p, true);
    std::snprintf(buf, sizeof buf, "%.4f%+.4fj", *v, im);
    return buf;
  }
  if (info.is_floating) {
    if (std::isnan(*v)) return "nan";
    if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
    std::snprintf(buf, sizeof buf, "%.4f", *v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.0f", *v);
  return buf;
}

void print_values(const Tensor& t) {
  const TensorInfo& info = t.info();
  auto bytes = t.contiguous_bytes();
  size_t es = dtype_size(info.dtype);
  uint64_t n = info.numel();
  bool summarize = n > 1000;
  std::string out = "tensor(";
  if (info.shape.empty()) {
    out += fmt_elem(info.dtype, bytes.data());
  } else if (es == 0) {
    out += "<" + std::to_string(bytes.size()) + " bytes of sub-byte data>";
  } else {
    std::vector<int64_t> idx(info.shape.size(), 0);
    // Recursive printer over dims; edge items 3 when summarizing (torch's default).
    std::function<void(size_t, uint64_t, int)> rec = [&](size_t dim, uint64_t base, int indent) {
      out += "[";
      int64_t len = info.shape[dim];
      uint64_t stride = 1;
      for (size_t k = dim + 1; k < info.shape.size(); ++k) stride *= info.shape[k];
      for (int64_t i = 0; i < len; ++i) {
        if (summarize && len > 6 && i == 3) {
          out += dim + 1 == info.shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' ');
          i = len - 3;
        }
        if (dim + 1 == info.shape.size()) {
          out += fmt_elem(info.dtype, bytes.data() + (base + i) * es);
          if (i + 1 < len) out += ", ";
        } else {
          rec(dim + 1, base + i * stride, indent + 1);
          if (i + 1 < len) out += ",\n" + std::string(indent + 1, ' ');
        }
      }
      out += "]";
    };
    rec(0, 0, 7);
  }
  if (info.dtype != DType::kFloat32 && info.dtype != DType::kInt64 && info.dtype != DType::kBool)
    out += ", dtype=torch." + std::string(dtype_name(info.dtype));
  if (info.quantization && info.quantization->scheme.find("per_tensor") != std::string::npos) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ", scale=%g, zero_point=%lld", info.quantization->scale,
                  static_cast<long long>(info.quantization->zero_point));
    out += " (integer representation)" + std::string(buf);
  }
  if (info.requires_grad) out += ", requires_grad=True";
  out += ")";
  std::printf("%s\n", out.c_str());
}

void print_tree(const Checkpoint& c, const ValuePtr& v, const std::string& label, int indent,
                std::set<const Value*>& seen) {
  std::string pad(indent * 2, ' ');
  std::string head = pad + label;
  if (!v) {
    std::printf("%sNone\n", head.c_str());
    return;
  }
  if (v->kind == Value::Kind::kTensor) {
    const TensorInfo& t = c.tensors()[static_cast<size_t>(v->i)];
    std::printf("%s%s(%s, %s)%s\n", head.c_str(), t.is_parameter ? "Parameter" : "tensor",
                std::string(dtype_name(t.dtype)).c_str(), shape_str(t.shape).c_str(),
                t.requires_grad ? " requires_grad" : "");
    return;
  }
  bool container = v->kind == Value::Kind::kDict || v->kind == Value::Kind::kList ||
                   v->kind == Value::Kind::kTuple || v->kind == Value::Kind::kSet ||
                   (v->kind == Value::Kind::kObject && (v->state || !v->items.empty()));
  if (!container) {
    std::printf("%s%s\n", head.c_str(), v->repr(100).c_str());
    return;
  }
  if (!seen.insert(v.get()).second || indent > 60) {
    std::printf("%s<%s, shown above>\n", head.c_str(), v->repr(40).c_str());
    return;
  }
  std::string kind = v->kind == Value::Kind::kDict
                         ? (v->name.empty() ? "dict" : v->name)
                         : v->kind == Value::Kind::kList ? "list"
                         : v->kind == Value::Kind::kTuple ? "tuple"
                         : v->kind == Value::Kind::kSet ? "set" : v->module + "." + v->name;
  size_t n = v->kind == Value::Kind::kDict ? v->entries.size() : v->items.size();
  std::printf("%s%s (%zu)\n", head.c_str(), kind.c_str(), n);
  if (v->kind == Value::Kind::kDict) {
    for (auto& [k, val] : v->entries)
      print_tree(c, val, (k ? path_component(*k) : "?") + ": ", indent + 1, seen);
  } else {
    for (size_t i = 0; i < v->items.size(); ++i)
      print_tree(c, v->items[i], "[" + std::to_string(i) + "] ", indent + 1, seen);
  }
  if (v->state) print_tree(c, v->state, "state: ", indent + 1, seen);
}

}  // namespace

void add_show(CLI::App& app) {
  struct Opts {
    std::string file, name;
    Common common;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("show", "print the object tree, or one tensor's values");
  cmd->add_option("FILE", o->file, "checkpoint")->required();
  cmd->add_option("NAME", o->name, "tensor to print");
  add_common(*cmd, o->common);
  cmd->callback([o] {
    Checkpoint c = open_checkpoint(o->file, o->common);
    if (!o->name.empty()) {
      print_values(c.tensor(o->name));
      return;
    }
    std::set<const Value*> seen;
    print_tree(c, c.root(), "", 0, seen);
  });
}

}  // namespace ckpt::cli
