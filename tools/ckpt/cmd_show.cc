// ckpt show FILE [NAME]: the object tree, or one tensor's values printed the way torch prints them
// (4 decimals, summarised with "..." past 1000 elements).

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include "common.h"

namespace ckpt::cli {
namespace {

double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0)
    v = std::ldexp(man, -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(man + 1024, exp - 25);
  return sign ? -v : v;
}
double fp8_to_double(uint8_t b, int ebits, int mbits, bool fn) {
  int sign = b >> 7, exp = (b >> mbits) & ((1 << ebits) - 1), man = b & ((1 << mbits) - 1);
  int bias = (1 << (ebits - 1)) - 1;
  double v;
  if (fn && exp == (1 << ebits) - 1 && man == (1 << mbits) - 1) return NAN;
  if (!fn && exp == (1 << ebits) - 1) return man ? NAN : (sign ? -INFINITY : INFINITY);
  if (exp == 0)
    v = std::ldexp(man, 1 - bias - mbits);
  else
    v = std::ldexp(man + (1 << mbits), exp - bias - mbits);
  return sign ? -v : v;
}

template <class T>
T load_as(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A floating-point or complex element as double (the real part, or with `imag` the imaginary
// part, of a complex one); nullopt for another dtype.
std::optional<double> float_element(DType d, const std::byte* p, bool imag) {
  switch (d) {
    case DType::kFloat32:
      return load_as<float>(p);
    case DType::kFloat64:
      return load_as<double>(p);
    case DType::kFloat16:
      return half_to_double(load_as<uint16_t>(p));
    case DType::kBFloat16:
      return std::bit_cast<float>(uint32_t{load_as<uint16_t>(p)} << 16);
    case DType::kFloat8_e4m3fn:
      return fp8_to_double(load_as<uint8_t>(p), 4, 3, true);
    case DType::kFloat8_e5m2:
      return fp8_to_double(load_as<uint8_t>(p), 5, 2, false);
    case DType::kComplex64:
      return load_as<float>(p + (imag ? 4 : 0));
    case DType::kComplex128:
      return load_as<double>(p + (imag ? 8 : 0));
    case DType::kComplex32:
      return half_to_double(load_as<uint16_t>(p + (imag ? 2 : 0)));
    default:
      return std::nullopt;
  }
}

// A bool, integer or quantized integer element as double; nullopt for another dtype.
std::optional<double> integer_element(DType d, const std::byte* p) {
  switch (d) {
    case DType::kBool:
      return load_as<uint8_t>(p) ? 1 : 0;
    case DType::kInt8:
    case DType::kQInt8:
      return load_as<int8_t>(p);
    case DType::kUInt8:
    case DType::kQUInt8:
      return load_as<uint8_t>(p);
    case DType::kInt16:
      return load_as<int16_t>(p);
    case DType::kUInt16:
      return load_as<uint16_t>(p);
    case DType::kInt32:
    case DType::kQInt32:
      return load_as<int32_t>(p);
    case DType::kUInt32:
      return load_as<uint32_t>(p);
    case DType::kInt64:
      return static_cast<double>(load_as<int64_t>(p));
    case DType::kUInt64:
      return static_cast<double>(load_as<uint64_t>(p));
    default:
      return std::nullopt;
  }
}

// One element as double (real part for complex); nullopt for types printed as raw bits.
std::optional<double> element(DType d, const std::byte* p, bool imag = false) {
  if (auto v = float_element(d, p, imag)) return v;
  return integer_element(d, p);
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

// torch's _Formatter, restated: float tensors whose finite values are all integers print as
// "3."; a wide range (max/min > 1000, max > 1e8 or min < 1e-4) switches to "%.4e"; otherwise
// "%.4f". Every element is right-aligned to the widest.
struct Formatter {
  enum class Mode { kInt, kFixed, kSci, kOther } mode = Mode::kOther;
  DType dtype;
  explicit Formatter(DType d, const std::vector<const std::byte*>& shown) : dtype(d) {
    const auto& info = dtype_info(d);
    if (!info.is_floating || info.is_complex) return;
    bool all_int = true;
    double mn = INFINITY, mx = 0;
    for (auto p : shown) {
      auto v = element(d, p);
      if (!v || !std::isfinite(*v)) continue;
      if (*v != std::floor(*v)) all_int = false;
      double a = std::fabs(*v);
      if (a != 0) {
        mn = std::min(mn, a);
        mx = std::max(mx, a);
      }
    }
    bool wide = mx != 0 && (mx / mn > 1000 || mx > 1e8);
    if (all_int) {
      mode = wide ? Mode::kSci : Mode::kInt;
    } else if (mx != 0 && (mx / mn > 1000 || mx > 1e8 || mn < 1e-4)) {
      mode = Mode::kSci;
    } else {
      mode = Mode::kFixed;
    }
  }
  std::string operator()(const std::byte* p) const {
    auto v = element(dtype, p);
    if (mode == Mode::kOther || !v) return fmt_elem(dtype, p);
    if (std::isnan(*v)) return "nan";
    if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
    char buf[64];
    if (mode == Mode::kInt)
      std::snprintf(buf, sizeof buf, "%.0f.", *v);
    else if (mode == Mode::kSci)
      std::snprintf(buf, sizeof buf, "%.4e", *v);
    else
      std::snprintf(buf, sizeof buf, "%.4f", *v);
    return buf;
  }
};

// torch's repr of a meta tensor: no values, the size instead.
void print_meta(const TensorInfo& info) {
  std::string out = "tensor(..., device='meta', size=(";
  for (size_t i = 0; i < info.shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(info.shape[i]);
  out += info.shape.size() == 1 ? ",)" : ")";
  bool default_dtype =
      info.dtype == DType::kFloat32 || info.dtype == DType::kInt64 || info.dtype == DType::kBool;
  if (!default_dtype) out += ", dtype=torch." + std::string(dtype_name(info.dtype));
  if (info.requires_grad) out += ", requires_grad=True";
  out += ")";
  std::printf("%s%s\n", info.is_parameter ? "Parameter containing:\n" : "", out.c_str());
}

// `NAME[i, a:b, :]`: the part in brackets, split off `name`; empty when there is none.
std::string split_index(std::string& name) {
  if (name.empty() || name.back() != ']') return {};
  size_t open = name.rfind('[');
  if (open == std::string::npos || open == 0) return {};
  std::string idx = name.substr(open + 1, name.size() - open - 2);
  name.resize(open);
  return idx;
}

// Applies a Python-style index (ints and start:stop ranges, one per leading dimension, no step)
// to a tensor's view: no bytes move. Throws Error{kInvalidArgument} for a bad or out-of-range
// index.
TensorInfo index_view(TensorInfo info, const std::string& idx, const std::string& source) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, "index [" + idx + "]: " + why, source, info.name);
  };
  auto num = [&](std::string t, int64_t dflt) -> int64_t {
    while (!t.empty() && t.front() == ' ') t.erase(0, 1);
    while (!t.empty() && t.back() == ' ') t.pop_back();
    if (t.empty()) return dflt;
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(t, &used);
    } catch (...) {
      used = 0;
    }
    if (used != t.size()) throw bad("'" + t + "' is not an integer");
    return v;
  };
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t comma = idx.find(',', start);
    parts.push_back(idx.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (parts.size() > info.shape.size())
    throw bad("too many indices for a tensor of " + std::to_string(info.shape.size()) +
              " dimensions");
  std::vector<int64_t> shape, strides;
  for (size_t d = 0; d < info.shape.size(); ++d) {
    const int64_t n = info.shape[d];
    if (d >= parts.size()) {
      shape.push_back(n);
      strides.push_back(info.strides[d]);
      continue;
    }
    const std::string& p = parts[d];
    size_t colon = p.find(':');
    if (colon == std::string::npos) {
      int64_t i = num(p, 0);
      if (i < 0) i += n;
      if (i < 0 || i >= n)
        throw bad("index " + p + " is out of range for dimension " + std::to_string(d) +
                  " of size " + std::to_string(n));
      info.storage_offset += i * info.strides[d];
      continue;
    }
    if (p.find(':', colon + 1) != std::string::npos) throw bad("steps are not supported");
    int64_t a = num(p.substr(0, colon), 0), b = num(p.substr(colon + 1), n);
    if (a < 0) a += n;
    if (b < 0) b += n;
    a = std::clamp<int64_t>(a, 0, n);
    b = std::clamp<int64_t>(b, a, n);
    info.storage_offset += a * info.strides[d];
    shape.push_back(b - a);
    strides.push_back(info.strides[d]);
  }
  info.shape = std::move(shape);
  info.strides = std::move(strides);
  return info;
}

// A dotted path through the object tree ("optimizer.state.0.exp_avg", "epoch"): dict keys as
// `ls` names them (a key may itself hold dots: the longest key that fits is taken), list and
// tuple indices, an object's attributes (its dict state). Null when the path leads nowhere.
ConstValuePtr find_path(ConstValuePtr v, std::string_view path) {
  while (v && !path.empty()) {
    ConstValuePtr next;
    size_t used = 0;
    const Value* dict = v->kind() == Value::Kind::kDict ? v.get() : nullptr;
    if (!dict && v->kind() == Value::Kind::kObject && v->state() &&
        v->state()->kind() == Value::Kind::kDict)
      dict = v->state().get();
    if (dict) {
      for (const auto& [k, val] : dict->entries()) {
        if (!k) continue;
        const std::string name = path_component(*k);
        const bool fits = path.size() == name.size()
                              ? path == name
                              : path.size() > name.size() && path[name.size()] == '.' &&
                                    path.substr(0, name.size()) == name;
        if (fits && name.size() > used) next = val, used = name.size();
      }
    } else if (v->kind() == Value::Kind::kList || v->kind() == Value::Kind::kTuple) {
      size_t dot = path.find('.');
      std::string_view head = path.substr(0, dot);
      size_t i = 0;
      auto [end, ec] = std::from_chars(head.data(), head.data() + head.size(), i);
      if (ec == std::errc() && end == head.data() + head.size() && !head.empty() &&
          i < v->items().size()) {
        next = v->items()[i];
        used = head.size();
      }
    }
    if (!used) return nullptr;
    v = next;
    path.remove_prefix(std::min(path.size(), used + 1));
  }
  return v;
}

// --json: one element as a JSON value — exact integers, doubles (non-finite ones as "nan",
// "inf", "-inf"), booleans, [re, im] for complex, and a hex string for raw-bit kinds.
nlohmann::ordered_json element_json(DType d, const std::byte* p) {
  const auto& info = dtype_info(d);
  auto num = [](double v) {
    if (std::isnan(v)) return nlohmann::ordered_json("nan");
    if (std::isinf(v)) return nlohmann::ordered_json(v > 0 ? "inf" : "-inf");
    return nlohmann::ordered_json(v);
  };
  switch (d) {
    case DType::kBool:
      return std::to_integer<uint8_t>(p[0]) != 0;
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::kUInt64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    default:
      break;
  }
  auto v = element(d, p);
  if (!v) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", std::to_integer<unsigned>(p[0]));
    return buf;
  }
  if (info.is_complex) return nlohmann::ordered_json::array({num(*v), num(*element(d, p, true))});
  if (info.is_floating) return num(*v);
  return static_cast<int64_t>(*v);
}

// A tensor as JSON: name, dtype, shape and its values as nested arrays (row-major).
nlohmann::ordered_json tensor_json(const Tensor& t) {
  const TensorInfo& info = t.info();
  nlohmann::ordered_json j{
      {"name", info.name}, {"dtype", dtype_name(info.dtype)}, {"shape", info.shape}};
  const size_t es = dtype_size(info.dtype);
  if (es == 0) {
    j["values"] = nullptr;  // sub-byte kinds: no element to show
    return j;
  }
  auto bytes = t.contiguous_bytes();
  size_t at = 0;
  std::function<nlohmann::ordered_json(size_t)> nest = [&](size_t dim) {
    if (dim == info.shape.size()) {
      auto e = element_json(info.dtype, bytes.data() + at * es);
      ++at;
      return e;
    }
    auto arr = nlohmann::ordered_json::array();
    for (int64_t i = 0; i < info.shape[dim]; ++i) arr.push_back(nest(dim + 1));
    return arr;
  };
  j["values"] = nest(0);
  return j;
}

// Any value of the object tree as JSON: scalars as JSON values (big ints and non-finite floats as
// strings), containers as arrays / objects (keys as `ls` names them), tensors as a reference
// {"tensor", "dtype", "shape"}, objects as {"class", "args", "state", "appended", "items"}.
nlohmann::ordered_json value_json(const Checkpoint& c, const ConstValuePtr& v,
                                  std::set<const Value*>& seen, int depth) {
  using J = nlohmann::ordered_json;
  if (!v) return nullptr;
  auto num = [](double x) {
    if (std::isnan(x)) return J("nan");
    if (std::isinf(x)) return J(x > 0 ? "inf" : "-inf");
    return J(x);
  };
  switch (v->kind()) {
    case Value::Kind::kNone:
      return nullptr;
    case Value::Kind::kBool:
      return v->as_bool();
    case Value::Kind::kInt:
      return v->is_big_int() ? J(v->str()) : J(v->as_int());
    case Value::Kind::kFloat:
      return num(v->as_float());
    case Value::Kind::kComplex:
      return J{{"real", num(v->as_complex().real())}, {"imag", num(v->as_complex().imag())}};
    case Value::Kind::kString:
      return v->str();
    case Value::Kind::kTensor: {
      const TensorInfo& t = c.tensors()[static_cast<size_t>(v->as_int())];
      return J{{"tensor", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}};
    }
    default:
      break;
  }
  if (v->kind() == Value::Kind::kBytes) return J{{"bytes", v->repr(1 << 20)}};
  if (!seen.insert(v.get()).second || depth > 1000) return J{{"shown_above", v->repr(40)}};
  if (v->kind() == Value::Kind::kDict && v->name().empty() && !v->state()) {
    J o = J::object();
    for (const auto& [k, val] : v->entries())
      o[k ? path_component(*k) : "?"] = value_json(c, val, seen, depth + 1);
    return o;
  }
  if (v->kind() == Value::Kind::kList || v->kind() == Value::Kind::kTuple ||
      v->kind() == Value::Kind::kSet) {
    J a = J::array();
    for (const auto& it : v->items()) a.push_back(value_json(c, it, seen, depth + 1));
    return a;
  }
  J o = J::object();
  o["class"] = v->kind() == Value::Kind::kDict ? (v->name().empty() ? "dict" : v->name())
                                               : v->module() + "." + v->name();
  if (v->kind() == Value::Kind::kDict) {
    J items = J::object();
    for (const auto& [k, val] : v->entries())
      items[k ? path_component(*k) : "?"] = value_json(c, val, seen, depth + 1);
    o["items"] = std::move(items);
  } else {
    J args = J::array();
    for (const auto& it : v->items()) args.push_back(value_json(c, it, seen, depth + 1));
    o["args"] = std::move(args);
    if (!v->appended().empty()) {
      J ap = J::array();
      for (const auto& it : v->appended()) ap.push_back(value_json(c, it, seen, depth + 1));
      o["appended"] = std::move(ap);
    }
    if (!v->entries().empty()) {
      J items = J::object();
      for (const auto& [k, val] : v->entries())
        items[k ? k->repr(100) : "?"] = value_json(c, val, seen, depth + 1);
      o["items"] = std::move(items);
    }
  }
  if (v->state()) o["state"] = value_json(c, v->state(), seen, depth + 1);
  return o;
}

void print_values(const Checkpoint& c, const Tensor& t);
void print_tree(const Checkpoint& c, const ConstValuePtr& v, const std::string& label, int indent,
                std::set<const Value*>& seen);

// NAME: a tensor (by the name `ls` lists) or any value of the object tree by its dotted path,
// either followed by an index `[i, a:b]` for a tensor.
void show_name(const Checkpoint& c, std::string name, bool json) {
  const std::string full = name;
  std::string idx = split_index(name);
  if (idx.empty() && full.back() == ']' && !c.find(full)) name = full;  // "[" in a key
  std::optional<size_t> ti = c.find(name);
  ConstValuePtr v;
  if (!ti) {
    v = find_path(c.root(), name);
    if (v && v->kind() == Value::Kind::kTensor) ti = static_cast<size_t>(v->as_int());
  }
  auto print_value = [&](const ConstValuePtr& val) {
    std::set<const Value*> seen;
    if (json) {
      std::printf("%s\n", value_json(c, val, seen, 0).dump(1).c_str());
      return;
    }
    print_tree(c, val, "", 0, seen);
  };
  if (!ti && !v) {
    if (auto whole = find_path(c.root(), full); whole) {
      print_value(whole);
      return;
    }
    std::vector<std::string> names;
    names.reserve(c.tensors().size());
    for (const TensorInfo& t : c.tensors()) names.push_back(t.name);
    const std::string best = nearest(full, names);
    throw Error(ErrorCode::kNotFound,
                "no tensor or value has this name or path" +
                    (best.empty() ? std::string() : "; did you mean '" + printable(best) + "'?"),
                c.source().name(), full);
  }
  if (!ti) {
    if (!idx.empty())
      throw Error(ErrorCode::kInvalidArgument, "only a tensor can be indexed", c.source().name(),
                  full);
    print_value(v);
    return;
  }
  const TensorInfo& info = c.tensors()[*ti];
  if (json && c.storages()[info.storage].meta) {
    TensorInfo view = idx.empty() ? info : index_view(info, idx, c.source().name());
    nlohmann::ordered_json j{{"name", view.name},
                             {"dtype", dtype_name(view.dtype)},
                             {"shape", view.shape},
                             {"meta", true},
                             {"values", nullptr}};
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  if (c.storages()[info.storage].meta) {
    if (!idx.empty()) return print_meta(index_view(info, idx, c.source().name()));
    return print_meta(info);
  }
  Tensor t = c.tensor(*ti);
  if (!idx.empty()) t = Tensor(index_view(t.info(), idx, c.source().name()), t.storage());
  if (json) {
    std::printf("%s\n", tensor_json(t).dump().c_str());
    return;
  }
  print_values(c, t);
}

// The elements between "tensor(" and the dtype: torch's layout, edges only past 1000 elements.
std::string elements_text(const TensorInfo& info, const std::vector<std::byte>& bytes) {
  size_t es = dtype_size(info.dtype);
  uint64_t n = info.numel();
  bool summarize = n > 1000;
  constexpr int64_t kEdge = 3;
  std::string out;
  if (es == 0 && !info.shape.empty()) {
    out += "<" + std::to_string(bytes.size()) + " bytes of sub-byte data>";
  } else if (n == 0) {
    out += "[]";
  } else {
    // The elements that will be shown (edges only when summarizing), to pick the format.
    std::vector<int64_t> strides(info.shape.size(), 1);
    for (size_t k = info.shape.size(); k-- > 1;) strides[k - 1] = strides[k] * info.shape[k];
    std::vector<const std::byte*> shown;
    std::function<void(size_t, uint64_t)> collect = [&](size_t dim, uint64_t base) {
      if (dim == info.shape.size()) {
        shown.push_back(bytes.data() + base * es);
        return;
      }
      for (int64_t i = 0; i < info.shape[dim]; ++i) {
        if (summarize && info.shape[dim] > 2 * kEdge && i == kEdge) i = info.shape[dim] - kEdge;
        collect(dim + 1, base + i * strides[dim]);
      }
    };
    collect(0, 0);
    Formatter fmt(info.dtype, shown);
    size_t width = 0;
    for (auto p : shown) width = std::max(width, fmt(p).size());
    auto cell = [&](const std::byte* p) {
      std::string s = fmt(p);
      return std::string(width - std::min(width, s.size()), ' ') + s;
    };
    if (info.shape.empty()) {
      out += fmt(bytes.data());
    } else {
      // Rows wrap at 80 columns like torch's _vector_str; " ..." stands for skipped elements.
      std::function<void(size_t, uint64_t, int)> rec = [&](size_t dim, uint64_t base, int indent) {
        int64_t len = info.shape[dim];
        if (dim + 1 == info.shape.size()) {
          std::vector<std::string> items;
          for (int64_t i = 0; i < len; ++i) {
            if (summarize && len > 2 * kEdge && i == kEdge) {
              items.push_back(" ...");
              i = len - kEdge;
            }
            items.push_back(cell(bytes.data() + (base + i) * es));
          }
          size_t per_line = std::max<size_t>(1, (80 - indent) / (width + 2));
          out += "[";
          for (size_t k = 0; k < items.size(); ++k) {
            if (k) out += k % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
            out += items[k];
          }
          out += "]";
          return;
        }
        out += "[";
        for (int64_t i = 0; i < len; ++i) {
          if (summarize && len > 2 * kEdge && i == kEdge) {
            out += "...,\n" + std::string(info.shape.size() - dim - 2, '\n') +
                   std::string(indent + 1, ' ');
            i = len - kEdge;
          }
          rec(dim + 1, base + i * strides[dim], indent + 1);
          if (i + 1 < len)
            out +=
                "," + std::string(info.shape.size() - dim - 1, '\n') + std::string(indent + 1, ' ');
        }
        out += "]";
      };
      rec(0, 0, 7);
    }
  }
  return out;
}

// A per-channel quantized tensor's scales, zero points and axis, from their own tensors.
std::string per_channel_text(const Checkpoint& c, const Quantization& q) {
  auto list = [&](size_t index) {
    Tensor t = c.tensor(index);
    auto b = t.contiguous_bytes();
    const size_t es = dtype_size(t.dtype());
    std::string s = "[";
    for (uint64_t i = 0; es && i < t.info().numel(); ++i) {
      if (i) s += ", ";
      if (i == 1000) {
        s += "...";
        break;
      }
      s += fmt_elem(t.dtype(), b.data() + i * es);
    }
    return s + "]";
  };
  return " (integer representation), quantization_scheme=torch." + q.scheme +
         ", scales=" + list(*q.scales_tensor) + ", zero_points=" + list(*q.zero_points_tensor) +
         ", axis=" + std::to_string(q.axis);
}

void print_values(const Checkpoint& c, const Tensor& t) {
  const TensorInfo& info = t.info();
  const std::string& name = info.name;
  if (!listed(info))
    throw Error(ErrorCode::kNotFound,
                "is the scales or zero points of a per-channel quantized tensor (shown with it)",
                {}, name);
  auto bytes = t.contiguous_bytes();
  uint64_t n = info.numel();
  std::string out = "tensor(" + elements_text(info, bytes);
  bool default_dtype =
      info.dtype == DType::kFloat32 || info.dtype == DType::kInt64 || info.dtype == DType::kBool;
  if (!default_dtype || n == 0) {
    if (n == 0 && info.shape.size() > 1) out += ", size=" + shape_str(info.shape);
    if (!default_dtype) out += ", dtype=torch." + std::string(dtype_name(info.dtype));
  }
  if (info.quantization && info.quantization->scheme.find("per_tensor") != std::string::npos) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ", scale=%g, zero_point=%lld", info.quantization->scale,
                  static_cast<long long>(info.quantization->zero_point));
    out += " (integer representation)" + std::string(buf);
  }
  if (info.quantization && info.quantization->scales_tensor &&
      info.quantization->zero_points_tensor)
    out += per_channel_text(c, *info.quantization);
  if (info.requires_grad) out += ", requires_grad=True";
  out += ")";
  std::printf("%s\n", out.c_str());
}

void print_tree(const Checkpoint& c, const ConstValuePtr& v, const std::string& label, int indent,
                std::set<const Value*>& seen) {
  std::string pad(indent * 2, ' ');
  std::string head = pad + printable(label);
  if (!v) {
    std::printf("%sNone\n", head.c_str());
    return;
  }
  if (v->kind() == Value::Kind::kTensor) {
    const TensorInfo& t = c.tensors()[static_cast<size_t>(v->as_int())];
    // A tensor torch pickled inside a Python wrapper: its subclass and its attributes.
    const Value* wrap = v->origin() && v->origin()->kind() == Value::Kind::kObject &&
                                v->origin()->items().size() == 2 &&
                                (v->origin()->name() == "_rebuild_from_type_v2" ||
                                 v->origin()->name() == "_rebuild_parameter_with_state")
                            ? v->origin().get()
                            : nullptr;
    std::string cls = t.is_parameter ? "Parameter" : "tensor";
    if (wrap && wrap->items()[0] && wrap->items()[0]->kind() == Value::Kind::kGlobal &&
        !(wrap->items()[0]->module() == "torch" && wrap->items()[0]->name() == "Tensor"))
      cls = wrap->items()[0]->module() + "." + wrap->items()[0]->name();
    std::printf("%s%s(%s, %s%s)%s\n", head.c_str(), printable(cls).c_str(),
                std::string(dtype_name(t.dtype)).c_str(), shape_str(t.shape).c_str(),
                c.storages()[t.storage].meta ? ", device='meta'" : "",
                t.requires_grad ? " requires_grad" : "");
    if (wrap && wrap->items()[1] && wrap->items()[1]->kind() != Value::Kind::kNone)
      print_tree(c, wrap->items()[1], "attributes: ", indent + 1, seen);
    return;
  }
  const bool size = v->kind() == Value::Kind::kObject && v->module() == "torch" &&
                    v->name() == "Size" && !v->state();  // a leaf: torch.Size([3, 4])
  bool container =
      v->kind() == Value::Kind::kDict || v->kind() == Value::Kind::kList ||
      v->kind() == Value::Kind::kTuple || v->kind() == Value::Kind::kSet ||
      (v->kind() == Value::Kind::kObject && !size &&
       (v->state() || !v->items().empty() || !v->appended().empty() || !v->entries().empty()));
  if (!container) {
    std::printf("%s%s\n", head.c_str(), printable(v->repr(100)).c_str());
    return;
  }
  if (!seen.insert(v.get()).second || indent > 60) {
    std::printf("%s<%s, shown above>\n", head.c_str(), printable(v->repr(40)).c_str());
    return;
  }
  std::string kind = v->kind() == Value::Kind::kDict    ? (v->name().empty() ? "dict" : v->name())
                     : v->kind() == Value::Kind::kList  ? "list"
                     : v->kind() == Value::Kind::kTuple ? "tuple"
                     : v->kind() == Value::Kind::kSet   ? (v->is_frozenset() ? "frozenset" : "set")
                                                        : v->module() + "." + v->name();
  size_t n = v->kind() == Value::Kind::kDict ? v->entries().size() : v->items().size();
  if (v->kind() == Value::Kind::kObject) n += v->appended().size() + v->entries().size();
  std::printf("%s%s (%zu)\n", head.c_str(), printable(kind).c_str(), n);
  if (v->kind() == Value::Kind::kDict) {
    for (auto& [k, val] : v->entries())
      print_tree(c, val, (k ? path_component(*k) : "?") + ": ", indent + 1, seen);
  } else {
    for (size_t i = 0; i < v->items().size(); ++i)
      print_tree(c, v->items()[i], "[" + std::to_string(i) + "] ", indent + 1, seen);
  }
  if (v->kind() == Value::Kind::kObject) {
    // What the pickle put on an object of a class ckpt does not know (a list or dict subclass,
    // a deque): appended items, then items set by key.
    for (size_t i = 0; i < v->appended().size(); ++i)
      print_tree(c, v->appended()[i], "+[" + std::to_string(i) + "] ", indent + 1, seen);
    for (auto& [k, val] : v->entries())
      print_tree(c, val, "[" + (k ? k->repr(60) : std::string("?")) + "] = ", indent + 1, seen);
  }
  if (v->state()) print_tree(c, v->state(), "state: ", indent + 1, seen);
}

struct ShowOptions {
  std::vector<std::string> files;  // one checkpoint, an index, or shards
  std::string file, name;
  bool json = false;
  Common common;
};

void run_show(ShowOptions& o) {
  // FILE... NAME: a last argument that is no file is the tensor's name.
  if (o.name.empty() && o.files.size() > 1 && !is_url(o.files.back()) &&
      !std::filesystem::exists(o.files.back())) {
    o.name = o.files.back();
    o.files.pop_back();
  }
  o.file = files_name(o.files);
  Checkpoint c = open_checkpoint(o.files, o.common);
  std::set<const Value*> seen;
  if (!o.name.empty())
    show_name(c, o.name, o.json);
  else if (o.json)
    std::printf("%s\n", value_json(c, c.root(), seen, 0).dump(1).c_str());
  else
    print_tree(c, c.root(), "", 0, seen);
  keep_until_exit(std::move(c));
}

}  // namespace

void add_show(CLI::App& app) {
  auto o = std::make_shared<ShowOptions>();
  auto* cmd = app.add_subcommand("show", "print the object tree, or one tensor's values");
  cmd->add_option("FILE", o->files, "checkpoint, shard index, or shard files")->required();
  cmd->add_option("NAME", o->name, "tensor, path of any value, or tensor[index] to print");
  cmd->add_flag("--json", o->json,
                "JSON: the tree (tensors as references), a value, or a tensor with its values");
  add_common(*cmd, o->common);
  cmd->callback([o] { run_show(*o); });
}

}  // namespace ckpt::cli
